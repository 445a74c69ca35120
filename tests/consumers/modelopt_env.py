"""NVIDIA Model Optimizer, installed apart from the project (never a dependency of specheads).

`pip install --no-deps --target` under the specheads cache (`SPECHEADS_CACHE`, else ~/.cache/specheads),
keyed by the pins and the Python version, as consumer_env.py does for the other consumers; a separate
directory because modelopt 0.47.0 needs an older transformers than the project's:

  * nvidia-modelopt 0.47.0 declares `transformers<5.15,>=4.57` (its `hf` extra) and, under the project's
    5.24, fails in its own training forward (modeling_eagle.py `_maybe_init_rope`:
    `LlamaRotaryEmbedding(config=..., device=...)`, a keyword 5.24 dropped). So the directory carries
    transformers 5.14.1 and what its import-time version check asks for (tokenizers 0.22.2,
    huggingface_hub 1.33.0), shadowing the project's in the modelopt subprocess only.
  * modelopt's import-time needs the project lacks: omegaconf (+ antlr4 runtime), pulp, nvidia-ml-py, scipy
    (a fresh venv has none of them: CI caught scipy, which a system-site-packages venv had hidden).

Torch, safetensors, numpy, pydantic and the rest come from the project's environment. About 190 MB
installed (pulp ships solver binaries), once per pin set. With it, modelopt's conversion, training
forward and exporter run on CPU unchanged (no shim).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from specheads.builders.tiny_target import default_cache_dir

from consumer_env import build, json_key

MODELOPT = "nvidia-modelopt==0.47.0"
ITS_TRANSFORMERS = ("transformers==5.14.1", "tokenizers==0.22.2", "huggingface_hub==1.33.0")
IMPORTED_BY_IT = (
    "omegaconf==2.3.0",
    "antlr4-python3-runtime==4.9.3",
    "pulp==3.3.2",
    "nvidia-ml-py==13.615.71",
    "scipy==1.17.1",  # modelopt.torch.nas imports scipy.interpolate at package import
)
PINS = (MODELOPT, *ITS_TRANSFORMERS, *IMPORTED_BY_IT)
RUNNER = Path(__file__).with_name("modelopt_run.py")


def env_dir() -> Path:
    return default_cache_dir() / "modelopt" / hashlib.sha256(json_key(PINS).encode()).hexdigest()[:16]


def ensure_env() -> Path:
    """The directory holding modelopt and its transformers (installed on first use, then reused)."""
    out = env_dir()
    if not (out / "PINS").is_file():
        build(out, PINS)
    return out


def subprocess_environ(env: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that runs modelopt: its directory first on the path (its transformers
    shadows the project's), then whatever the caller's path carries (on a GPU machine: the wheels its image
    lacks, datasets among them, which modelopt's data loader imports); offline; `extra` on top."""
    path = [str(env), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "HF_HUB_OFFLINE": "1", **extra}


def run_modelopt(env: Path, args: list[str]) -> None:
    """modelopt_run.py ARGS in a subprocess that sees modelopt and its transformers first."""
    environ = subprocess_environ(env, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True, env=environ)
    if done.returncode != 0:
        raise AssertionError(f"the modelopt runner failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
