"""Calibrated trees kept across runs: `--tree auto` calibrates a pair of heads once per machine.

A calibration measures τ and the step and draft times of candidate trees (evaluate/calibrate.py): tens of
seconds on the tiny target, minutes on a real one, often more than the decoding it speeds up. What it
chooses depends only on what it measured, so a second run with the same inputs on the same machine can
take the first run's choice. The inputs are the key:

    the heads' weights (a sha256 over every tensor), the target's weights fingerprint, the method and the
    draft vocabulary, the calibration prompts' token ids, the calibration settings, and the machine: its
    processor, CPU count, torch threads, device, dtype, and the torch and specheads versions.

The calibration is kept as `<specheads cache>/calibrations/<sha256 of the key>.json` (or in
$SPECHEADS_CALIBRATIONS), with the key itself
beside it (a file whose key differs is not used). `--recalibrate` measures afresh and replaces it.
A file that cannot be read is reported and replaced, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from specheads.core.atomic import write_json
from specheads.core.machine import processor_name
from specheads.core.manifest import cache_root
from specheads.core.target import FrozenTarget
from specheads.version import __version__

CACHE_FOLDER = "calibrations"
FORMAT = 1  # bump when what a calibration records, or how it measures, changes


def tensors_sha256(module: torch.nn.Module) -> str:
    """sha256 over every tensor of `module`'s state dict: names, shapes, dtypes and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        data = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(data.shape)}:{data.dtype}:".encode())
        digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def ids_sha256(tensors) -> str:
    """sha256 over a sequence of integer tensors (prompts' token ids, a draft vocabulary)."""
    digest = hashlib.sha256()
    for t in tensors:
        digest.update(t.detach().to("cpu", torch.int64).reshape(-1).numpy().tobytes())
        digest.update(b"|")
    return digest.hexdigest()


def machine_key(target: FrozenTarget) -> dict[str, Any]:
    """What about the machine a calibration's timings depend on."""
    device = target.device
    accelerator = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "processor": processor_name(),
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "accelerator": accelerator,
        "dtype": str(target.dtype),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "specheads": __version__,
    }


def calibration_key(
    heads: torch.nn.Module,
    config: dict[str, Any],
    target: FrozenTarget,
    prompts,
    settings,
    vocab: torch.Tensor | None,
) -> dict[str, Any]:
    """Every input a calibration's choice depends on (module docstring)."""
    return {
        "format": FORMAT,
        "method": config.get("method"),
        "heads": tensors_sha256(heads),
        "target": target.record().weights_fingerprint,
        "draft_vocab": None if vocab is None else ids_sha256([vocab]),
        "prompts": ids_sha256([p.input_ids for p in prompts]),
        "settings": json.loads(json.dumps(asdict(settings))),  # tuples as lists, as the file reads back
        "machine": machine_key(target),
    }


def calibrations_dir() -> Path:
    """Where calibrations are kept: $SPECHEADS_CALIBRATIONS, else calibrations/ in the specheads cache."""
    return Path(os.environ.get("SPECHEADS_CALIBRATIONS") or cache_root() / CACHE_FOLDER)


def cache_path(key: dict[str, Any]) -> Path:
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return calibrations_dir() / f"{name}.json"


def read_cached(key: dict[str, Any]) -> dict[str, Any] | None:
    """The calibration kept for `key`, or None (none kept, another key, or a file that cannot be read:
    reported on stderr; the new calibration replaces it)."""
    path = cache_path(key)
    if not path.exists():
        return None
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if kept.get("key") == key and isinstance(kept.get("calibration"), dict):
            calibration = kept["calibration"]
            return {**calibration, "reused": {"from": str(path), "seconds_saved": calibration.get("seconds")}}
    except (OSError, ValueError, AttributeError) as error:  # AttributeError: JSON that is not an object
        print(f"specheads: ignoring the unreadable calibration {path}: {error}", file=sys.stderr)
    return None


def write_cached(key: dict[str, Any], calibration: dict[str, Any]) -> Path:
    """Keep `calibration` for `key`, whole or not at all."""
    path = cache_path(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_json(path, {"key": key, "calibration": calibration})
