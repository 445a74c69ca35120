"""Calibrated trees for `specheads eval --tree auto`: the tree size that decodes fastest on this machine.

What a candidate tree is worth, and how its τ is replayed exactly for Medusa and EAGLE-2 trees, is the
decode floor's (decode/calibrate.py, decode/calibrate_dynamic.py): each method's `calibrate` gives its
candidates. Here the candidates are timed, the fastest is chosen, and the choice is kept for a resumed run
and for later runs on this machine (evaluate/calibration_cache.py).

Timings interleave the candidates (round robin over the repeats), so a change in the machine's speed while
they run touches every candidate alike, and each keeps the fastest of its repeats after an untimed one: other
processes only ever slow a run down, so the fastest is the least disturbed (`timeit`'s advice; on a shared
machine the median of a few runs drifts by tens of percent between candidates of equal cost).
A draft costs at most what a deeper or larger one costs: EAGLE-2 growth stops once nothing below its
frontier can be kept (`dynamic_tree`, "stop"), so a small tree may grow fewer levels than its depth, and
Medusa runs every head whatever it keeps. Each candidate takes the fastest draft measured among those at
least as deep and as large (`timed`), and EAGLE-2 drafters of depth 1 are timed once (`step_timing.same_work`). The
target step is timed at every size tried (8 at most): it is a few percent of a calibration, and interpolating
it would miss the knee of the forward's cost curve.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.calibrate import CalibrationSettings, Candidate, choose
from specheads.decode.drafter_factory import drafter_for
from specheads.decode.drafters import Drafter
from specheads.evaluate.calibration_cache import calibration_key, read_cached, write_cached
from specheads.evaluate.progress import Progress
from specheads.evaluate.step_timing import Timer, measured_timer
from specheads.heads.method import Method

CALIBRATION_PROMPTS = 4  # prompts held out for calibration unless told otherwise


def timed(candidates: list[Candidate], timer: Timer) -> list[Candidate]:
    """The candidates with their step and draft seconds, measured together by `timer`.

    A draft does no more work than one at least as deep and as large (EAGLE-2 stops growing once nothing
    below can be kept, so a deeper or larger tree grows at least the same levels; Medusa runs every head
    whatever it keeps), so each candidate takes the fastest draft measured among those: on a shared machine
    other processes only slow a timing down.
    """
    steps, drafts = timer.measure([c.tree["nodes"] for c in candidates], [c.drafter for c in candidates])
    shapes = [(c.tree["depth"], c.tree["nodes"]) for c in candidates]
    for candidate, step, (depth, nodes) in zip(candidates, steps, shapes):
        candidate.step_seconds = step
        candidate.draft_seconds = min(
            draft for (d, n), draft in zip(shapes, drafts) if d >= depth and n >= nodes
        )
    return candidates


def hold_out(prompts: list, count: int | None = None) -> tuple[list, list]:
    """(calibration prompts, evaluation prompts): the last `count` prompts (CALIBRATION_PROMPTS when None)
    are kept for calibration."""
    count = CALIBRATION_PROMPTS if count is None else count
    if not 1 <= count < len(prompts):
        raise ValueError(
            f"--calibration-prompts {count} keeps the last {count} prompts out of the evaluation, but --prompts "
            f"gives {len(prompts)}: at least one must be calibrated and one evaluated"
        )
    return prompts[-count:], prompts[:-count]


def holds_out(prompts: int, count: int | None, wanted: int | None) -> bool:
    """Whether `hold_out` of `count` prompts (CALIBRATION_PROMPTS when None) out of `prompts` leaves `wanted`
    (--num-prompts; None: one) to evaluate: a default `--tree auto` needs it, or the fixed default stands."""
    return prompts - (CALIBRATION_PROMPTS if count is None else count) >= (wanted or 1)


# -- `--tree auto` -------------------------------------------------------------------------------------


def max_tree_depth(
    heads: torch.nn.Module,
    config: dict[str, Any],
    settings: CalibrationSettings,
    *,
    methods: Mapping[str, Method],
) -> int:
    """The deepest tree the calibration may try or choose (for the prompt-length check): the heads' method's
    `max_tree_depth` (its entry in `methods`)."""
    return method_of(config, methods).max_tree_depth(heads, settings)


def method_of(config: dict[str, Any], methods: Mapping[str, Method]) -> Method:
    """The entry of the checkpoint's method (its config.json's "method") in `methods`."""
    name = config.get("method")
    if name not in methods:
        raise ValueError(f"method must be one of {tuple(methods)}, got {name!r}")
    return methods[name]


def calibrated_drafter(
    heads: torch.nn.Module,
    config: dict[str, Any],
    target: FrozenTarget,
    prompts: Sequence[Any],
    settings: CalibrationSettings,
    timer: Timer | None = None,
    vocab: torch.Tensor | None = None,
    *,
    methods: Mapping[str, Method],
) -> tuple[Drafter, dict[str, Any], dict[str, Any]]:
    """`--tree auto`: measure candidate trees on the calibration prompts, keep the fastest.

    Args:
        config: the checkpoint's config.json; its method's `calibrate` (its entry in `methods`, the method
            table) measures.
        prompts: the calibration prompts (`hold_out`), each with an `id` and `input_ids` (1, T).
        timer: the timings; None measures them here (`step_timing.MeasuredTimer`).
        vocab: the draft vocabulary every candidate drafts over (`--draft-vocab`), None for the heads' own.

    Returns:
        The chosen tree's drafter, its record (as `drafter_for` returns), and results.json's "calibration":
        the prompts, settings, acceptance, every candidate's row (nodes, depth, τ, step and draft seconds,
        tokens/s) and the chosen tree.
    """
    begin = time.perf_counter()
    method = method_of(config, methods)
    if method.calibrate is None:
        raise ValueError(f"--tree auto has no calibration for heads of method {method.name!r}")
    ids = [p.input_ids for p in prompts]
    over = {} if vocab is None else {"vocab": vocab}
    candidates, acceptance, capture_layers, sequences = method.calibrate(heads, target, ids, settings, **over)
    timer = timer or measured_timer(target, capture_layers, sequences, settings.repeats)
    best = choose(timed(candidates, timer))
    record = {
        "prompts": {
            "which": f"the last {len(prompts)} of --prompts, held out of the evaluation",
            "ids": [p.id for p in prompts],
        },
        "settings": {**asdict(settings), "sizes": list(settings.sizes)},
        "draft_vocab": None if vocab is None else vocab.numel(),
        "timing": {
            "what": "fastest seconds of one target step (tree inputs, forward, greedy verify, compact) and of "
            "one draft, interleaved over the candidates, after an untimed round",
            "cache_length": getattr(timer, "start", None),
        },
        "acceptance": acceptance,
        "candidates": [c.row() for c in candidates],
        "chosen": best.tree,
        "seconds": time.perf_counter() - begin,
    }
    return best.drafter, best.tree, record


def calibrated_once(
    progress: Progress,
    key: str,
    heads: torch.nn.Module,
    config: dict[str, Any],
    target: FrozenTarget,
    prompts: Sequence[Any],
    settings: CalibrationSettings,
    vocab: torch.Tensor | None = None,
    reuse: bool = True,
    *,
    methods: Mapping[str, Method],
) -> tuple[Drafter, dict[str, Any], dict[str, Any]]:
    """`calibrated_drafter`, once per run and once per machine.

    The calibration is kept in the run's progress file under `key`: a resumed run rebuilds the tree chosen
    there instead of calibrating again (timings vary, so a second calibration may choose another tree, and
    the records already done were decoded with the first). It is also kept in the specheads cache
    (evaluate/calibration_cache.py), keyed on the heads, target, prompts, settings and machine: a later run
    with the same inputs takes its choice (its record then says `reused`), unless `reuse` is False
    (`--recalibrate`), which measures afresh and replaces it.
    Returns as `calibrated_drafter`."""
    calibration = progress.kept.get(key)
    if calibration is None:
        cache_key = calibration_key(heads, config, target, prompts, settings, vocab)
        calibration = read_cached(cache_key) if reuse else None
        if calibration is None:
            print(
                f"--tree auto: calibrating {config.get('method')}'s tree on {len(prompts)} held-out prompts "
                "(tens of seconds on the tiny target, minutes on a real one; kept for later runs on this machine)",
                flush=True,
            )
            drafter, tree, calibration = calibrated_drafter(
                heads, config, target, prompts, settings, vocab=vocab, methods=methods
            )
            try:
                write_cached(cache_key, calibration)
            except OSError as error:  # a read-only cache costs the next run a calibration, not this run
                print(f"specheads: the calibration was not kept for later runs: {error}", file=sys.stderr)
            progress.keep(key, calibration)
            return drafter, tree, progress.kept[key]  # as it reads back on resume (tuples become lists)
        print(
            f"--tree auto: taking the {calibration['chosen']['name']} tree an earlier run calibrated on this "
            f"machine ({calibration['reused']['from']}; --recalibrate measures again)",
            flush=True,
        )
        progress.keep(key, calibration)
    drafter, tree = drafter_for(heads, config, target, calibration["chosen"], vocab, methods=methods)
    return drafter, tree, calibration


def calibration_note(results: dict[str, Any], where: str = "results.json: calibration") -> str:
    """report.md's line on a calibrated tree: `results` holds its "tree" and "calibration", found at `where`."""
    calibration, tree = results["calibration"], results["tree"]
    best = next(row for row in calibration["candidates"] if row["name"] == tree["name"])
    return (
        f"- tree `{tree['name']}` chosen by `--tree auto` out of {len(calibration['candidates'])} candidates, "
        f"calibrated on {len(calibration['prompts']['ids'])} held-out prompts: expected τ "
        f"{best['accept_length']:.2f}, step {best['step_seconds'] * 1e3:.2f} ms + draft "
        f"{best['draft_seconds'] * 1e3:.2f} ms, {best['tokens_per_second']:.1f} tokens/s "
        f"({where}){reused_note(calibration)}.\n"
    )


def reused_note(calibration: dict[str, Any]) -> str:
    """ ", taken from ..." for a calibration an earlier run made on this machine (calibration_cache.py)."""
    reused = calibration.get("reused")
    if not reused:
        return ""
    return f"; taken from the calibration an earlier run kept in {reused['from']} (`--recalibrate` measures again)"
