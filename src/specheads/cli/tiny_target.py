"""`specheads tiny-target [--out DIR]`: build the embedded default target offline (builders/tiny_target.py)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from specheads.builders.tiny_target import (
    TinyTargetConfig,
    default_output_dir,
    ensure_tiny_target,
    greedy_sample,
)
from specheads.cli.threads import add_threads_argument
from specheads.core.run_folder import check_writable


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", type=Path, default=None, help="output directory (default: the user cache, reused when valid)"
    )
    p.add_argument(
        "--minutes", type=float, default=TinyTargetConfig.minutes, help="training budget (converted to steps)"
    )
    p.add_argument("--steps", type=int, default=None, help="exact optimizer steps (overrides --minutes)")
    p.add_argument("--seed", type=int, default=TinyTargetConfig.seed)
    p.add_argument("--force", action="store_true", help="rebuild even if a valid build exists")
    p.add_argument("--no-sample", action="store_true", help="skip the greedy sample printed at the end")
    for f in fields(TinyTargetConfig):
        if f.name not in ("seed", "minutes", "steps"):
            flag = "--" + f.name.replace("_", "-")
            p.add_argument(
                flag,
                type=float if isinstance(f.default, float) else int,
                default=f.default,
                help=argparse.SUPPRESS,
            )
    add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    if args.minutes <= 0 or (args.steps is not None and args.steps <= 0):
        raise SystemExit("specheads tiny-target: error: --minutes and --steps must be positive")
    cfg = TinyTargetConfig(**{f.name: getattr(args, f.name) for f in fields(TinyTargetConfig)})
    check_writable(
        args.out if args.out is not None else default_output_dir(cfg)
    )  # before minutes of training
    out, meta, reused = ensure_tiny_target(cfg, args.out, force=args.force)
    print(f"{'reused' if reused else 'built'} tiny target: {out}")
    print(
        f"  {meta['parameters'] / 1e6:.2f}M parameters, {meta['steps']} steps, "
        f"held-out loss {meta['heldout_loss']:.3f} nats/token "
        f"({meta['heldout_bits_per_char']:.3f} bits/char), built in {meta['build_seconds']} s"
    )
    if not args.no_sample:
        name, prompt, continuation = greedy_sample(out)
        print(f"  greedy continuation of held-out {name}:\n{prompt}\u2502{continuation}")
    return 0
