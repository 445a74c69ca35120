"""Same shapes are not the same target: checkpoints record a fingerprint of the target's weights,
and eval, export and resume refuse another one, naming both, unless --allow-target-mismatch."""

import json
import sys
from pathlib import Path

import pytest

from specheads.cli import main as cli_main
from specheads.core.fingerprint import weights_fingerprint
from specheads.core.target import FrozenTarget, TargetMismatchError, TargetRecord

from helpers import edit_weights, save_tiny_target

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


def test_a_weight_the_sample_does_not_see_is_caught(monkeypatch, capsys, run, tmp_path):
    """The sampled fingerprint reads 4,096 values of the embedding and lm_head: a changed decoder weight
    passed it. The record's hash of the whole safetensors catches it; an older record, with the sample
    alone, is still compared on the sample."""
    changed = copy_target(run["target"], tmp_path / "changed")
    edit_weights(changed, lambda t: t["model.layers.0.mlp.down_proj.weight"][3, 5].add_(0.5))
    edited = FrozenTarget.from_pretrained(str(changed)).record()
    mine = FrozenTarget.from_pretrained(str(run["target"])).record()
    assert edited.weights_fingerprint == mine.weights_fingerprint  # the sample does not see it
    recorded = json.loads((run["out"] / "config.json").read_text())["target"]
    assert recorded["weights_sha256"] == mine.weights_sha256 != edited.weights_sha256
    assert recorded["weights_sha256"].startswith("files-sha256:")

    argv = ["export", "--heads", run["out"], "--format", "medusa", "--target", changed]
    code, line = console(monkeypatch, capsys, *argv, "--out", tmp_path / "x")
    assert code == 1 and "same shapes, other weights" in line and "weights hash files-sha256:" in line, line
    assert not (tmp_path / "x").exists()

    older = {k: v for k, v in recorded.items() if k != "weights_sha256"}  # a checkpoint from before it
    TargetRecord.from_dict(older).check_matches(edited)  # loads: the sample is all it can compare
    with pytest.raises(TargetMismatchError, match="weights hash"):
        TargetRecord.from_dict(recorded).check_matches(edited)
    # a model built in memory is hashed from its parameters: compared with its like only
    in_memory = FrozenTarget(FrozenTarget.from_pretrained(str(changed)).model).record()
    assert in_memory.weights_sha256.startswith("params-float32-sha256:")
    TargetRecord.from_dict(recorded).check_matches(in_memory)  # another kind: the sample decides


def copy_target(source: Path, dest: Path) -> Path:
    import shutil

    return Path(shutil.copytree(source, dest))
