"""Writing files and folders whole or not at all: the one way every command writes what it keeps.

A file is written to a temporary name beside its destination and renamed over it (`os.replace` is atomic
on one file system), so a reader, or a run killed half-way, never sees half a file. A folder is written
into a temporary folder beside it that replaces it whole. Temporary names carry the writer's pid, so the
next writer can remove what a killed one left (`run_folder.clean_stale_tmp`). What is written gets the
modes a plain `open` or `mkdir` would give under the process's umask (mkstemp and mkdtemp make them
private to their owner, 0600 and 0700: a shared target, cache or checkpoint would be unreadable to others).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from specheads.core.run_folder import clean_stale_tmp, tmp_prefix


class DiskFullError(OSError):
    """No space was left on the device while writing a file the message names."""


def is_disk_full(e: BaseException) -> bool:
    """Whether `e` says the device is full: an OSError with ENOSPC, or a Rust writer's (safetensors')
    "os error 28"."""
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "(os error 28)" in str(e)


@contextmanager
def naming_a_full_disk(path: str | Path) -> Iterator[None]:
    """Within `with`, an error saying the device is full becomes DiskFullError naming `path`, what was
    being written (the errors themselves name no file)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        full = DiskFullError(
            f"{path}: the disk is full (no space left on device while writing it); free space there or "
            "write elsewhere"
        )
        full.errno = errno.ENOSPC
        raise full from e


def write_file(dest: str | Path, write: Callable[[str], Any]) -> Path:
    """Call `write(tmp_path)` to write a temporary file, then rename it to `dest`; on any error the
    temporary file is removed and `dest` is untouched.

    The temporary file (named as `dest`) lies in a temporary folder beside `dest`, so that what `write`
    itself puts beside the path it is given (safetensors' writer: a `.tmpXXXXXX` file it renames at the
    end) stays inside that folder, and a killed writer's leftovers are one folder that the next write of
    `dest` removes (clean_stale_tmp)."""
    dest = Path(dest)
    clean_stale_tmp(dest)  # what a killed writer of `dest` left (a resumed cache rewrites its index.json)
    folder = Path(tempfile.mkdtemp(prefix=tmp_prefix(dest), dir=dest.parent))
    tmp = folder / dest.name
    try:
        with naming_a_full_disk(dest):
            write(str(tmp))
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return dest


def write_text(dest: str | Path, text: str) -> Path:
    """`text` (UTF-8) into `dest`, whole or not at all."""
    return write_file(dest, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_json(dest: str | Path, data: Any, indent: int | None = 1) -> Path:
    """`data` as JSON into `dest`, whole or not at all."""
    return write_text(dest, json.dumps(data, indent=indent, default=str))


@contextmanager
def replace_dir(out: str | Path, *, keep_existing: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `out` to write into; it replaces `out` whole if the block
    succeeds, and is removed if it fails, so `out` is always the old folder or the whole new one.

    keep_existing: if `out` exists when the block ends (another process finished it first), keep that
        one and drop ours.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_tmp(out)  # what a killed writer (SIGKILL: no `finally`) left beside it
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix(out), dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        with naming_a_full_disk(out):
            yield tmp
        if out.exists():
            if keep_existing:
                return
            shutil.rmtree(out)  # os.replace cannot put a directory over a non-empty one
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
