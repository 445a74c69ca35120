"""`specheads eval --target DIR --heads DIR --prompts FILE --out DIR`: speculative decoding against the
target's own generate(). `accelerate launch --num_processes N -m specheads eval ...` shares the prompts out
over N processes (one report, as one process writes it). This module parses the flags into `EvalOptions` (evaluate/options.py); the run
itself is the library's `run_eval` (evaluate/run.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from specheads.cli.commands import options_from
from specheads.cli.eval_flags import (
    add_overwrite_argument,
    add_question_arguments,
    add_run_arguments,
    add_target_argument,
    add_tree_arguments,
)
from specheads.core.processes import launched
from specheads.evaluate.evaluate import REPORT_FILE, RESULTS_FILE, report_text
from specheads.evaluate.options import EvalOptions
from specheads.evaluate.progress import PROGRESS_FILE
from specheads.evaluate.run import run_eval
from specheads.methods import methods

D = EvalOptions  # the defaults


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_argument(p)
    p.add_argument(
        "--heads", required=True, help="native head checkpoint directory (its config.json names the method)"
    )
    add_overwrite_argument(p)
    p.add_argument(
        "--allow-target-mismatch",
        action="store_true",
        help="evaluate heads whose recorded target weights fingerprint differs from --target's",
    )
    p.add_argument("--out", required=True, type=Path, help="directory for results.json and report.md")
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"go on from the prompts a stopped run kept in --out's {PROGRESS_FILE} (a re-run with the same "
        "settings on a folder holding only that file resumes too; other settings are refused)",
    )
    add_question_arguments(p, D.prompt_tokens, "tokens taken from the start of each file prompt")
    p.add_argument("--max-new-tokens", type=int, default=D.max_new_tokens)
    add_tree_arguments(p, per_heads=False, calibrated_on="")
    p.add_argument(
        "--temperature",
        type=float,
        default=D.temperature,
        help="0 (default): greedy, checked token for token against generate(do_sample=False); > 0: both "
        "sample, the decoder losslessly, the baseline with generate(do_sample=True, ...)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=D.top_k,
        help="sampling: keep the k most likely tokens (0, the default: all)",
    )
    p.add_argument(
        "--top-p", type=float, default=D.top_p, help="sampling: nucleus mass kept (default 1.0: all)"
    )
    p.add_argument(
        "--seed", type=int, default=D.seed, help="sampling: prompt (or batch) i is sampled with seed + i"
    )
    p.add_argument("--warmup", type=int, default=D.warmup, help="untimed prompts decoded first")
    p.add_argument(
        "--batch-size",
        type=int,
        default=D.batch_size,
        help="decode the prompts B at a time, left-padded, against the target's own batched generate "
        "(with --temperature, batch i sampled with seed + i; each prompt's seconds are its batch's, shared "
        "evenly)",
    )
    add_run_arguments(p, D, "the target's attention implementation")


def run(args: argparse.Namespace) -> int:
    """`specheads eval`: the flags as EvalOptions, to the library (evaluate/run.py)."""
    options = options_from(EvalOptions, args)
    procs = launched()  # one process unless started by accelerate launch / torchrun
    results = run_eval(options, methods(), procs)
    if not procs.main:
        return 0
    print(report_text(results), end="")
    print(f"wrote {options.out / RESULTS_FILE} and {options.out / REPORT_FILE}")
    return 0
