"""Errors through the real console script: one line naming the file or key, the traceback behind --debug.

Each case is a mistake a new user makes: it must end the command with exit code 1 and a line
`specheads COMMAND: error: ...` that says what is wrong and where, before any expensive work where the
mistake is visible up front.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specheads.cli import main as cli_main
from specheads.core.target import FrozenTarget
from specheads.heads import MedusaConfig, MedusaHeads, save_heads

pytestmark = pytest.mark.usefixtures("one_thread")
REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"


def console(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    """Run `specheads ARGV` as the console script does (sys.argv, no argument list): (exit code, stderr)."""
    monkeypatch.setattr(sys, "argv", ["specheads", *map(str, argv)])
    capsys.readouterr()
    code = cli_main()
    return code, capsys.readouterr().err


def error_of(monkeypatch, capsys, *argv: str) -> str:
    """The one error line of a command that must fail."""
    code, err = console(monkeypatch, capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert "Traceback" not in err
    # one format for every command (export and import-heads used to print a bare `error: ...`)
    assert lines and lines[-1].startswith(f"specheads {argv[0]}: error: "), err
    return lines[-1]


@pytest.fixture(scope="module")
def heads_dir(tiny_target_dirs, tmp_path_factory) -> Path:
    target = FrozenTarget.from_pretrained(str(tiny_target_dirs["llama"]))
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    path = tmp_path_factory.mktemp("heads") / "medusa"
    return save_heads(heads.init_lm_heads_from(target.lm_head), path, target.record())


def copy_dir(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_broken_yaml_names_the_file(monkeypatch, capsys, tmp_path):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("method: medusa\nlr: [0.1\nmax_steps: 3\n")
    line = error_of(monkeypatch, capsys, "train", recipe, "--no-progress")
    assert str(recipe) in line and "not valid YAML" in line and "line" in line


@pytest.mark.parametrize(
    "override, message",
    [
        ("lr=-1", "lr must be > 0, got -1"),
        ("warmup_steps=-10", "warmup_steps must be >= 0, got -10"),
        ("eval_every=0", "eval_every must be >= 1, got 0"),
    ],
)
def test_bad_values_refused_at_parse_time(monkeypatch, capsys, tmp_path, override, message):
    # The target does not exist: an error about it would mean the value was checked too late.
    argv = ("train", RECIPE, f"target={tmp_path / 'no-target'}", f"output_dir={tmp_path / 'o'}", override)
    line = error_of(monkeypatch, capsys, *argv, "--no-progress")
    assert message in line
    assert not (tmp_path / "o").exists()


def test_truncated_heads_weights_name_the_path(monkeypatch, capsys, heads_dir, tmp_path):
    heads = copy_dir(heads_dir, tmp_path / "heads")
    weights = heads / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    line = error_of(
        monkeypatch, capsys, "export", "--heads", heads, "--format", "medusa", "--out", tmp_path / "x"
    )
    assert str(weights) in line and "truncated or damaged" in line


def test_corrupt_heads_config_names_the_path(monkeypatch, capsys, heads_dir, tmp_path):
    heads = copy_dir(heads_dir, tmp_path / "heads")
    (heads / "config.json").write_text('{"format": "specheads", "method"')
    line = error_of(
        monkeypatch, capsys, "export", "--heads", heads, "--format", "medusa", "--out", tmp_path / "x"
    )
    assert str(heads / "config.json") in line and "not valid JSON" in line


@pytest.mark.parametrize("damage", ["truncated weights", "corrupt config"])
def test_damaged_target_names_the_path(monkeypatch, capsys, tiny_target_dirs, tmp_path, damage):
    target = copy_dir(tiny_target_dirs["llama"], tmp_path / "target")
    if damage == "truncated weights":
        damaged = target / "model.safetensors"
        damaged.write_bytes(damaged.read_bytes()[:2000])
    else:
        damaged = target / "config.json"
        damaged.write_text('{"model_type": "llama",')
    argv = ("train", RECIPE, f"target={target}", f"output_dir={tmp_path / 'o'}", "report_to=none")
    line = error_of(monkeypatch, capsys, *argv, "--no-progress")
    assert str(damaged) in line


def test_relative_data_path_says_where_it_was_looked_for(monkeypatch, capsys, tiny_target_dirs, tmp_path):
    monkeypatch.chdir(tmp_path)
    argv = ("train", RECIPE, f"target={tiny_target_dirs['llama']}", "data=data/rows.jsonl", "report_to=none")
    line = error_of(monkeypatch, capsys, *argv, "output_dir=o", "--no-progress")
    assert "'data/rows.jsonl'" in line and f"resolved against the working folder, {tmp_path}" in line


def test_dynamic_tree_with_medusa_heads(monkeypatch, capsys, tiny_target_dirs, heads_dir, tmp_path):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "turns": ["hello"]}) + "\n")
    argv = ["eval", "--target", tiny_target_dirs["llama"], "--heads", heads_dir, "--prompts", prompts]
    line = error_of(monkeypatch, capsys, *argv, "--out", tmp_path / "e", "--tree", "dynamic", "--no-progress")
    assert "dynamic trees are for EAGLE heads" in line
    assert not (tmp_path / "e").exists()


def test_argument_list_callers_get_the_exception(tmp_path):
    """Python callers (tests, quickstart) pass an argument list and handle the exception themselves."""
    with pytest.raises(ValueError, match="lr must be > 0"):
        cli_main(["train", str(RECIPE), "lr=-1", f"output_dir={tmp_path}"])


def test_one_line_from_a_real_process_and_traceback_behind_debug(tmp_path):
    recipe = tmp_path / "broken.yaml"
    recipe.write_text("lr: [\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "specheads", "train", str(recipe)]
    plain = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines()[-1].startswith(f"specheads train: error: recipe {recipe}")
    debug = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, env=env, timeout=300)
    assert debug.returncode != 0 and "Traceback" in debug.stderr and str(recipe) in debug.stderr
