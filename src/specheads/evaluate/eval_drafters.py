"""The options every command that decodes with heads takes alike (`--tree`, `--draft-vocab`,
`--recalibrate`), and compare's trees per heads directory. The drafters themselves are built on the decode
floor (decode/drafter_factory.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from specheads.decode.drafter_factory import EAGLE_TOTAL_TOKENS, tree_by_default
from specheads.decode.trees import DEFAULT_TREES
from specheads.heads.method import Method


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


def trees_for(
    trees: list[str] | None, heads_methods: list[str], calibrates: bool, *, methods: Mapping[str, Method]
) -> list[str | None]:
    """`compare --tree`: one name for every heads directory, one each, or none: each one's default (its
    method's entry in `methods`)."""
    if trees:
        return trees * len(heads_methods) if len(trees) == 1 else list(trees)
    return [tree_by_default(method, calibrates, methods=methods) for method in heads_methods]
