"""Host memory between training steps: glibc told to keep what torch frees, not hand it back to the kernel.

A CPU training step allocates and frees the same large tensors every step (the target's activations and
logits, the draft's unrolled steps). glibc serves each allocation over its mmap threshold (at most 32 MiB)
with a fresh mmap and unmaps it on free, and trims the heap's free top past 128 KiB, so every step faults
all of those pages in again, zeroed by the kernel. On SmolLM2's EAGLE-3 recipe (8 steps, 1 thread, the two
runs side by side) that was 5.99 M minor page faults over the run against 0.66 M with mmap and
trimming off (what `keep_freed_memory` does), 17.7 s a step against 15.4 (1.15x), 32.6 s of system time
against 8.8, the same losses to the last digit, at 3% more peak memory (3.20 GB against 3.11);
benchmarks/bench_host_memory.py measures it, JSON out. It is PyTorch's CPU tuning guide's advice (a caching
allocator such as jemalloc or TCMalloc) without a preloaded library.

The settings are process-wide, so on exit `keep_freed_memory` sets both back to what the process started
with (a user's glibc.malloc.mmap_max / trim_threshold in GLIBC_TUNABLES, else MALLOC_MMAP_MAX_ /
MALLOC_TRIM_THRESHOLD_, else glibc's defaults) and trims the heap, and a caller that trains from Python gets its
memory back. Holds nest: only the outermost sets and restores, so a library call that holds it inside a command
that does leaves the command's setting in place. One thing stays as mallopt(3) leaves it: the mmap threshold no
longer adapts to freed blocks (any mallopt of these turns that off). Off glibc (macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import threading
from collections.abc import Mapping
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536  # glibc's defaults
INT_MAX = 2**31 - 1  # mallopt takes an int

_lock = threading.Lock()
_held = {"depth": 0, "took": False}  # holds now open (the outermost sets and restores), and whether it took


def glibc():
    """The process's C library when it is glibc (mallopt, malloc_trim), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def started_with(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(mmap_max, trim_threshold) as the process's environment gave them to glibc: GLIBC_TUNABLES'
    glibc.malloc.* first, then the MALLOC_*_ variables, else glibc's defaults; unreadable values count as
    unset. A trim threshold past what mallopt's int holds is -1 (never trim), which is what glibc makes of it."""
    given = dict(item.split("=", 1) for item in environ.get("GLIBC_TUNABLES", "").split(":") if "=" in item)

    def value(tunable: str, alias: str, default: int) -> int:
        for text in (given.get(f"glibc.malloc.{tunable}"), environ.get(alias)):
            try:
                number = int(text, 0)
            except (TypeError, ValueError):
                continue
            if number >= 0:
                return number if number <= INT_MAX else -1
        return default

    return (
        value("mmap_max", "MALLOC_MMAP_MAX_", DEFAULT_MMAP_MAX),
        value("trim_threshold", "MALLOC_TRIM_THRESHOLD_", DEFAULT_TRIM_THRESHOLD),
    )


@contextmanager
def keep_freed_memory(enabled: bool = True):
    """Within: freed memory stays with the process (no mmap for large blocks, no trimming of the heap).
    Yields whether the setting holds (False: disabled, or not glibc). Within another hold it changes nothing
    and leaves the restoring to the outer one."""
    libc = glibc() if enabled else None
    if libc is None:
        yield False
        return
    with _lock:
        _held["depth"] += 1
        if _held["depth"] == 1:
            # mallopt returns 1 on success; -1 as the trim threshold turns trimming off (mallopt(3))
            _held["took"] = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, -1) == 1
        took = _held["took"]
    try:
        yield took
    finally:
        with _lock:
            _held["depth"] -= 1
            if _held["depth"] == 0:
                mmap_max, trim_threshold = started_with()
                libc.mallopt(M_MMAP_MAX, mmap_max)
                libc.mallopt(M_TRIM_THRESHOLD, trim_threshold)
                libc.malloc_trim(0)  # hand back what the run kept
