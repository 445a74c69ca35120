"""`eval` and `compare --overwrite` lose nothing: every input is checked and the folder locked before the
old results are touched, and they stay until the new run has kept its first record (core/run_folder.py:
`replacing`). A refused run (a bad input, a folder in use, a dangling --out symlink) leaves every file
byte for byte."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from compare_helpers import compare_args, compare_cli
from test_tree_auto_cli import eval_args, make_setup

from specheads.cli import main as cli
from specheads.core.run_folder import ASIDE, DROPPED, FolderInUseError, hold_folder, replacing
from specheads.core.target import FrozenTarget, TargetMismatchError
from specheads.evaluate import evaluate

from helpers import stop_at_call


@pytest.fixture(scope="module")
def setup(tiny_target_dirs, tmp_path_factory) -> dict:
    return make_setup(tiny_target_dirs, tmp_path_factory)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too), path -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


FIXED = ("--tree", "chain-4", "--num-prompts", "2")


@pytest.fixture(scope="module")
def finished(setup, tmp_path_factory) -> Path:
    """A finished evaluation's folder (copied by each test that may change it)."""
    out = tmp_path_factory.mktemp("finished") / "eval"
    assert cli(eval_args(setup, out, "medusa", *FIXED)) == 0
    assert sorted(p.name for p in out.iterdir()) == ["report.md", "results.json"]
    return out


def copy_of(folder: Path, to: Path) -> Path:
    to.mkdir(parents=True)
    for path in folder.iterdir():
        (to / path.name).write_bytes(path.read_bytes())
    return to


def with_prompts(argv: list[str], prompts: str) -> list[str]:
    argv = list(argv)
    argv[argv.index("--prompts") + 1] = prompts
    return argv


def test_a_mistyped_prompt_set_with_overwrite_leaves_the_finished_evaluation(setup, finished, tmp_path):
    out = copy_of(finished, tmp_path / "eval")
    before = snapshot(out)
    with pytest.raises(FileNotFoundError, match="prompts file 'heldot' does not exist"):
        cli(with_prompts(eval_args(setup, out, "medusa", *FIXED, "--overwrite"), "heldot"))
    assert snapshot(out) == before


def test_heads_of_another_target_with_overwrite_leave_the_finished_evaluation(
    setup, finished, tmp_path, tiny_target_dirs
):
    """The heads are loaded against the target (and refused) before anything of --out is touched."""
    out = copy_of(finished, tmp_path / "eval")
    before = snapshot(out)
    argv = eval_args(setup, out, "medusa", *FIXED, "--overwrite")
    argv[argv.index("--target") + 1] = str(tiny_target_dirs["qwen2"])  # another model: refused at load
    with pytest.raises(TargetMismatchError, match="were trained against"):
        cli(argv)
    assert snapshot(out) == before


def test_a_run_refused_for_the_lock_leaves_the_running_evaluations_progress(setup, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    stop_at_call(monkeypatch, evaluate, "decode_prompt", 2)  # a run stopped after its first prompt ...
    with pytest.raises(KeyboardInterrupt):
        cli(eval_args(setup, out, "medusa", *FIXED))
    monkeypatch.undo()
    assert len((out / "progress.jsonl").read_text().splitlines()) == 2  # header and one prompt
    holder = subprocess.Popen(  # ... and another process going on with it: it holds the folder's lock
        [sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True, env=os.environ.copy()
    )
    try:
        assert holder.stdout.readline() == "held\n"
        before = snapshot(out)
        with pytest.raises(FolderInUseError, match=f"in use by pid {holder.pid} "):
            cli(eval_args(setup, out, "medusa", *FIXED, "--overwrite"))
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()
    assert cli(eval_args(setup, out, "medusa", *FIXED, "--resume")) == 0  # it can still be resumed


HOLD = """
import sys, time
from specheads.core.run_folder import hold_folder
with hold_folder(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_dangling_out_symlink_is_refused_before_any_model_loads(setup, tmp_path, monkeypatch):
    link = tmp_path / "out"
    link.symlink_to(tmp_path / "gone")

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(FrozenTarget, "from_pretrained", no_loading)
    with pytest.raises(FileNotFoundError, match=f"--out {link} is a symlink to {tmp_path / 'gone'}"):
        cli(eval_args(setup, link, "medusa", *FIXED))
    with pytest.raises(FileNotFoundError, match="is a symlink to .*, which does not exist"):
        compare_cli(
            ["--heads", str(setup["root"] / "medusa"), *compare_args(setup, link, setup["questions"])]
        )
    assert link.is_symlink() and not (tmp_path / "gone").exists()


def test_a_run_failing_before_its_first_record_puts_the_old_results_back(
    setup, finished, tmp_path, monkeypatch
):
    out = copy_of(finished, tmp_path / "eval")
    before = snapshot(out)
    calls = []

    def failing(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(evaluate, "decode_prompt", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        cli(eval_args(setup, out, "medusa", *FIXED, "--overwrite"))
    assert calls == [1]  # it did start: the old results had been set aside, and came back
    assert snapshot(out) == before


def test_the_old_results_go_once_the_new_run_keeps_its_first_record(setup, finished, tmp_path, monkeypatch):
    out = copy_of(finished, tmp_path / "eval")
    stop_at_call(monkeypatch, evaluate, "decode_prompt", 2)
    with pytest.raises(KeyboardInterrupt):
        cli(eval_args(setup, out, "medusa", *FIXED, "--overwrite"))
    monkeypatch.undo()
    assert sorted(p.name for p in out.iterdir()) == ["progress.jsonl"]  # no aside folder left either
    assert len((out / "progress.jsonl").read_text().splitlines()) == 2
    assert cli(eval_args(setup, out, "medusa", *FIXED, "--resume")) == 0


def test_compare_overwrite_with_a_mistyped_prompt_set_leaves_the_finished_comparison(compare_setup, tmp_path):
    out = tmp_path / "compare"
    argv = compare_args(compare_setup, out, compare_setup["questions"], "--peers", "generate", "--no-plots")
    argv += ["--warmup", "0", "--max-turns", "1", "--num-prompts", "1"]
    argv += ["--heads", str(compare_setup["root"] / "medusa"), "--tree", "chain-4"]
    assert compare_cli(argv) == 0
    before = snapshot(out)
    with pytest.raises((ValueError, OSError), match="heldot"):
        compare_cli(with_prompts(argv, "heldot") + ["--overwrite"])
    assert snapshot(out) == before
    with hold_folder(out):
        with pytest.raises(FolderInUseError):
            compare_cli([*argv, "--overwrite"])
    assert snapshot(out) == before
    assert compare_cli([*argv, "--overwrite"]) == 0
    assert sorted(snapshot(out)) == sorted(before)  # replaced, the same files and nothing else


# -- core/run_folder.replacing ---------------------------------------------------------------------


NAMES = ("results.json", "report.md")


def folder_with_results(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text("old results")
    (out / "report.md").write_text("old report")
    (out / "progress.jsonl").write_text("old progress\n")
    (out / "notes.txt").write_text("the user's")
    return out


def test_replacing_refuses_results_without_overwrite_and_sets_them_aside_with_it(tmp_path):
    out = folder_with_results(tmp_path)
    before = snapshot(out)
    with pytest.raises(FileExistsError, match="pass --overwrite"), replacing(out, NAMES, False):
        pass
    assert snapshot(out) == before
    with replacing(out, NAMES, True, also=("progress.jsonl",)) as old:
        assert sorted(p.name for p in out.iterdir()) == [f"{ASIDE}{os.getpid()}", "notes.txt"]
        (out / "progress.jsonl").write_text("new header\n")
        old.commit()
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "progress.jsonl"]
        old.commit()  # once only
    assert (out / "progress.jsonl").read_text() == "new header\n"


def test_replacing_puts_the_old_results_back_on_an_error_before_the_commit(tmp_path):
    out = folder_with_results(tmp_path)
    before = snapshot(out)
    with pytest.raises(ValueError, match="bad"), replacing(out, NAMES, True, also=("progress.jsonl",)):
        (out / "progress.jsonl").write_text("new header\n")
        (out / "report.md").write_text("half a report")
        raise ValueError("bad")
    assert snapshot(out) == before


def test_replacing_puts_back_what_a_killed_run_had_set_aside(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = folder_with_results(tmp_path)
    before = snapshot(out)
    aside = out / f"{ASIDE}{dead.pid}"  # a run killed after setting them aside, before its first record
    aside.mkdir()
    for name in ("results.json", "report.md", "progress.jsonl"):
        (out / name).rename(aside / name)
    (out / "progress.jsonl").write_text("its header\n")
    dropped = out / f"{DROPPED}{dead.pid}"  # one killed while dropping them
    dropped.mkdir()
    (dropped / "results.json").write_text("older")
    with pytest.raises(FileExistsError, match="holds another run's results"):  # and refused again
        with replacing(out, NAMES, False, also=("progress.jsonl",)):
            pass
    assert snapshot(out) == before
