"""`--threads N`, the one definition of the flag: torch's CPU threads for a command that computes.

Each such command's `add_arguments` ends with `add_threads_argument(p)`; cli/__init__.py sets the count around the
command's `run` (`torch_threads`), so no command reads the flag itself.
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager

import torch


def thread_count(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def add_threads_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads", type=thread_count, default=None, help="CPU threads for torch (default: torch's own)"
    )


@contextmanager
def torch_threads(threads: int | None):
    """torch's thread count set to `threads` (None: left as it is) for the run and given back after it, so
    a command called from Python leaves its caller's setting alone."""
    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
