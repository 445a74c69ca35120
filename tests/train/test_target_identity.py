"""Same shapes are not the same target: checkpoints record a fingerprint of the target's weights,
and eval, export and resume refuse another one, naming both, unless --allow-target-mismatch."""

import json
import sys
from pathlib import Path

import pytest

from specheads.cli import main as cli_main
from specheads.core.fingerprint import weights_fingerprint
from specheads.core.target import FrozenTarget

from helpers import save_tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"


def console(monkeypatch, capsys, *argv) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["specheads", *map(str, argv)])
    capsys.readouterr()
    code = cli_main()
    err = capsys.readouterr().err
    return code, err[err.find("error: ") :] if "error: " in err else ""  # a mismatch lists each field


@pytest.fixture(scope="module")
def run(tiny_target_dirs, text_data, tmp_path_factory) -> dict:
    """Heads trained on the llama target (a step-2 checkpoint too), and a same-shape target of another seed."""
    root = tmp_path_factory.mktemp("identity")
    other = save_tiny_target("llama", root / "other-seed", seed=1)
    out = root / "run"
    argv = [
        "train", str(RECIPE), f"target={tiny_target_dirs['llama']}", f"data={text_data}", f"output_dir={out}",
        "max_length=64", "batch_size=4", "num_heads=2", "labels=data", "eval_data=[]", "eval_every=1000",
        "max_steps=4", "save_every=2", "report_to=none", "--no-progress",
    ]  # fmt: skip
    assert cli_main(argv) == 0
    return {"target": tiny_target_dirs["llama"], "other": other, "out": out, "argv": argv}


def test_the_fingerprint_is_recorded_and_tells_same_shapes_apart(run):
    recorded = json.loads((run["out"] / "config.json").read_text())["target"]["weights_fingerprint"]
    mine, other = (
        FrozenTarget.from_pretrained(str(run[k]), dtype="bfloat16").record() for k in ("target", "other")
    )
    assert recorded == mine.weights_fingerprint  # a bfloat16 load of the same weights agrees
    assert other.weights_fingerprint != recorded
    assert (mine.hidden_size, mine.num_layers, mine.vocab_hash) == (
        other.hidden_size,
        other.num_layers,
        other.vocab_hash,
    )
    assert (
        weights_fingerprint({"w": FrozenTarget.from_pretrained(str(run["target"])).lm_head.weight[:0]})
        is None
    )


def test_eval_refuses_another_targets_weights(monkeypatch, capsys, run, tmp_path):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "turns": ["hello"]}) + "\n")
    argv = [
        "eval",
        "--target",
        run["other"],
        "--heads",
        run["out"],
        "--prompts",
        prompts,
        "--out",
        tmp_path / "e",
    ]
    argv += ["--max-new-tokens", "4", "--no-progress"]
    code, line = console(monkeypatch, capsys, *argv)
    assert code == 1 and "weights fingerprint sample-sha256:" in line and "--allow-target-mismatch" in line, (
        line
    )
    assert str(run["target"]) in line and str(run["other"]) in line  # names both
    with pytest.warns(UserWarning, match="allowed by --allow-target-mismatch"):
        assert console(monkeypatch, capsys, *argv, "--allow-target-mismatch")[0] == 0


def test_compare_refuses_another_targets_weights(monkeypatch, capsys, run, tmp_path):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "turns": ["hello"]}) + "\n")
    argv = ["compare", "--target", run["other"], "--heads", run["out"], "--prompts", prompts]
    argv += ["--peers", "generate", "--max-new-tokens", "4", "--no-plots", "--no-progress"]
    code, line = console(monkeypatch, capsys, *argv, "--out", tmp_path / "c")
    assert code == 1 and "weights fingerprint sample-sha256:" in line, line
    assert str(run["target"]) in line and str(run["other"]) in line  # names both
    with pytest.warns(UserWarning, match="allowed by --allow-target-mismatch"):
        assert console(monkeypatch, capsys, *argv, "--out", tmp_path / "d", "--allow-target-mismatch")[0] == 0


def test_export_refuses_another_targets_weights(monkeypatch, capsys, run, tmp_path):
    argv = ["export", "--heads", run["out"], "--format", "medusa", "--target", run["other"]]
    code, line = console(monkeypatch, capsys, *argv, "--out", tmp_path / "x")
    assert code == 1 and "same shapes, other weights" in line, line
    assert not (tmp_path / "x").exists()
    assert console(monkeypatch, capsys, *argv, "--out", tmp_path / "y", "--allow-target-mismatch")[0] == 0


def test_resume_refuses_another_targets_weights(monkeypatch, capsys, run):
    argv = [a for a in run["argv"] if not a.startswith(("target=", "max_steps="))]
    argv = [*argv[:-1], f"target={run['other']}", "max_steps=6", "resume=auto", "--no-progress"]
    code, line = console(monkeypatch, capsys, *argv)
    assert code == 1 and "same shapes, other weights" in line, line
    assert json.loads((run["out"] / "train_summary.json").read_text())["last_step"] == 4  # untouched
