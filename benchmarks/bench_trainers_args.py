"""benchmarks/bench_trainers.py's command line: every option, its default and what it means."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.bench_trainers_eagle import EAGLE_ABLATIONS, EAGLE_LR
from benchmarks.bench_trainers_jobs import RECIPES, ROOT
from benchmarks.bench_trainers_medusa import MEDUSA_ABLATIONS, MEDUSA_LR
from benchmarks.bench_trainers_modelopt import EAGLE3_ABLATIONS, MODELOPT_VARIANTS, joined_help

# --eval-prompts' default per target
EVAL_PROMPTS = {"tiny": 12, "smollm2": 32}


def with_target_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed command line with the defaults that depend on --target filled in."""
    if args.eval_prompts is None:
        args.eval_prompts = EVAL_PROMPTS[args.target]
    return args


def arg_parser(description: str = "") -> argparse.ArgumentParser:
    """bench_trainers.py's options (`description`: its first line)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--target",
        default="tiny",
        choices=sorted(RECIPES),
        help="the target both sides train on, for every method: tiny (data windows of its training files, tau "
        "on its held-out files) or smollm2 (data the target's own answers to the project's seed prompts, tau "
        "on MT-Bench)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where both sides train and decode: cpu (fp32), or cuda (EAGLE-3 only: training in bf16 as each "
        "recipe's GPU settings have it, torch.compile off for both; decoding in fp32, so outputs must still "
        "equal generate()'s)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-trainers", help="work directory")
    p.add_argument(
        "--report", type=Path, default=ROOT / "runs" / "bench-trainers" / "report", help="JSON, table, PNG"
    )
    p.add_argument("--rows", type=int, default=16, help="conversations (N) for EAGLE")
    p.add_argument(
        "--medusa-rows", type=int, default=128, help="conversations for Medusa (the first N of the same)"
    )
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--answer-tokens", type=int, default=64)
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--eagle-epochs", default="11,21", help="learning-curve budgets (states main.py saves)")
    p.add_argument("--medusa-epochs", default="2,6")
    p.add_argument("--eagle3-rows", type=int, default=32, help="conversations for EAGLE-3 (the first N)")
    p.add_argument("--eagle3-epochs", default="10", help="modelopt's num_train_epochs (each trained afresh)")
    p.add_argument("--eagle3-batch", type=int, default=4, help="both trainers' batch (modelopt's recipe: 1)")
    p.add_argument(
        "--modelopt-variants",
        default="defaults,lr 1e-3+warmup 10%",
        help=joined_help("modelopt's recipe ('defaults') and with some of our settings", MODELOPT_VARIANTS),
    )
    p.add_argument(
        "--eagle-lrs", default=f"{EAGLE_LR:g},1e-3", help="eagle-llm --lr values (its default first)"
    )
    p.add_argument(
        "--medusa-lrs",
        default=f"{MEDUSA_LR:g}",
        help="medusa-llm --learning_rate values, one run each per peer seed (its README's first)",
    )
    p.add_argument("--eagle-tree", default="dynamic", help="EAGLE and EAGLE-3")
    p.add_argument("--medusa-tree", default="medusa-31")
    p.add_argument(
        "--eval-prompts",
        type=int,
        help="prompts tau is measured on (default: the tiny target's 12 held-out files, SmolLM2's 32 MT-Bench "
        "first turns; 8 were too few to judge a difference of 2%%: benchmarks/records/eagle3-smollm2/2026-12-05-eval32)",
    )
    p.add_argument("--eval-new-tokens", type=int, default=48)
    p.add_argument("--our-eval-batches", type=int, default=2, help="our trainer's end-of-run held-out loss")
    p.add_argument(
        "--methods", default="eagle,medusa,eagle3", help="the others' rows are kept from --report's JSON"
    )
    p.add_argument("--seeds", default="0,1,2", help="our trainer's seeds: one run each")
    p.add_argument(
        "--peer-seeds", default="0,1,2", help="medusa-llm's --seed, modelopt's training.seed: one run each"
    )
    p.add_argument(
        "--medusa-ablations",
        default="",
        help=joined_help("ours at the largest Medusa budget with medusa-llm's settings", MEDUSA_ABLATIONS),
    )
    p.add_argument(
        "--eagle-ablations",
        default="",
        help=joined_help("ours at the largest EAGLE budget with other settings", EAGLE_ABLATIONS),
    )
    p.add_argument(
        "--eagle3-ablations",
        default="",
        help=joined_help("ours at the largest EAGLE-3 budget with modelopt's settings", EAGLE3_ABLATIONS),
    )
    p.add_argument(
        "--ablations-only",
        "--medusa-ablations-only",  # the names older recorded commands use
        "--eagle3-ablations-only",
        dest="ablations_only",
        action="store_true",
        help="at a method's largest budget, ours with that method's --*-ablations only, not the recipe as it "
        "is (its rows merged from another run's report: --render --merge); a method given no ablations "
        "runs its recipe as usual",
    )
    p.add_argument(
        "--ours-offline",
        action="store_true",
        help="ours also in offline mode at every budget and seed, a line 'specheads (offline)': `specheads "
        "cache` (the target's hidden states once, bf16) then `train mode=offline`, both in its wall time, as "
        "eagle-llm's ge_data stage is in its",
    )
    p.add_argument(
        "--ours-first",
        action="store_true",
        help="at each seed (EAGLE: before eagle-llm's one run) ours before the peer; run two benches side by side, "
        "one with it, so neither trainer always starts while the other bench is still preparing",
    )
    p.add_argument("--seed", type=int, default=0, help="the data's")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument(
        "--render", action="store_true", help="only redraw --report's table and plot from its JSON"
    )
    p.add_argument(
        "--merge",
        type=Path,
        action="append",
        default=[],
        help="with --render: add the measured rows of this bench_trainers.json (another run's, e.g. more "
        "seeds run beside it) to --report's, recording its command",
    )
    return p
