"""`specheads tiny-draft --target T [--data DIR]`: a small draft model in the target's tokens, for assisted
generation (builders/tiny_draft.py).

    specheads tiny-draft --target tiny                       trained on the tiny target's corpus
    specheads tiny-draft --target smollm2 --data DIR ...     distilled from the target's answers in DIR,
                                                             `specheads distill --target smollm2` outputs
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from specheads.builders.named_targets import resolve_target
from specheads.builders.tiny_draft import DistilledDraftConfig, TinyDraftConfig, ensure_tiny_draft
from specheads.builders.tiny_target import read_meta as read_target_meta
from specheads.cli.threads import add_threads_argument

# The model and schedule knobs of both configs, as hidden flags (tests and tuning); None: the config's default.
KNOBS = {f.name: f for cfg in (TinyDraftConfig, DistilledDraftConfig) for f in fields(cfg)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        required=True,
        help="the target: a named one (tiny, smollm2) or its HF directory (its tokenizer is used)",
    )
    p.add_argument(
        "--data",
        type=Path,
        nargs="+",
        default=None,
        help="`specheads distill` outputs of the target's answers to distill the draft from, one or several "
        "(read in the order given; the last rows held out), needed for any target but the tiny one, whose "
        "draft otherwise learns its corpus",
    )
    p.add_argument(
        "--partial",
        action="store_true",
        help="--data may be unfinished `specheads distill` folders (ones a time limit stopped): the draft "
        "learns from their finished chunks",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output directory (default: the user cache, reused when valid)"
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"optimizer steps (default {TinyDraftConfig.steps}, distilled {DistilledDraftConfig.steps})",
    )
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--force", action="store_true", help="rebuild even if a valid build exists")
    p.add_argument(
        "--device", default="cpu", help="where a distilled draft trains: cpu (default) or cuda[:i]"
    )
    p.add_argument("--no-progress", dest="progress", action="store_false")
    for name, f in KNOBS.items():
        if name not in ("seed", "steps"):
            flag = "--" + name.replace("_", "-")
            kind = (
                (lambda v: v.lower() in ("1", "true", "yes")) if f.type in (bool, "bool") else type(f.default)
            )
            p.add_argument(flag, type=kind, default=None, help=argparse.SUPPRESS)
    add_threads_argument(p)


def draft_config(args: argparse.Namespace) -> TinyDraftConfig | DistilledDraftConfig:
    """The config of the draft asked for: the given knobs over its defaults; a knob of the other kind is
    an error."""
    kind = TinyDraftConfig if args.data is None else DistilledDraftConfig
    ours = {f.name for f in fields(kind)}
    given = {name: getattr(args, name) for name in KNOBS if getattr(args, name) is not None}
    if stray := sorted(set(given) - ours):
        flags = ", ".join("--" + n.replace("_", "-") for n in stray)
        raise SystemExit(
            f"specheads tiny-draft: error: {flags} {'is' if len(stray) == 1 else 'are'} not a setting of a "
            f"{'corpus' if args.data is None else 'distilled'} draft"
        )
    return kind(**given)


def run(args: argparse.Namespace) -> int:
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"specheads tiny-draft: error: --steps must be >= 1, got {args.steps}")
    cfg = draft_config(args)
    if args.partial and args.data is None:
        raise SystemExit("specheads tiny-draft: error: --partial is for --data, a `specheads distill` folder")
    if args.device != "cpu" and args.data is None:
        raise SystemExit(
            "specheads tiny-draft: error: --device is for a distilled draft (--data); the corpus draft trains on the cpu"
        )
    target = Path(resolve_target(args.target, progress=args.progress)).expanduser()
    if args.data is None and target.is_dir() and read_target_meta(target) is None:
        raise SystemExit(
            f"specheads tiny-draft: error: --target {args.target} is not the tiny target (no tiny-target build record in {target}); "
            "its draft is distilled from its own answers: pass --data DIR, a `specheads distill "
            f"--target {args.target} --out DIR` output"
        )
    out, meta, reused = ensure_tiny_draft(
        target,
        cfg,
        args.out,
        force=args.force,
        progress=args.progress,
        data=args.data,
        device=args.device,
        partial_data=args.partial,
    )
    print(f"{'reused' if reused else 'built'} tiny draft: {out}")
    agreement = f", top-1 {meta['heldout_top1']:.3f}" if "heldout_top1" in meta else ""
    print(
        f"  {meta['parameters'] / 1e6:.2f}M parameters, {meta['steps']} steps, held-out loss "
        f"{meta['heldout_loss']:.3f} nats/token{agreement}, built in {meta['build_seconds']} s, "
        f"for {meta['target']['path']}"
    )
    return 0
