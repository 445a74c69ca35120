"""A table of bad inputs through the console script, each in its own process: every one must end the
command with a non-zero exit code and exactly one line on stderr, `specheads COMMAND: error: ...`, naming
the input at fault (the file, and the key or line where there is one), and must leave every file that
was there before, inputs and earlier outputs, byte for byte as it was (nothing half-written, nothing
deleted).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from specheads.core.target import FrozenTarget
from specheads.heads import MedusaConfig, MedusaHeads, save_heads

from helpers import edit_weights

REPO = Path(__file__).resolve().parents[1]
PROGRESS = re.compile(r"\d+%\|")
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"
ENV = {
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "TOKENIZERS_PARALLELISM": "false",
}
# A full disk, made where it is wanted: the safetensors writer fails as it does on a full device (the
# message is the one safetensors gives there), inside `specheads` run as the console script runs it.
FULL_DISK = """
import sys
import safetensors.torch
from safetensors import SafetensorError
def full(*args, **kwargs):
    raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
safetensors.torch.save_file = full
import specheads.heads.formats.io, specheads.heads.checkpoint
specheads.heads.formats.io.save_file = specheads.heads.checkpoint.save_file = full
from specheads.cli import main
sys.argv = ["specheads", *sys.argv[1:]]
sys.exit(main())
"""


@dataclass
class Case:
    """`argv` (after `specheads`) over the folder `root` prepared by `make`; the error line must hold each of
    `names` (strings, with {root} standing for the folder) and none of `never`."""

    make: object  # (root: Path, world: dict) -> list[str] argv
    names: tuple[str, ...]
    never: tuple[str, ...] = ()
    full_disk: bool = False


@pytest.fixture(scope="module")
def world(tiny_target_dirs, tmp_path_factory) -> dict:
    """The tiny llama target, Medusa heads for it, those heads exported as a Medusa checkpoint, and a
    2-step training run with its step-1 checkpoint."""
    root = tmp_path_factory.mktemp("bad-inputs")
    target_dir = tiny_target_dirs["llama"]
    target = FrozenTarget.from_pretrained(str(target_dir))
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=2))
    heads_dir = save_heads(heads.init_lm_heads_from(target.lm_head), root / "heads", target.record())
    from specheads.cli import main

    assert (
        main(["export", "--heads", str(heads_dir), "--format", "medusa", "--out", str(root / "medusa")]) == 0
    )
    data = root / "rows.jsonl"
    data.write_text("".join(json.dumps({"text": "abcdefghij" * 6 + str(i)}) + "\n" for i in range(40)))
    run = root / "run"
    argv = [
        "train", str(RECIPE), f"target={target_dir}", f"data={data}", f"output_dir={run}", "eval_data=[]",
        "max_length=32", "batch_size=4", "medusa.num_heads=2", "medusa.labels=data", "max_steps=2", "save_every=1",
        "eval_every=1000", "report_to=none", "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    return {"target": target_dir, "heads": heads_dir, "medusa": root / "medusa", "run": run, "train": argv}


def copy(src: Path, dst: Path) -> Path:
    return Path(shutil.copytree(src, dst))


def questions(root: Path, raw: bytes) -> Path:
    path = root / "q.jsonl"
    path.write_bytes(json.dumps({"question_id": 1, "turns": ["hello"]}).encode() + b"\n" + raw + b"\n")
    return path


def eval_argv(world: dict, root: Path, prompts, target=None) -> list[str]:
    return [
        "eval", "--target", str(target or world["target"]), "--heads", str(world["heads"]), "--prompts",
        str(prompts), "--out", str(root / "eval"), "--max-new-tokens", "4", "--no-progress",
    ]  # fmt: skip


def other_method(root: Path, world: dict) -> list[str]:
    heads = copy(world["heads"], root / "heads")
    config = json.loads((heads / "config.json").read_text())
    (heads / "config.json").write_text(json.dumps({**config, "method": "eagle"}))
    return ["export", "--heads", str(heads), "--format", "eagle", "--out", str(root / "out")]


def truncated_import(root: Path, world: dict) -> list[str]:
    ckpt = copy(world["medusa"], root / "medusa")
    weights = ckpt / "medusa_lm_head.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    return ["import-heads", "--format", "medusa", "--checkpoint", str(ckpt), "--target", str(world["target"]),
            "--out", str(root / "out")]  # fmt: skip


class Boom:
    def __reduce__(self):
        return (os.system, ("echo owned > owned.txt",))


def malicious_import(root: Path, world: dict) -> list[str]:
    ckpt = copy(world["medusa"], root / "medusa")
    (ckpt / "medusa_lm_head.safetensors").unlink()
    with open(ckpt / "medusa_lm_head.pt", "wb") as f:
        pickle.dump({"w": Boom()}, f)
    return ["import-heads", "--format", "medusa", "--checkpoint", str(ckpt), "--target", str(world["target"]),
            "--out", str(root / "out")]  # fmt: skip


def escaping_heldout(root: Path, world: dict) -> list[str]:
    target = copy(world["target"], root / "target")
    (root / "secret.py").write_text("print('not the target's')\n")
    (target / "heldout_files.json").write_text(json.dumps({"root": "..", "files": ["secret.py"]}))
    return eval_argv(world, root, "heldout", target=target)


def changed_weight(root: Path, world: dict) -> list[str]:
    target = copy(world["target"], root / "target")
    edit_weights(target, lambda t: t["model.layers.1.self_attn.o_proj.weight"][0, 1].add_(1.0))
    return ["export", "--heads", str(world["heads"]), "--format", "medusa", "--target", str(target),
            "--out", str(root / "out")]  # fmt: skip


def damaged_rng(root: Path, world: dict) -> list[str]:
    run = copy(world["run"], root / "run")
    rng = run / "checkpoints" / "step-1" / "accelerate" / "random_states_0.pkl"
    rng.write_bytes(rng.read_bytes()[:30])
    argv = [a for a in world["train"] if not a.startswith(("output_dir=", "max_steps=", "--"))]
    return [*argv, f"output_dir={run}", "max_steps=3", "resume=auto", "--no-progress"]


def full_disk_export(root: Path, world: dict) -> list[str]:
    return ["export", "--heads", str(world["heads"]), "--format", "medusa", "--out", str(root / "out")]


def export_option(root: Path, world: dict) -> list[str]:
    return full_disk_export(root, world) + ["--num-speculative-tokens", "3"]


def recipe_file(root: Path, text: str) -> list[str]:
    (root / "recipe.yaml").write_text(text)
    return ["train", str(root / "recipe.yaml"), f"output_dir={root / 'run'}", "--no-progress"]


def dangling_out(root: Path, world: dict) -> list[str]:
    (root / "eval").symlink_to(root / "gone")
    return eval_argv(world, root, "heldout")


CASES = {
    "empty recipe": Case(
        lambda root, world: recipe_file(root, "# nothing set\n"), ("{root}/recipe.yaml", "sets no keys")
    ),
    "recipe key set twice": Case(
        lambda root, world: recipe_file(root, "method: medusa\nmax_steps: 120\nmax_steps: 1000\n"),
        ("{root}/recipe.yaml at line 3", "'max_steps' is set twice (first at line 2)"),
    ),
    "eval --out a dangling symlink": Case(dangling_out, ("{root}/eval", "{root}/gone", "does not exist")),
    "head config of another method": Case(
        other_method,
        ("{root}/heads/config.json", "does not fit method 'eagle'", "unexpected keys 'hidden_size'"),
    ),
    "import-heads truncated safetensors": Case(
        truncated_import, ("{root}/medusa/medusa_lm_head.safetensors", "truncated or corrupt")
    ),
    "import-heads blocked pickle": Case(
        malicious_import, ("{root}/medusa/medusa_lm_head.pt", "will not load"), never=("weights_only",)
    ),
    "prompt not UTF-8": Case(
        lambda root, world: eval_argv(world, root, questions(root, b'{"turns": ["caf\xe9"]}')),
        ("{root}/q.jsonl, line 2", "not valid UTF-8"),
    ),
    "prompt lone surrogate": Case(
        lambda root, world: eval_argv(world, root, questions(root, b'{"turns": ["a \\ud800 b"]}')),
        ("{root}/q.jsonl, line 2", "lone surrogate"),
    ),
    "held-out root outside the target": Case(
        escaping_heldout, ("{root}/target/heldout_files.json", '"root"', "leads outside")
    ),
    "target weight the sample misses": Case(
        changed_weight, ("{root}/target", "weights hash", "other weights")
    ),
    "damaged RNG states": Case(
        damaged_rng, ("{root}/run/checkpoints/step-1/accelerate/random_states_0.pkl",)
    ),
    "disk full during export": Case(full_disk_export, ("{root}/out", "disk is full"), full_disk=True),
    "export option of another format": Case(
        export_option, ("--num-speculative-tokens", "--format speculators")
    ),
}


def tree(root: Path) -> dict[str, str]:
    """Every file and folder under `root`: path -> sha256 of its bytes ("dir" for a folder, where a link
    points for a symlink)."""

    def what(p: Path) -> str:
        if p.is_symlink():
            return f"link -> {os.readlink(p)}"
        return "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()

    return {str(p.relative_to(root)): what(p) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_line_naming_it_and_changes_nothing(name, world, tmp_path):
    case, root = CASES[name], tmp_path / "case"
    root.mkdir()
    argv = case.make(root, world)
    before = tree(root)
    command = ["-c", FULL_DISK] if case.full_disk else ["-m", "specheads"]
    done = subprocess.run(
        [sys.executable, *command, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV, "PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=root,
        timeout=600,
    )
    # the one line, beside the progress bars of what ran before the error (tqdm's "NN%|")
    lines = [line for line in done.stderr.splitlines() if line.strip() and not PROGRESS.search(line)]
    assert done.returncode != 0, done.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith(f"specheads {argv[0]}: error: "), done.stderr[-3000:]
    for want in case.names:
        assert want.format(root=root) in lines[0], (want, lines[0])
    for unwanted in case.never:
        assert unwanted not in lines[0], lines[0]
    assert tree(root) == before, "the failed command changed files that were there"
    assert not (root / "owned.txt").exists()


def test_a_folder_names_nothing_outside_it(tmp_path):
    """core/confined.py: a name that climbs out, an absolute one, and a link inside that points out are
    refused naming the file and key; a hub cache's linked weights pass when links are not followed."""
    from specheads.core.confined import confined

    folder, source = tmp_path / "target", tmp_path / "target" / "list.json"
    (folder / "heldout").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (folder / "heldout" / "link").symlink_to(tmp_path / "outside")
    assert confined(folder, "heldout/a.py", source, '"files"') == folder / "heldout" / "a.py"
    for name in ("../outside/a.py", str(tmp_path / "outside" / "a.py"), "heldout/link/a.py"):
        with pytest.raises(ValueError, match=rf'{source}: "files" .* leads outside {folder}'):
            confined(folder, name, source, '"files"')
    assert confined(folder, "heldout/link/a.py", source, '"files"', follow_links=False)


@pytest.mark.parametrize("writer", ["train metrics", "eval progress"])
def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch, writer):
    """The kernel's ENOSPC names no file: the appends of a run (metrics.jsonl, progress.jsonl) say which."""
    import errno

    from specheads.cli import error_line
    from specheads.core.atomic import DiskFullError

    class Full(OSError):
        pass

    if writer == "train metrics":
        from specheads.train import tracking

        class FullFile:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

            def write(self, text):
                raise Full(errno.ENOSPC, "No space left on device")

        class OnAFullDisk(type(tmp_path)):
            def open(self, *args, **kwargs):
                return FullFile()

        class Main:
            is_main_process = True

            def log(self, *args, **kwargs):
                pass

        path = OnAFullDisk(tmp_path / "metrics.jsonl")
        write = lambda: tracking.log_record(Main(), path, {"split": "train", "step": 1, "loss": 1.0})  # noqa: E731
    else:
        from specheads.evaluate import progress

        path = tmp_path / "progress.jsonl"
        path.write_text('{"progress": "eval", "settings": {}}\n')
        log = progress.Progress.__new__(progress.Progress)
        log.path, log.done = path, []

        def full_write(fd, data):
            raise Full(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(progress.os, "write", full_write)
        write = lambda: log.append({"id": 1})  # noqa: E731
    with pytest.raises(DiskFullError) as caught:
        write()
    assert error_line(caught.value).startswith(f"{path}: the disk is full")
