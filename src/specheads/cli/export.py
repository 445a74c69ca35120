"""`specheads export` / `specheads import-heads`: native heads to serving-engine checkpoints and back.

    specheads export --heads runs/tiny-eagle3 --format eagle3 --out exports/tiny-eagle3
    specheads import-heads --format eagle3 --checkpoint ./EAGLE3-LLaMA3.1-Instruct-8B \\
        --target meta-llama/Llama-3.1-8B-Instruct --out heads/eagle3-official

Formats: medusa (TGI, TensorRT-LLM), vllm-medusa, eagle (SGLang, vLLM), eagle3 (SGLang, vLLM),
speculators (vLLM). An export that cannot express the heads fails before writing anything; an import
checks every tensor against the target and writes a native checkpoint `specheads eval --heads` reads.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specheads.builders.named_targets import resolve_target
from specheads.cli import error_line
from specheads.cli.threads import add_threads_argument
from specheads.core.run_folder import check_writable
from specheads.core.target import FrozenTarget, TargetMismatchError, resolve_dtype
from specheads.heads.formats import FORMATS, FormatError, export_heads
from specheads.methods import methods

_ERRORS = (
    FormatError,
    TargetMismatchError,
    FileExistsError,
    FileNotFoundError,
    PermissionError,
    NotADirectoryError,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `specheads export`."""
    p.add_argument("--heads", required=True, type=Path, help="native head checkpoint directory")
    p.add_argument("--format", required=True, choices=sorted(FORMATS), help="engine layout to write")
    p.add_argument("--out", required=True, type=Path, help="new directory for the engine checkpoint")
    p.add_argument(
        "--target",
        default=None,
        help="the heads' target (HF directory, hub id, or a named one: tiny, smollm2): needed for Medusa "
        "heads that share its lm_head, and for the embedding `speculators` checkpoints carry; when given, the "
        "heads' target record is checked against it",
    )
    p.add_argument(
        "--allow-target-mismatch",
        action="store_true",
        help="export heads whose recorded target weights fingerprint differs from --target's",
    )
    p.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "bfloat16", "float16"],
        help="cast the weights (default: keep)",
    )
    p.add_argument(
        "--fc-bias",
        default=None,
        choices=["keep", "drop"],
        help="eagle only, for heads trained with a nonzero fc bias (which vLLM's EAGLE layer lacks, so the "
        "export refuses them by default): keep it (SGLang and the EAGLE repo; vLLM then refuses the "
        "checkpoint) or drop it (every engine reads a zero bias)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="speculators only: proposal depth vLLM uses (default: the training-time-test steps)",
    )
    add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    """`specheads export`."""
    if args.num_speculative_tokens is not None and args.format != "speculators":
        print(
            "specheads export: error: --num-speculative-tokens applies to --format speculators only",
            file=sys.stderr,
        )
        return 2
    if args.fc_bias is not None and args.format != "eagle":
        print("specheads export: error: --fc-bias applies to --format eagle only", file=sys.stderr)
        return 2
    try:
        check_writable(args.out, "--out")  # before the target loads
        target = FrozenTarget.from_pretrained(resolve_target(args.target)) if args.target else None
        export = export_heads(
            args.heads,
            args.format,
            args.out,
            target=target,
            dtype=resolve_dtype(args.dtype),
            speculative_tokens=args.num_speculative_tokens,
            fc_bias=args.fc_bias,
            allow_target_mismatch=args.allow_target_mismatch,
            methods=methods(),
        )
    except _ERRORS as e:
        print(f"specheads export: error: {error_line(e)}", file=sys.stderr)
        return 1
    for note in export.notes:
        print(f"note: {note}")
    print(f"wrote {args.format} checkpoint {args.out} ({len(export.tensors)} tensors)")
    return 0
