"""Paths that a target or heads folder names in its own files stay inside that folder.

A folder someone handed over (a target, heads, a cache) is data, not a licence to read the machine: a
`heldout_files.json` whose "root" is "../../.." would otherwise make `--prompts heldout` read any file.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePath


def confined(
    folder: str | Path, name: str | os.PathLike, source: str | Path, key: str, follow_links: bool = True
) -> Path:
    """`folder`/`name`, refused (ValueError naming `source`, the file that holds the name, and its `key`)
    when it leads outside `folder`: an absolute name, a `..` that climbs out, or (`follow_links`) a
    symbolic link on the way that points elsewhere. Without `follow_links` only the name is checked: a
    hub cache's snapshot links its weights to blobs beside it."""
    if not isinstance(name, (str, os.PathLike)):
        raise ValueError(f"{source}: {key} must be a path inside {folder}, got {name!r}")
    base = Path(os.path.expanduser(str(folder)))
    path = base / name
    climbs = PurePath(name).is_absolute() or not _normalised(path).is_relative_to(_normalised(base))
    if not climbs and follow_links:
        climbs = not path.resolve().is_relative_to(base.resolve())
    if climbs:
        where = path.resolve() if follow_links else _normalised(path)
        raise ValueError(
            f"{source}: {key} {str(name)!r} leads outside {base} (to {where}); the paths a folder names "
            "must stay inside it"
        )
    return path


def _normalised(path: Path) -> Path:
    return Path(os.path.normpath(os.path.abspath(path)))
