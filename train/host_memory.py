"""Host memory between training steps: glibc told to keep what torch frees, not hand it back to the kernel.

A CPU training step allocates and frees the same large tensors every step (the target's activations and
logits, the draft's unrolled steps). glibc serves each allocation over its mmap threshold (at most 32 MiB)
with a fresh mmap and unmaps it on free, and trims the heap's free top past 128 KiB, so every step faults
all of those pages in again, zeroed by the kernel. On SmolLM2's EAGLE-3 recipe (8 steps, 1 thread, the two
runs side by side, 2026-12-02) that was 5.99 M minor page faults over the run against 0.66 M with mmap and
trimming off (what `keep_freed_memory` does), 17.7 s a step against 15.4 (1.15x), 32.6 s of system time
against 8.8, the same losses to the last digit, at 3% more peak memory (3.20 GB against 3.11);
scripts/bench_host_memory.py measures it, JSON out. It is PyTorch's CPU tuning guide's advice (a caching
allocator such as jemalloc or TCMalloc) without a preloaded library.

The settings are process-wide, so on exit `keep_freed_memory` sets both back to glibc's default values and
trims the heap, and a caller that trains from Python gets its memory back. Two things stay as mallopt(3) leaves
them: the mmap threshold no longer adapts to freed blocks (any mallopt of these turns that off), and values a
user gave through GLIBC_TUNABLES or MALLOC_*_ are replaced by the defaults. Off glibc (macOS, musl) it does
nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's malloc.h
DEFAULT_TRIM_THRESHOLD, DEFAULT_MMAP_MAX = 128 * 1024, 65536  # glibc's defaults


def glibc():
    """The process's C library when it is glibc (mallopt, malloc_trim), else None."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@contextmanager
def keep_freed_memory(enabled: bool = True):
    """Within: freed memory stays with the process (no mmap for large blocks, no trimming of the heap).
    Yields whether the setting took (False: disabled, or not glibc)."""
    libc = glibc() if enabled else None
    if libc is None:
        yield False
        return
    # mallopt returns 1 on success; -1 as the trim threshold turns trimming off (mallopt(3))
    took = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, -1) == 1
    try:
        yield took
    finally:
        libc.mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)
        libc.malloc_trim(0)  # hand back what the run kept
