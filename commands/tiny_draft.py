"""`specheads tiny-draft --target DIR`: a small draft model in the target's tokens, for assisted generation
(train/builders/tiny_draft.py)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from specheads.commands.threads import add_threads_argument
from specheads.train.builders.tiny_draft import TinyDraftConfig, ensure_tiny_draft


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target", required=True, type=Path, help="the target's HF directory (its tokenizer is used)"
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output directory (default: the user cache, reused when valid)"
    )
    p.add_argument("--steps", type=int, default=TinyDraftConfig.steps, help="optimizer steps")
    p.add_argument("--seed", type=int, default=TinyDraftConfig.seed)
    p.add_argument("--force", action="store_true", help="rebuild even if a valid build exists")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    for f in fields(TinyDraftConfig):
        if f.name not in ("seed", "steps"):  # model and schedule knobs, for tests and tuning
            flag = "--" + f.name.replace("_", "-")
            p.add_argument(flag, type=type(f.default), default=f.default, help=argparse.SUPPRESS)
    add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise SystemExit(f"error: --steps must be >= 1, got {args.steps}")
    cfg = TinyDraftConfig(**{f.name: getattr(args, f.name) for f in fields(TinyDraftConfig)})
    out, meta, reused = ensure_tiny_draft(
        args.target, cfg, args.out, force=args.force, progress=args.progress
    )
    print(f"{'reused' if reused else 'built'} tiny draft: {out}")
    print(
        f"  {meta['parameters'] / 1e6:.2f}M parameters, {meta['steps']} steps, held-out loss "
        f"{meta['heldout_loss']:.3f} nats/token, built in {meta['build_seconds']} s, for {meta['target']['path']}"
    )
    return 0
