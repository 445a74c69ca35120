"""`specheads import-heads --format F --checkpoint DIR --target DIR --out DIR`: read an official (or exported) engine
checkpoint into a native head checkpoint (heads/formats/)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specheads.builders.named_targets import resolve_target
from specheads.cli import error_line
from specheads.cli.export import _ERRORS
from specheads.cli.threads import add_threads_argument
from specheads.core.run_folder import check_writable
from specheads.core.target import FrozenTarget
from specheads.heads.formats import FORMATS, import_heads


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `specheads import-heads`."""
    p.add_argument("--format", required=True, choices=sorted(FORMATS), help="layout of the checkpoint")
    p.add_argument("--checkpoint", required=True, type=Path, help="local directory of the engine checkpoint")
    p.add_argument(
        "--target",
        required=True,
        help="the target the heads draft for (HF directory, hub id, or tiny / smollm2)",
    )
    p.add_argument("--out", required=True, type=Path, help="new directory for the native checkpoint")
    add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    """`specheads import-heads`."""
    try:
        if not args.checkpoint.is_dir():
            raise FileNotFoundError(
                f"{args.checkpoint} is not a directory (download a hub checkpoint first, e.g. "
                "`huggingface-cli download ORG/NAME --local-dir DIR`)"
            )
        check_writable(args.out, "--out")  # before the target loads
        target = FrozenTarget.from_pretrained(resolve_target(args.target), dtype="float32")
        heads = import_heads(args.checkpoint, args.format, target, args.out)
    except _ERRORS as e:
        print(f"specheads import-heads: error: {error_line(e)}", file=sys.stderr)
        return 1
    print(f"imported {args.format} {heads.method} heads from {args.checkpoint} into {args.out}")
    return 0
