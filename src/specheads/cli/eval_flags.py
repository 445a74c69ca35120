"""The flags `specheads eval` and `specheads compare` share, defined once: both decode prompts with heads
against the target and write a results folder, so the target, the results folder, the prompt selection and
how the target is loaded read the same in both (`--tree`, `--draft-vocab` and `--recalibrate` too, which the
batched benchmark takes as well)."""

from __future__ import annotations

import argparse

from specheads.cli.target_flags import (
    add_chat_template_arguments,
    add_device_map_argument,
    add_trust_remote_code_argument,
)
from specheads.cli.threads import add_threads_argument
from specheads.core.target import DTYPES
from specheads.decode.drafter_factory import EAGLE_TOTAL_TOKENS
from specheads.decode.trees import DEFAULT_TREES


def add_target_argument(p: argparse.ArgumentParser) -> None:
    """--target, required: the model the heads draft for."""
    p.add_argument(
        "--target",
        required=True,
        help='HF directory or hub id of the target, or a named one ("tiny", "smollm2")',
    )


def add_overwrite_argument(p: argparse.ArgumentParser) -> None:
    """--overwrite: what replacing a results folder costs, and when the old results go."""
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the results --out holds (refused without it): once every input is checked and --out "
        "locked, they are set aside, and go when the new run has kept its first prompt (an error before "
        "that puts them back)",
    )


def add_prompt_filter_arguments(p: argparse.ArgumentParser) -> None:
    """--num-prompts and --category: which of the prompt set's prompts run."""
    p.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default: all)")
    p.add_argument("--category", default=None, help="only questions of this category")


def add_target_loading_arguments(p: argparse.ArgumentParser, defaults: type, attn_help: str) -> None:
    """--dtype, --device, --attn and --trust-remote-code, their defaults those of the options class
    `defaults`; `attn_help` opens --attn's help."""
    p.add_argument("--dtype", default=defaults.dtype, choices=[*sorted(DTYPES), "auto"])
    p.add_argument("--device", default=defaults.device, help="cpu (default) or cuda[:i]")
    p.add_argument(
        "--attn",
        default=defaults.attn,
        choices=["auto", "sdpa", "eager"],
        help=f"{attn_help}; auto: sdpa, or eager where transformers refuses sdpa",
    )
    add_trust_remote_code_argument(p)


def add_tree_argument(parser, *, per_heads: bool = False, auto: bool = False) -> None:
    """`--tree`, as every command that decodes with heads takes it (eval, compare, the batched benchmark).

    A name is one of DEFAULT_TREES or chain-K (a static tree, cut to the heads' depth), dynamic[-N] for EAGLE heads
    (EAGLE-2, N nodes), or, where `auto`, auto (calibrate.py); `drafter_for` reads it. `per_heads`: one
    name for every --heads directory or one each.
    """
    help = (
        f"draft tree: one of {', '.join(sorted(DEFAULT_TREES))} or chain-K (K deep, one node a depth), cut to "
        "the heads' depth (default for "
        "Medusa: medusa-15 for <= 2 heads, -31 for 3, -63 for more); for EAGLE heads also dynamic[-N] "
        f"(EAGLE-2, N nodes; N={EAGLE_TOTAL_TOKENS} when not given)"
    )
    if auto:
        help += (
            "; or auto: the size with the most expected tokens/s, measured here on --calibration-prompts "
            "(evaluate/calibrate.py), which it holds out; EAGLE heads take it by default where the run can "
            f"calibrate (greedy, batch 1, prompts enough to hold some out), else dynamic-{EAGLE_TOTAL_TOKENS}; "
            "a calibration is kept per machine and reused (--recalibrate measures again)"
        )
    if per_heads:
        help += "; one name for every --heads directory, or one each"
    parser.add_argument("--tree", nargs="*" if per_heads else None, default=None, help=help)


def add_draft_vocab_argument(parser) -> None:
    """`--draft-vocab N`, as `eval` and `compare` take it (`draft_vocab_ids`, the drafters' `vocab`)."""
    parser.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        help="EAGLE-1/2 and Medusa heads propose from the N tokens that were labels most often in their "
        "training (its label_counts.safetensors; FR-Spec), each level projecting onto N rows of the "
        "lm_head, --tree auto's candidates too; lossless as ever (default: the whole vocabulary; EAGLE-3 "
        "heads keep their own)",
    )


def add_recalibrate_argument(parser) -> None:
    """`--recalibrate`, as `eval` and `compare` take it (evaluate/calibration_cache.py)."""
    parser.add_argument(
        "--recalibrate",
        action="store_true",
        help="--tree auto: measure the trees afresh, even where an earlier run on this machine calibrated "
        "the same heads, target, prompts and settings (its choice is kept in the specheads cache, "
        "calibrations/, and taken by default); the new calibration replaces it",
    )


def add_question_arguments(p: argparse.ArgumentParser, prompt_tokens: int, files: str) -> None:
    """--prompts and how the questions become prompts: the filters, raw text or a chat template, and
    `files`: how many tokens of each file prompt are taken."""
    p.add_argument(
        "--prompts",
        required=True,
        help="mt-bench, spec-bench, a .jsonl of such questions, `heldout` (the target's "
        "heldout_files.json), or a .json file list in that format",
    )
    add_prompt_filter_arguments(p)
    p.add_argument("--no-chat-template", action="store_true", help="questions as raw text, not chat turns")
    add_chat_template_arguments(p, "the questions are")
    p.add_argument("--prompt-tokens", type=int, default=prompt_tokens, help=files)


def add_tree_arguments(p: argparse.ArgumentParser, *, per_heads: bool, calibrated_on: str) -> None:
    """--tree (with auto), --calibration-prompts (`calibrated_on`: what of the held-out prompts calibrates),
    --recalibrate and --draft-vocab."""
    add_tree_argument(p, per_heads=per_heads, auto=True)
    p.add_argument(
        "--calibration-prompts",
        type=int,
        default=None,
        help=f"--tree auto: calibrate on {calibrated_on}the last K prompts of --prompts, which are then not "
        "decoded for the results (default 4); --num-prompts counts the rest",
    )
    add_recalibrate_argument(p)
    add_draft_vocab_argument(p)


def add_run_arguments(p: argparse.ArgumentParser, defaults: type, attn_help: str) -> None:
    """How the target loads and where (dtype, device, attention, --device-map), --no-progress, --threads."""
    add_target_loading_arguments(p, defaults, attn_help)
    add_device_map_argument(p, "--device")
    p.add_argument("--no-progress", action="store_true")
    add_threads_argument(p)
