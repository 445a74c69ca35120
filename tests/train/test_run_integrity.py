"""Runs through the real console script (`python -m specheads`) in their own processes, as a user runs
them: same run, same bytes."""

import os
import subprocess
import sys
from pathlib import Path

from specheads.heads.checkpoint import sha256_file

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "recipes" / "tiny" / "medusa.yaml"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}


def train_argv(target: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "specheads", "train", str(RECIPE),
        f"target={target}", f"data={data}", f"output_dir={out}",
        "max_length=64", "batch_size=4", "num_heads=2", "labels=data", "warmup_steps=1", "eval_data=[]",
        "eval_fraction=0.1", "eval_every=4", "eval_batches=1", "log_every=2", "report_to=none",
        *extra, "--no-progress",
    ]  # fmt: skip


def test_two_identical_runs_write_byte_identical_weights(tiny_target_dirs, text_data, tmp_path):
    """safetensors writes its metadata map in hash order: with two keys the same weights came out in
    different bytes, so runs could not be compared by sha256."""
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        argv = train_argv(tiny_target_dirs["llama"], text_data, out, "max_steps=4", "save_every=2")
        done = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    for name in ("model.safetensors", "checkpoints/step-2/model.safetensors"):
        assert sha256_file(outs[0] / name) == sha256_file(outs[1] / name), name
