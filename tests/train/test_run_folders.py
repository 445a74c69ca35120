"""Output folders through the real CLI: a run owns its folder, another run's results are never
mixed in or silently replaced, and an unwritable folder is found before any expensive work."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specheads.cli import main as cli_main
from specheads.core.run_folder import LOCK_FILE, clean_stale_tmp, hold_folder
from specheads.core.target import FrozenTarget
from specheads.heads import MedusaConfig, MedusaHeads, save_heads

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}


def console(monkeypatch, capsys, *argv) -> tuple[int, str]:
    """`specheads ARGV` as the console script runs it: (exit code, the error line or '')."""
    monkeypatch.setattr(sys, "argv", ["specheads", *map(str, argv)])
    capsys.readouterr()
    code = cli_main()
    err = [line for line in capsys.readouterr().err.splitlines() if "error: " in line]
    return code, err[-1] if err else ""


def train_overrides(target, data, out, *extra) -> list[str]:
    return [
        str(RECIPE), f"target={target}", f"data={data}", f"output_dir={out}", "max_length=64", "batch_size=4",
        "num_heads=2", "labels=data", "warmup_steps=1", "eval_data=[]", "eval_fraction=0.1", "eval_every=1000",
        "log_every=1", "report_to=none", *extra,
    ]  # fmt: skip


def steps_in(out: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))


@pytest.fixture(scope="module")
def heads_dir(tiny_target_dirs, tmp_path_factory) -> Path:
    target = FrozenTarget.from_pretrained(str(tiny_target_dirs["llama"]))
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    path = tmp_path_factory.mktemp("heads") / "medusa"
    return save_heads(heads.init_lm_heads_from(target.lm_head), path, target.record())


def test_a_second_run_on_a_folder_in_use_is_refused(
    monkeypatch, capsys, tiny_target_dirs, text_data, tmp_path
):
    """Started 4 s apart, two runs on one output_dir both exited 0 with their checkpoints and metrics
    interleaved. Now the second stops at once naming the first, whose files are its own alone."""
    out = tmp_path / "conc"
    first = train_overrides(tiny_target_dirs["llama"], text_data, out, "max_steps=400", "save_every=2")
    cmd = [sys.executable, "-m", "specheads", "train", *first, "lr=0.001", "--no-progress"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (out / "metrics.jsonl").is_file():  # the first run is training
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        second = train_overrides(tiny_target_dirs["llama"], text_data, out, "max_steps=9", "save_every=3")
        code, line = console(
            monkeypatch, capsys, "train", *second, "lr=0.005", "resume=auto", "--no-progress"
        )
        assert code == 1 and f"output_dir {out} is in use by pid {proc.pid} on " in line, line
        assert "specheads train" in line and "lr=0.001" in line  # the holder's command
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)
    assert proc.returncode == 143
    steps = steps_in(out)
    stopped = json.loads((out / "train_summary.json").read_text())["last_step"]
    assert steps[-1] == stopped and all(s % 2 == 0 for s in steps[:-1])  # the first run's checkpoints only
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert logged == list(range(1, len(logged) + 1))  # one run's metrics, not two interleaved
    assert not (out / LOCK_FILE).exists()


def test_train_into_another_runs_results_refuses_and_overwrite_clears_them(
    monkeypatch, capsys, tiny_target_dirs, text_data, tmp_path
):
    out = tmp_path / "run"
    base = train_overrides(tiny_target_dirs["llama"], text_data, out, "max_steps=6")
    assert cli_main(["train", *base, "save_every=3", "--no-progress"]) == 0
    assert steps_in(out) == [3]
    before = (out / "model.safetensors").read_bytes()
    code, line = console(monkeypatch, capsys, "train", *base, "save_every=2", "lr=0.005", "--no-progress")
    assert code == 1 and f"{out} holds another run's results" in line and "resume=auto" in line
    assert "--overwrite" in line and (out / "model.safetensors").read_bytes() == before
    code, _ = console(
        monkeypatch, capsys, "train", *base, "save_every=2", "lr=0.005", "--overwrite", "--no-progress"
    )
    assert code == 0
    assert steps_in(out) == [2, 4]  # the old run's step-3 is gone: resume=auto cannot pick it
    assert json.loads((out / "config.json").read_text())["training"]["lr"] == 0.005
    # resume=auto into a folder of results is the other way in (here: the run is complete)
    assert cli_main(["train", *base, "save_every=2", "lr=0.005", "resume=auto", "--no-progress"]) == 0


def test_eval_and_compare_refuse_an_out_holding_results(
    monkeypatch, capsys, tiny_target_dirs, heads_dir, tmp_path
):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "turns": ["hello there"]}) + "\n")
    out = tmp_path / "e"
    common = ["--target", tiny_target_dirs["llama"], "--heads", heads_dir, "--prompts", prompts, "--out", out]
    common += ["--max-new-tokens", "4", "--no-progress"]
    assert console(monkeypatch, capsys, "eval", *common)[0] == 0
    before = (out / "results.json").read_text()
    code, line = console(monkeypatch, capsys, "eval", *common)
    assert code == 1 and "holds another run's results (results.json, report.md)" in line
    assert (out / "results.json").read_text() == before
    assert console(monkeypatch, capsys, "eval", *common, "--overwrite")[0] == 0
    assert json.loads((out / "results.json").read_text())["num_prompts"] == 1
    code, line = console(monkeypatch, capsys, "compare", *common, "--peers", "generate")
    assert code == 1 and "holds another run's results" in line and "--overwrite" in line


@pytest.fixture
def blocked(tmp_path) -> Path:
    """A path that cannot be created: its parent is a file."""
    (tmp_path / "file").write_text("x")
    return tmp_path / "file" / "out"


def test_writability_is_checked_before_any_expensive_work(
    monkeypatch, capsys, tmp_path, blocked, heads_dir, tiny_target_dirs
):
    """Every command names the unwritable folder before it loads a target or trains: each is given a
    target that does not exist, so reaching it would be another error."""
    missing = tmp_path / "no-target"
    commands = {
        "train": ["train", RECIPE, f"target={missing}", f"output_dir={blocked}"],
        "tiny-target": ["tiny-target", "--out", blocked, "--steps", "1", "--no-sample"],
        "cache": ["cache", RECIPE, f"target={missing}", "--out", blocked],
        "distill": ["distill", "--source", "stdlib", "--target", missing, "--out", blocked],
        "eval": ["eval", "--target", missing, "--heads", heads_dir, "--prompts", "x.jsonl", "--out", blocked],
        "compare": ["compare", "--target", missing, "--heads", heads_dir, "--prompts", "x", "--out", blocked],
        "export": [
            "export",
            "--heads",
            heads_dir,
            "--format",
            "medusa",
            "--target",
            missing,
            "--out",
            blocked,
        ],
    }
    for name, argv in commands.items():
        quiet = [] if name in ("export", "tiny-target") else ["--no-progress"]
        code, line = console(monkeypatch, capsys, *argv, *quiet)
        assert code == 1 and str(blocked) in line and "is a file, not a folder" in line, (name, line)


def test_export_removes_what_a_killed_export_left(heads_dir, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "exp"
    stale = tmp_path / f".exp.tmp-{dead.pid}-abcd"  # a SIGKILLed export's temporary folder
    stale.mkdir()
    (stale / "medusa_lm_head.safetensors").write_bytes(b"x" * 1000)
    alive = tmp_path / f".other.tmp-{os.getppid()}-abcd"  # a running process
    alive.mkdir()
    assert cli_main(["export", "--heads", str(heads_dir), "--format", "medusa", "--out", str(out)]) == 0
    assert not stale.exists() and sorted(p.name for p in tmp_path.iterdir()) == [alive.name, "exp"]
    assert clean_stale_tmp(tmp_path / "other") == [] and alive.exists()  # a live writer's is kept


def test_distill_and_cache_into_a_folder_in_use_are_refused_and_touch_nothing(
    monkeypatch, capsys, tiny_target_dirs, text_data, tmp_path
):
    """Two distillations (or caches) into one folder would write the same chunks and shards; `--overwrite`
    would delete the other run's files under it. The second stops at once, naming the holder."""
    target = tiny_target_dirs["llama"]
    for name, folder, argv in [
        ("distill", "output folder", ["--source", text_data, "--target", target, "--max-new-tokens", "2"]),
        ("cache", "cache folder", [RECIPE, f"target={target}", f"data={text_data}", "eval_data=[]"]),
    ]:
        out = tmp_path / name
        with hold_folder(out):
            (out / "theirs.json").write_text("{}")
            code, line = console(
                monkeypatch, capsys, name, *argv, "--out", out, "--overwrite", "--no-progress"
            )
            assert code == 1 and f"{folder} {out} is in use by pid {os.getpid()} on " in line, line
            assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE, "theirs.json"]


def test_a_refused_run_leaves_no_folder_it_created(tmp_path):
    with pytest.raises(ValueError, match="bad"), hold_folder(tmp_path / "new"):
        raise ValueError("bad")
    assert not (tmp_path / "new").exists()
    (tmp_path / "old").mkdir()
    with pytest.raises(ValueError, match="bad"), hold_folder(tmp_path / "old"):
        raise ValueError("bad")
    assert (tmp_path / "old").is_dir()  # not ours to remove
    with pytest.raises(ValueError, match="bad"), hold_folder(tmp_path / "kept") as out:
        (out / "part.jsonl").write_text("")
        raise ValueError("bad")
    assert (tmp_path / "kept" / "part.jsonl").is_file()  # a resumable run's work stays
