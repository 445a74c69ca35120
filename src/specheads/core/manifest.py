"""What specheads builds and where: the cache folder, and the manifest a named target's builder writes
beside its config.json, whose weights checksum heads record (`weights_id`), so that a checkpoint says
which bytes it was trained against, not only which name.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST_FILE = "specheads_target.json"  # written by a named target's builder, beside config.json


def cache_root() -> Path:
    """Where specheads keeps what it builds: $SPECHEADS_CACHE, else $XDG_CACHE_HOME/specheads."""
    root = os.environ.get("SPECHEADS_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specheads"
    )
    return Path(root)


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
