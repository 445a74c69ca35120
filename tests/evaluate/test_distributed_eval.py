"""`specheads eval` over several processes (`accelerate launch --config_file recipes/accelerate/ddp.yaml
--num_processes 2 -m specheads eval ...`: 2 CPU processes over gloo here): the prompts are shared out, and
process 0 writes one results.json that says what one process says of every token, τ, acceptance and
identity (only timings differ). `--device-map auto` places the target through transformers' device_map."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specheads.core.processes import Processes
from specheads.core.target import FrozenTarget
from specheads.evaluate.sharing import process_share

from helpers import command

eval_cli = command("eval")
REPO = Path(__file__).resolve().parents[2]
# what a run measures of time (the rest of results.json is decided by the tokens)
TIMED = {
    "seconds",
    "baseline_seconds",
    "tokens_per_second",
    "baseline_tokens_per_second",
    "speedup",
    "outside_forward_fraction",
    "step_phase_fraction",
    "phase_seconds",
    "turn_seconds",
}


def untimed(value, top: bool = True):
    if isinstance(value, dict):
        drop = TIMED | ({"command", "processes"} if top else set())
        return {k: untimed(v, False) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [untimed(v, False) for v in value]
    return value


def eval_args(setup, out: Path, *extra: str) -> list[str]:
    return [
        "--target", str(setup["target"]), "--heads", str(setup["root"] / "medusa"),
        "--prompts", str(setup["questions"]), "--max-new-tokens", "12", "--tree", "chain-3",
        "--out", str(out), "--no-progress", *extra,
    ]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two(args: list[str], command: str = "eval") -> str:
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO / "recipes" / "accelerate" / "ddp.yaml"),
        "--num_processes", "2", "--main_process_port", str(free_port()), "-m", "specheads", command, *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONFAULTHANDLER": "1"}
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result.stdout


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [(), ("--temperature", "0.8", "--top-k", "20", "--seed", "3", "--batch-size", "2")],
    ids=["greedy", "sampled-batched"],
)
def test_two_processes_report_what_one_reports(compare_setup, tmp_path, extra):
    """Greedy one prompt at a time (process 0 decodes prompts 0 and 2, process 1 prompt 1); sampled in
    groups of 2 (a group each), each group with the seed its number gives it: the same tokens, τ,
    acceptance and identity as one process, in the same order."""
    assert eval_cli(eval_args(compare_setup, tmp_path / "one", *extra)) == 0
    printed = launch_two(eval_args(compare_setup, tmp_path / "two", *extra))
    one, two = results(tmp_path / "one"), results(tmp_path / "two")
    assert two["processes"] == 2 and "processes" not in one
    assert untimed(two) == untimed(one)
    assert len(two["per_prompt"]) == 3 and two["new_tokens"] > 3
    assert printed.count("wrote ") == 1  # process 0 reports, once
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["report.md", "results.json"]
    assert two["command"] == one["command"].replace(str(tmp_path / "one"), str(tmp_path / "two"))


@pytest.mark.slow
def test_two_processes_compare_as_one(compare_setup, tmp_path):
    """`specheads compare` on 2 processes: every method's tokens, τ, acceptance and identity, the method
    order of every conversation, and the answer files' turns, as one process writes them."""
    args = [
        "--target", str(compare_setup["target"]), "--heads", str(compare_setup["root"] / "medusa"),
        "--prompts", str(compare_setup["questions"]), "--max-new-tokens", "8", "--tree", "chain-3",
        "--no-plots", "--no-progress",
    ]  # fmt: skip
    assert command("compare")([*args, "--out", str(tmp_path / "one")]) == 0
    launch_two([*args, "--out", str(tmp_path / "two")], "compare")
    one, two = results(tmp_path / "one"), results(tmp_path / "two")
    assert two["processes"] == 2 and untimed(two) == untimed(one)
    assert [m["name"] for m in two["methods"]] == ["generate", "prompt-lookup", "medusa"]
    assert [o["methods"] for o in two["order"]][1] == ["prompt-lookup", "medusa", "generate"]  # rotated by 1
    for name in ("generate", "prompt-lookup", "medusa"):
        answers = [
            [
                {k: v for k, v in json.loads(line)["choices"][0].items() if k != "wall_time"}
                for line in f.open()
            ]
            for f in (
                tmp_path / "one" / "answers" / f"{name}.jsonl",
                tmp_path / "two" / "answers" / f"{name}.jsonl",
            )
        ]
        assert answers[0] == answers[1] and len(answers[0]) == 3
    assert not list((tmp_path / "two").glob("progress*"))


def test_device_map_reaches_from_pretrained(compare_setup, tmp_path, monkeypatch):
    """--device-map auto loads the target through transformers' device_map (on this CPU: all of it on the
    CPU) and decodes what --device cpu decodes; the command records the flag."""
    assert eval_cli(eval_args(compare_setup, tmp_path / "one")) == 0
    loaded = []
    original = FrozenTarget.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        target = original(cls, *args, **kwargs)
        loaded.append((kwargs.get("device_map"), kwargs.get("max_memory"), str(target.device)))
        return target

    monkeypatch.setattr(FrozenTarget, "from_pretrained", classmethod(spy))
    assert eval_cli(eval_args(compare_setup, tmp_path / "spread", "--device-map", "auto")) == 0
    assert loaded == [("auto", None, "cpu")]
    spread = results(tmp_path / "spread")
    assert untimed(spread) == untimed(results(tmp_path / "one"))
    assert "--device-map auto" in spread["command"]


def test_prompts_are_shared_out_by_number():
    """Process r of N: prompts r, r + N, ...; with --batch-size B whole groups of B, every N-th group."""
    assert process_share(3, 1, Processes(rank=0, world=2)) == ([0, 2], [0, 2])
    assert process_share(3, 1, Processes(rank=1, world=2)) == ([1], [1])
    assert process_share(7, 2, Processes(rank=0, world=2)) == ([0, 1, 4, 5], [0, 2])
    assert process_share(7, 2, Processes(rank=1, world=2)) == ([2, 3, 6], [1, 3])
    assert process_share(5, 1, Processes()) == ([0, 1, 2, 3, 4], [0, 1, 2, 3, 4])
    with pytest.raises(
        ValueError,
        match="2 groups of --batch-size 2 for 3 processes: .* at most 2 processes, or take more prompts",
    ):
        process_share(3, 2, Processes(rank=0, world=3))
