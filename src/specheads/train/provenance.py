"""What a training run was: written to output_dir/provenance.jsonl when it starts, one line per launch
(a fresh start, then each resume), so that a checkpoint can be traced to the code and settings behind it.

Each line: time, command line, the resolved recipe, the checkpoint resumed from, the sha256 of the chat
template the conversations were rendered with (the recipe's chat_template and enable_thinking applied;
null without one), package versions, the git commit of the specheads checkout and whether it had uncommitted changes (null outside a git
checkout), the host, Python, and the number of processes.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from specheads.core.atomic import naming_a_full_disk

PACKAGES = (
    "specheads",
    "torch",
    "transformers",
    "accelerate",
    "deepspeed",
    "datasets",
    "peft",
    "safetensors",
    "wandb",
)
PROVENANCE_FILE = "provenance.jsonl"


def package_versions(names=PACKAGES) -> dict[str, str | None]:
    """Installed versions. torch's is the running build's own (`2.13.0+cpu`, `2.13.0+cu130`): PyPI's CUDA
    wheel's metadata says only `2.13.0`, which would hide which build a run used."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    if "torch" in versions:
        versions["torch"] = torch.__version__
    return versions


def git_state(path: Path) -> dict | None:
    """{"commit", "dirty"} of the git checkout holding `path`; None if it is not in one (or git is missing)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def provenance(
    config: dict, num_processes: int, resumed_from: str | None = None, chat_template: str | None = None
) -> dict:
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": sys.argv,
        "config": config,
        "resumed_from": resumed_from,
        "chat_template_sha256": hashlib.sha256(chat_template.encode()).hexdigest() if chat_template else None,
        "packages": package_versions(),
        "git": git_state(Path(__file__).resolve().parent),
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "num_processes": num_processes,
    }


def write_provenance(output_dir: str | Path, record: dict) -> Path:
    path = Path(output_dir) / PROVENANCE_FILE
    with naming_a_full_disk(path), path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")
    return path
