"""`specheads train RECIPE.yaml [key=value ...]`: train draft heads (train/loop.py does the work).

specheads train recipes/tiny/medusa.yaml max_steps=200
accelerate launch --config_file recipes/accelerate/ddp.yaml -m specheads.train recipes/tiny/medusa.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specheads.cli.target_flags import add_trust_remote_code_argument
from specheads.cli.threads import add_threads_argument
from specheads.methods import method_named, methods
from specheads.train.distributed import end_launched_process
from specheads.train.loop import train
from specheads.train.recipe import load_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", type=Path, help="YAML recipe (recipes/...)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="recipe values to override")
    p.add_argument(
        "--overwrite", action="store_true", help="delete another run's results in output_dir and start afresh"
    )
    p.add_argument(
        "--allow-target-mismatch",
        action="store_true",
        help="resume a checkpoint trained against other target weights (same as allow_target_mismatch=true)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="train even where the memory estimate printed first exceeds what the device has available",
    )
    add_trust_remote_code_argument(p)
    p.add_argument("--no-progress", action="store_true")
    add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    code = train_and_report(args)
    end_launched_process(code)  # a process of a multi-process launch ends here, its files written
    return code


def train_and_report(args: argparse.Namespace) -> int:
    from accelerate import PartialState  # lazy: accelerate is only needed once a run starts

    cfg = load_config(args.recipe, args.overrides, methods=methods())
    cfg.allow_target_mismatch |= args.allow_target_mismatch
    cfg.trust_remote_code |= args.trust_remote_code
    summary = train(
        cfg,
        method_named(cfg.method),
        progress=not args.no_progress,
        overwrite=args.overwrite,
        force=args.force,
    )
    stopped = summary["exit_code"]  # 0, or 128 + the signal that stopped it
    if not PartialState().is_main_process:
        return stopped
    if not summary["completed"]:
        print(
            f"stopped by {summary['stopped_by']} after step {summary['last_step']} of "
            f"{cfg.max_steps}; checkpoint written to {cfg.output_dir}/checkpoints; continue with: "
            f"specheads train {args.recipe} ... resume=auto"
        )
        return stopped  # unfinished: a scheduler or script must not take it for done
    ev = summary["eval"]
    if ev:
        accs = " ".join(f"{value:.3f}" for key, value in ev.items() if key.endswith("/top1"))
        per = method_named(cfg.method).metric_unit
        print(f"held-out top-1 per {per}: {accs}   tau_sim {ev['tau_sim']:.2f}")
    print(f"heads written to {cfg.output_dir} ({summary['wall_seconds']} s)")
    return 0
