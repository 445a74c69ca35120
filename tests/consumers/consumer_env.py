"""The consumers' own packages, installed apart from the project (never dependencies of specheads).

`consumer_env` installs the pinned packages once with `pip install --no-deps --target` under the specheads
cache (`SPECHEADS_CACHE`, else ~/.cache/specheads), keyed by the pins and the Python version, so later
runs reuse it. `--no-deps` keeps their old pins (eagle-llm: accelerate 0.21, gradio 3.50, ...) out: torch,
transformers, safetensors and the rest come from the project's environment; the only extras are what
the model files import that the project lacks (speculators imports `openai`, `loguru` and `hs_connectors` at
package import; their trainers, `fastchat`). About 8 s to install from PyPI here (a few MB of wheels), once per pin set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specheads.builders.tiny_target import default_cache_dir

CONSUMERS = ("speculators==0.9.0", "eagle-llm==1.2.1", "medusa-llm==0.1")
IMPORTED_BY_THEM = ("hs-connectors==0.9.0", "openai==3.57.0", "loguru==0.7.3")  # speculators imports them
# medusa-llm's trainer (medusa/train/train.py) and eagle-llm's data generator (eagle/ge_data) import fastchat
IMPORTED_BY_TRAINERS = ("fschat==0.2.36",)
PINS = CONSUMERS + IMPORTED_BY_THEM + IMPORTED_BY_TRAINERS
RUNNER = Path(__file__).with_name("consumer_run.py")


def env_dir() -> Path:
    key = hashlib.sha256(json_key().encode()).hexdigest()[:16]
    return default_cache_dir() / "consumers" / key


def json_key(pins: tuple[str, ...] = PINS) -> str:
    return " ".join(pins) + f" py{sys.version_info.major}.{sys.version_info.minor}"


def build(out: Path, pins: tuple[str, ...] = PINS) -> None:
    """pip install --no-deps --target `pins` into a temporary sibling, renamed to `out` once whole."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".building-"))
    try:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp), *pins]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"installing {pins[0]} and the rest failed ({' '.join(cmd)}):\n{done.stderr[-3000:]}"
            )
        (tmp / "PINS").write_text(json_key(pins) + "\n")
        try:
            os.replace(tmp, out)
        except OSError:  # another run finished first: keep its copy
            if not (out / "PINS").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_consumers(env: Path, jobs: list[dict], workdir: Path) -> None:
    """consumer_run.py over `jobs` in one subprocess that sees the consumer packages."""
    import json

    (workdir / "jobs.json").write_text(json.dumps(jobs))
    environ = {**os.environ, "PYTHONPATH": str(env), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(RUNNER), str(workdir / "jobs.json")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=environ)
    if done.returncode != 0:
        raise AssertionError(f"the consumer runner failed:\n{done.stderr[-4000:]}")
