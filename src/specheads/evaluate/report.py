"""The figures `specheads eval` reports, and its report.md.

Every figure is taken over all prompts together (totals, then one ratio), never as a mean of
per-prompt ratios, so a long output weighs by its tokens. DEFINITIONS is written into results.json.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from specheads.decode.step import PHASES
from specheads.evaluate.calibrate import calibration_note
from specheads.version import __version__

DEFINITIONS = {
    "step": "one speculative step: one target forward over a draft tree",
    "accept_length": "tokens one step emits: accepted draft tokens + the bonus token (cut where the output stopped)",
    "mean_accept_length": "tau = total accept lengths / total steps over all prompts (bonus included; 1.0 = "
    "autoregressive); each prompt's first token comes from prefill, not a step",
    "accept_rate_per_depth": "[d-1] = fraction of all steps that accepted at least d draft tokens "
    "(accept length >= d + 1), d = 1 .. tree depth",
    "tokens_per_second": "total new tokens / total wall seconds of the decoder's generate calls (prefill included)",
    "baseline_tokens_per_second": "the same for the target's own generate() with the same settings (results.json's "
    "sampling.baseline: generate(do_sample=False) when greedy)",
    "speedup": "tokens_per_second / baseline_tokens_per_second (same prompts, same machine, same run)",
    "identical_to_baseline": "prompts whose output equals the baseline's token for token / prompts; "
    "null when sampling",
    "step_phase_fraction": "each phase's share of the decoder's time after prefill (draft, tree_inputs, "
    "tree_forward, verify, compact; rest: what no phase covers), summed over all prompts; null for methods "
    "transformers runs",
    "outside_forward_fraction": "1 - step_phase_fraction.tree_forward: the share of the steps' time spent "
    "outside the target's forward",
    "draft_vocab_coverage": "new tokens that lie in the draft's vocabulary / new tokens (an EAGLE-3 head's "
    "own, or --draft-vocab's); null when the draft proposes from the whole vocabulary. No token outside it is "
    "ever drafted, so a step whose next token lies outside accepts no draft token",
}


def summarize(records: list[dict[str, Any]], tree_depth: int) -> dict[str, Any]:
    """The headline figures over `records` (see DEFINITIONS; τ is None when no step ran).

    accept_rate_per_depth[d-1], for d = 1 .. tree_depth, is the fraction of all steps that accepted at
    least d draft tokens, i.e. whose accept length is at least d + 1. It never grows with d, and
    τ = 1 + Σ_d accept_rate_per_depth[d-1] (a step of accept length n counts at depths 1 .. n-1).
    """
    accept_lengths = [n for r in records for n in r["accept_lengths"]]
    steps = len(accept_lengths)
    seconds = sum(r["seconds"] for r in records)
    baseline_seconds = sum(r["baseline_seconds"] for r in records)
    new_tokens = sum(r["new_tokens"] for r in records)
    baseline_new_tokens = sum(r["baseline_new_tokens"] for r in records)
    tokens_per_second = new_tokens / seconds if seconds > 0 else None
    baseline_tokens_per_second = baseline_new_tokens / baseline_seconds if baseline_seconds > 0 else None
    flags = [r["identical_to_baseline"] for r in records]  # None: sampled, not comparable
    identical = None if None in flags else f"{sum(flags)}/{len(records)}"
    return {
        "mean_accept_length": sum(accept_lengths) / steps if steps else None,
        "accept_rate_per_depth": [
            sum(n >= d + 1 for n in accept_lengths) / steps if steps else None
            for d in range(1, tree_depth + 1)
        ],
        "new_tokens": new_tokens,
        "baseline_new_tokens": baseline_new_tokens,
        "steps": steps,
        "seconds": seconds,
        "baseline_seconds": baseline_seconds,
        "tokens_per_second": tokens_per_second,
        "baseline_tokens_per_second": baseline_tokens_per_second,
        "speedup": (
            tokens_per_second / baseline_tokens_per_second
            if tokens_per_second and baseline_tokens_per_second
            else None
        ),
        "identical_to_baseline": identical,
        "draft_vocab_coverage": coverage(records),
        "num_prompts": len(records),
        **phase_figures(records),
    }


def coverage(records: list[dict[str, Any]]) -> float | None:
    """draft_vocab_coverage (DEFINITIONS) over the records; None unless every one counted its tokens in the
    draft's vocabulary ("in_draft_vocab") and some have new tokens."""
    counted = [r.get("in_draft_vocab") for r in records]
    new_tokens = sum(r["new_tokens"] for r in records)
    if not records or None in counted or not new_tokens:
        return None
    return sum(counted) / new_tokens


def phase_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """step_phase_fraction and outside_forward_fraction (DEFINITIONS) over the records that carry the
    decoder's "phase_seconds" (PHASES and "total", summed over a prompt's turns); None without any."""
    timed = [r["phase_seconds"] for r in records if r.get("phase_seconds")]
    if not timed:
        return {"step_phase_fraction": None, "outside_forward_fraction": None}
    totals = {p: sum(t.get(p, 0.0) for t in timed) for p in PHASES}
    return phase_shares(totals, sum(t["total"] for t in timed))


def phase_shares(phase_seconds: dict[str, float], seconds: float) -> dict[str, Any]:
    """Each phase's share of the steps' time, `seconds` (the decoder's, prefill included) less the prefill,
    with "rest" for what no phase covers; and the share outside the target's tree forward."""
    steps = max(seconds - phase_seconds.get("prefill", 0.0), 1e-12)
    phases = {p: phase_seconds.get(p, 0.0) for p in PHASES if p != "prefill"}
    phases["rest"] = max(steps - sum(phases.values()), 0.0)
    return {
        "step_phase_fraction": {p: t / steps for p, t in phases.items()},
        "outside_forward_fraction": 1 - phases["tree_forward"] / steps,
    }


def per_category(records: list[dict[str, Any]], tree_depth: int) -> dict[str, dict[str, Any]]:
    """summarize() per category, in order of first appearance; empty when no prompt has one."""
    categories = dict.fromkeys(r["category"] for r in records if r["category"] is not None)
    return {c: summarize([r for r in records if r["category"] == c], tree_depth) for c in categories}


# -- report.md --------------------------------------------------------------------------------------

_COLUMNS = ("τ", "outside forward", "tokens/s", "baseline tokens/s", "speedup", "identical")


def _row(first: list[str], figures: dict[str, Any]) -> str:
    cells = [
        *first,
        _num(figures["mean_accept_length"], 2),
        _percent(figures.get("outside_forward_fraction")),
        _num(figures["tokens_per_second"], 1),
        _num(figures["baseline_tokens_per_second"], 1),
        _num(figures["speedup"], 2, "x"),
        figures["identical_to_baseline"] or "–",
    ]
    return "| " + " | ".join(cells) + " |"


def _num(x: float | None, digits: int, unit: str = "") -> str:
    return "–" if x is None else f"{x:.{digits}f}{unit}"


def _percent(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.0f}%"


def _header(first: list[str]) -> list[str]:
    names = [*first, *_COLUMNS]
    return ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]


def render_report(results: dict[str, Any]) -> str:
    """report.md: the headline table, per-category rows when prompts have categories, the settings, and
    the command that reproduces the run."""
    tree, target = results["tree"], results["target"]
    lines = [f"# Speculative decoding: {results['method']} on {target['name_or_path']}", ""]
    lines += [
        *_header(["method", "prompts"]),
        _row([results["method"], str(results["num_prompts"])], results),
    ]
    if results["per_category"]:
        lines += ["", *_header(["category", "prompts"])]
        for name, figures in results["per_category"].items():
            lines.append(_row([name, str(figures["num_prompts"])], figures))
    rates = ", ".join(f"{d}: {_num(r, 2)}" for d, r in enumerate(results["accept_rate_per_depth"], 1))
    lines += [
        "",
        f"- τ: tokens per speculative step, bonus included (1.0 = autoregressive): "
        f"{results['new_tokens']} new tokens, {results['steps']} steps. Accept rate per depth: {rates}.",
        f"- speedup: tokens/s over the target's own `{results['sampling']['baseline']}`, same prompts, same run; "
        + (
            "identical: outputs equal to it token for token."
            if not results["sampling"]["do_sample"]
            else "identical is not measured: sampled outputs differ from it by chance."
        ),
        *coverage_lines(results),
        f"- tree `{tree['name']}` ({tree['nodes']} nodes, depth {tree['depth']}); heads `{results['heads']['path']}`; "
        f"prompts `{results['prompts']['source']}`; {results['max_new_tokens']} new tokens at most.",
        f"- {environment(results)}.",
        *reproduce(results),
    ]
    return "\n".join(lines)


def coverage_lines(results: dict[str, Any]) -> list[str]:
    """report.md's line on the draft vocabulary's coverage, per category where there are categories."""
    if results.get("draft_vocab_coverage") is None:
        return []
    parts = [f"{name} {_percent(f['draft_vocab_coverage'])}" for name, f in results["per_category"].items()]
    return [
        f"- draft vocabulary: {100 * results['draft_vocab_coverage']:.1f}% of the new tokens lie in it"
        + (f" ({', '.join(parts)})" if parts else "")
        + "; a step whose next token lies outside it accepts no draft token."
    ]


# -- draft figures (`specheads compare`) ------------------------------------------------------------

# The figures serving engines report beside τ, defined once. They read three lists per record, one entry
# per step (evaluate/peers.py, `Decoded`): accept_lengths, draft_sizes and draft_depths.
DRAFT_DEFINITIONS = {
    "acceptance_rate": "accepted draft tokens / proposed draft tokens over all steps, as vLLM's "
    "spec_decode draft acceptance rate (num_accepted_tokens / num_draft_tokens); accepted = accept length "
    "- 1 per step, proposed = every draft token the target verified (a chain's k, a tree's nodes below "
    "the root), so a wide tree lowers it even when τ is high",
    "per_position_acceptance": "accept_rate_per_depth; the same as vLLM's per-position acceptance rate "
    "(num_accepted_tokens_per_pos / num_drafts)",
    "draft_efficiency": "tokens emitted by steps / Σ over steps of (draft depth + 1): the share of the "
    "most each step could have emitted (its deepest draft path and the bonus token); vLLM v0's system "
    "efficiency, emitted / (steps × (k + 1)), when every step drafts a chain of k",
    "draft_tokens_per_step": "proposed draft tokens / steps (what each target forward verifies besides the root)",
    "deepest_draft": "the deepest any step's draft reached; accept_rate_per_depth is 0 past it by construction",
    "accept_length_counts": "[n-1] = steps that emitted n tokens (the distribution τ is the mean of)",
    "mean_accept_length (vLLM)": "1 + accepted / drafts in vLLM's terms: the same number as τ here",
}


def draft_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The DRAFT_DEFINITIONS figures over `records` (None where a ratio has nothing under it).

    Over a step: accepted = accept length - 1 (the bonus is not a draft token), proposed = its draft
    size, and the most it could emit = its draft depth + 1.
    """
    accept_lengths = [n for r in records for n in r["accept_lengths"]]
    sizes = [n for r in records for n in r["draft_sizes"]]
    depths = [n for r in records for n in r["draft_depths"]]
    accepted, proposed = sum(n - 1 for n in accept_lengths), sum(sizes)
    capacity = sum(d + 1 for d in depths)
    counts = [0] * max(accept_lengths, default=0)
    for n in accept_lengths:
        counts[n - 1] += 1
    return {
        "acceptance_rate": accepted / proposed if proposed else None,
        "draft_efficiency": sum(accept_lengths) / capacity if capacity else None,
        "accepted_draft_tokens": accepted,
        "proposed_draft_tokens": proposed,
        "draft_tokens_per_step": proposed / len(sizes) if sizes else None,
        "deepest_draft": max(depths, default=0),
        "accept_length_counts": counts,
    }


def first_mismatch(tokens: list[int], reference: list[int]) -> int | None:
    """The first index where `tokens` and `reference` differ (the shorter length if one is a prefix)."""
    mismatch = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), None)
    if mismatch is None and len(tokens) != len(reference):
        mismatch = min(len(tokens), len(reference))
    return mismatch


# -- report.md of `specheads compare` ---------------------------------------------------------------

_COMPARE_COLUMNS = (
    "τ",
    "accept rate",
    "draft eff.",
    "drafts/step",
    "outside forward",
    "tokens/s",
    "speedup",
    "identical",
)


def tokens_in(mask: torch.Tensor | None, tokens: list[int]) -> int | None:
    """How many of `tokens` the (V,) bool `mask` holds (a record's "in_draft_vocab"); None without a mask."""
    if mask is None:
        return None
    return int(mask[torch.tensor(tokens, dtype=torch.long, device=mask.device)].sum())


def prompt_record(
    prompt: Any,
    tokens: list[int],
    accept_lengths: list[int],
    seconds: float,
    reference: list[int],
    baseline_seconds: float,
    sampled: bool = False,
    phase_seconds: dict[str, float] | None = None,
    draft_vocab: torch.Tensor | None = None,
) -> dict[str, Any]:
    """results.json's record of one prompt (prompts.Prompt: id, category, input_ids (1, T)) decoded into
    `tokens` with `accept_lengths` per step, against the baseline's `reference`. Sampled outputs differ
    from the baseline's by chance: identical_to_baseline and first_mismatch are then None. `draft_vocab`:
    the (V,) bool mask of the tokens the draft can propose (`drafter_factory.draft_vocab_mask`), whose share of
    `tokens` the record counts ("in_draft_vocab"; None without it)."""
    mismatch = None if sampled else first_mismatch(tokens, reference)
    return {
        "id": prompt.id,
        "category": prompt.category,
        "prompt_tokens": prompt.input_ids.shape[1],
        "new_tokens": len(tokens),
        "steps": len(accept_lengths),
        "mean_accept_length": sum(accept_lengths) / len(accept_lengths) if accept_lengths else None,
        "accept_lengths": accept_lengths,
        "seconds": seconds,
        "baseline_new_tokens": len(reference),
        "baseline_seconds": baseline_seconds,
        "identical_to_baseline": None if sampled else mismatch is None,
        "first_mismatch": mismatch,  # index into the new tokens; None when identical (or sampled)
        # of `tokens`, those the draft can propose; None without draft_vocab
        "in_draft_vocab": tokens_in(draft_vocab, tokens),
        "phase_seconds": phase_seconds,  # the decoder's timings (PHASES and "total"), when it has them
    }


def _compare_row(name: str, figures: dict[str, Any]) -> str:
    cells = [
        name,
        str(figures["num_prompts"]),
        _num(figures["mean_accept_length"], 2),
        _num(figures["acceptance_rate"], 2),
        _num(figures["draft_efficiency"], 2),
        _num(figures["draft_tokens_per_step"], 1),
        _percent(figures.get("outside_forward_fraction")),
        _num(figures["tokens_per_second"], 1),
        _num(figures["speedup"], 2, "x"),
        figures["identical_to_baseline"] or "–",
    ]
    return "| " + " | ".join(cells) + " |"


def _compare_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    return [*_header_of(["method", "prompts", *_COMPARE_COLUMNS]), *(_compare_row(n, f) for n, f in rows)]


def _header_of(names: list[str]) -> list[str]:
    return ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]


def _per_position_table(methods: list[dict[str, Any]]) -> list[str]:
    """Rates per draft depth, up to the deepest depth any method reached."""
    drafting = [m for m in methods if m["proposed_draft_tokens"]]
    deepest = max((d for m in drafting for d, r in enumerate(m["accept_rate_per_depth"], 1) if r), default=1)
    lines = _header_of(["method", *map(str, range(1, deepest + 1))])
    for m in drafting:
        rates = (m["accept_rate_per_depth"][: m["deepest_draft"]] + [None] * deepest)[:deepest]
        lines.append("| " + " | ".join([m["name"], *(_num(r, 2) for r in rates)]) + " |")
    return lines


def render_comparison(results: dict[str, Any]) -> str:
    """report.md of `specheads compare`: overall and per-category tables, per-position acceptance,
    the plots, the settings, how to feed the answer files to Spec-Bench, and the command."""
    methods, prompts = results["methods"], results["prompts"]
    baseline = next(m for m in methods if m["name"] == results["baseline"])
    lines = [f"# Speculative decoding compared on {results['target']['name_or_path']}", ""]
    lines += [
        f"{prompts['num_prompts']} prompts from `{prompts['source']}` ({prompts['turns']} turns in all), "
        f"at most {results['max_new_tokens']} new tokens a turn, greedy; speedup is tokens/s over the "
        f"target's own `generate()` ({_num(baseline['tokens_per_second'], 1)} tokens/s) on the same prompts "
        "in the same run, the methods interleaved per prompt in rotated order.",
        "",
        "## Overall",
        "",
        *_compare_table([(m["name"], m) for m in methods]),
    ]
    for category in dict.fromkeys(c for m in methods for c in m["per_category"]):
        rows = [(m["name"], m["per_category"][category]) for m in methods if category in m["per_category"]]
        lines += ["", f"## {category}", "", *_compare_table(rows)]
    lines += ["", "## Acceptance per draft position", "", *_per_position_table(methods)]
    if results.get("plots"):
        lines += ["", "## Plots", ""]
        lines += [f"![{kind}]({name})" for kind, name in results["plots"].items()]
    lines += ["", "## Methods", ""]
    for m in methods:
        settings = ", ".join(f"{k}={_short(v)}" for k, v in m["settings"].items() if k != "calibration")
        lines.append(f"- `{m['name']}` ({m['method']}): {settings}")
        lines += ["  " + line for line in coverage_lines(m)]
        if "calibration" in m["settings"]:  # --tree auto: the calibrated tree, as eval's report.md gives it
            where = f"results.json: the {m['name']} method's settings.calibration"
            lines.append("  " + calibration_note(m["settings"], where).rstrip())
    lines += ["", "## Terms", ""]
    lines += [f"- **{term}**: {text}" for term, text in results["definitions"].items()]
    lines += [
        "",
        "## Setup",
        "",
        f"- {environment(results)}; {results['platform']}.",
        f"- Spec-Bench answer files in `answers/`; compare them with Spec-Bench's own script: "
        f"`python evaluation/speed.py --file-path answers/<method>.jsonl --base-path "
        f"answers/{results['baseline']}.jsonl --tokenizer-path {results['target']['path']}`.",
        *reproduce(results),
    ]
    return "\n".join(lines)


def _short(value: Any) -> str:
    """A setting as one short cell: nested records by their name or size, not in full."""
    if isinstance(value, dict):
        keep = {k: v for k, v in value.items() if not isinstance(v, (list, tuple, dict))}
        return "{" + ", ".join(f"{k}: {v}" for k, v in keep.items()) + "}"
    return str(value)


def environment(results: dict[str, Any]) -> str:
    """report.md's line on where a run ran (`run_environment`'s record)."""
    versions = results["versions"]
    return (
        f"{results['dtype']} on {results['device']} ({results['threads']} threads), "
        f"{results['attn_implementation']} attention; torch {versions['torch']}, transformers "
        f"{versions['transformers']}, specheads {versions['specheads']}"
    )


def reproduce(results: dict[str, Any]) -> list[str]:
    """report.md's closing lines: the command that made it."""
    return ["", "Reproduce:", "", "```bash", results["command"], "```", ""]


def run_environment(target, attn: str) -> dict:
    """What results.json records of where a run ran: device, dtype, attention, threads, versions. The
    attention is the implementation the target runs (`attn`, the one asked for, may be "auto")."""
    import transformers  # lazy: transformers adds seconds to every command's start

    return {
        "device": str(target.device),
        "dtype": str(target.dtype).removeprefix("torch."),
        "attn_implementation": getattr(target, "attn_implementation", attn),
        "threads": torch.get_num_threads(),
        "versions": {
            "specheads": __version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "platform": platform.platform(),
    }
