"""`specheads compare --target DIR --heads DIR ... --prompts FILE --out DIR`: heads beside generate(), prompt
lookup and assisted generation. This module parses the flags into `CompareOptions` (evaluate/options.py);
the run itself is the library's `compare_heads` (evaluate/compare.py). `accelerate launch --num_processes N -m
specheads compare ...` shares the conversations out over N processes (one report, as one process writes it)."""

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
from specheads.evaluate.answers import ANSWERS_DIR
from specheads.evaluate.compare import compare_heads
from specheads.evaluate.evaluate import REPORT_FILE, RESULTS_FILE
from specheads.evaluate.options import CompareOptions
from specheads.evaluate.peers import BASELINE, PEERS
from specheads.methods import methods


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_argument(p)
    p.add_argument(
        "--heads", nargs="*", default=[], help="native head checkpoint directories (any methods, any number)"
    )
    add_overwrite_argument(p)
    p.add_argument("--out", required=True, type=Path, help="directory for results, report, plots, answers")
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on from the conversations a stopped run kept in --out's progress.jsonl (a re-run with the "
        "same settings on a folder holding only that file resumes too; other settings are refused)",
    )
    p.add_argument(
        "--peers",
        default=None,
        help=f"comma-separated, from {', '.join(PEERS)} (default: generate,prompt-lookup, and assisted "
        f"when --draft-model is given); {BASELINE} always runs: speedups and identity are against it",
    )
    p.add_argument("--draft-model", default=None, help="HF directory of the assistant model (same tokenizer)")
    p.add_argument("--max-turns", type=int, default=None, help="ask at most N turns of each question")
    p.add_argument("--skip-long", action="store_true", help="skip prompts that outrun the target's positions")
    add_question_arguments(p, CompareOptions.prompt_tokens, "tokens taken from the start of each file")
    p.add_argument("--max-new-tokens", type=int, default=CompareOptions.max_new_tokens, help="per turn")
    add_tree_arguments(p, per_heads=True, calibrated_on="the first turns of ")
    p.add_argument(
        "--prompt-lookup-tokens",
        type=int,
        default=CompareOptions.prompt_lookup_tokens,
        help="prompt-lookup draft length N",
    )
    p.add_argument("--prompt-lookup-ngram", type=int, default=None, help="n-gram matched (transformers: 2)")
    p.add_argument(
        "--assistant-tokens",
        type=int,
        default=CompareOptions.assistant_tokens,
        help="assisted draft length (transformers' default 20)",
    )
    p.add_argument(
        "--assistant-confidence",
        type=float,
        default=CompareOptions.assistant_confidence,
        help="the assistant stops a draft early below this top probability (transformers' default 0.4; 0: never)",
    )
    p.add_argument(
        "--warmup", type=int, default=CompareOptions.warmup, help="untimed prompts every method decodes first"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--allow-target-mismatch",
        action="store_true",
        help="decode heads trained against other weights of the same shapes (a warning, not an error)",
    )
    add_run_arguments(p, CompareOptions, "attention implementation")


def run(args: argparse.Namespace) -> int:
    """`specheads compare`: the flags as CompareOptions, to the library (evaluate/compare.py)."""
    options = options_from(CompareOptions, args)
    procs = launched()  # one process unless started by accelerate launch / torchrun
    compare_heads(options, methods(), procs)
    if not procs.main:
        return 0
    print((options.out / REPORT_FILE).read_text(), end="")
    print(
        f"wrote {options.out / RESULTS_FILE}, {options.out / REPORT_FILE}, plots and {options.out / ANSWERS_DIR}/"
    )
    return 0
