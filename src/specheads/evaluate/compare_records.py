"""What `specheads compare` keeps of each method's decoding (evaluate/compare.py): a Run per method and
conversation, its form in progress.jsonl (so a stopped comparison resumes), and the results.json figures
built from the runs: per-prompt records beside the baseline's, and a method's entry (headline figures,
draft figures, per category)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specheads.evaluate.conversations import Conversation
from specheads.evaluate.peers import Decoded, Method
from specheads.evaluate.report import draft_figures, first_mismatch, summarize, tokens_in


@dataclass
class Run:
    """One method on one conversation: per turn, its prompt length, output, seconds and answer text."""

    slot: int  # where the method ran in this prompt's order (0 = first)
    prompt_tokens: list[int] = field(default_factory=list)
    decoded: list[Decoded] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)


def conversation_record(conversation: Conversation, order: list[str], runs: dict[str, Run]) -> dict[str, Any]:
    """One finished conversation, every method's run, as progress.jsonl keeps it."""
    return {"id": conversation.id, "order": order, "runs": {name: asdict(run) for name, run in runs.items()}}


def run_from_dict(d: dict[str, Any]) -> Run:
    """A Run as `conversation_record` wrote it."""
    return Run(
        slot=d["slot"],
        prompt_tokens=list(d["prompt_tokens"]),
        decoded=[Decoded(**x) for x in d["decoded"]],
        seconds=list(d["seconds"]),
        answers=list(d["answers"]),
    )


# -- figures ----------------------------------------------------------------------------------------


def records_for(
    runs: list[Run],
    baseline: list[Run],
    conversations: list[Conversation],
    draft_vocab: torch.Tensor | None = None,
) -> list[dict]:
    """Per-prompt records (turns summed, steps concatenated), each beside the baseline's same prompt;
    `draft_vocab`: the (V,) bool mask of the tokens the method can draft, whose share of its output each record
    counts ("in_draft_vocab", as `specheads eval`'s; None without it)."""
    records = []
    for run, base, conversation in zip(runs, baseline, conversations):
        mismatch = None
        for turn, (mine, theirs) in enumerate(zip(run.decoded, base.decoded), 1):
            index = first_mismatch(mine.tokens, theirs.tokens)
            if index is not None:
                mismatch = {"turn": turn, "index": index}
                break
        accept_lengths = [n for d in run.decoded for n in d.accept_lengths]
        records.append(
            {
                "id": conversation.id,
                "category": conversation.category,
                "slot": run.slot,
                "turns": len(run.decoded),
                "prompt_tokens": run.prompt_tokens,
                "new_tokens": sum(len(d.tokens) for d in run.decoded),
                "turn_new_tokens": [len(d.tokens) for d in run.decoded],
                "steps": len(accept_lengths),
                "mean_accept_length": sum(accept_lengths) / len(accept_lengths) if accept_lengths else None,
                "accept_lengths": accept_lengths,
                "draft_sizes": [n for d in run.decoded for n in d.draft_sizes],
                "draft_depths": [n for d in run.decoded for n in d.draft_depths],
                "prefill_token": run.decoded[0].prefill_token,
                "seconds": sum(run.seconds),
                "turn_seconds": run.seconds,
                "baseline_new_tokens": sum(len(d.tokens) for d in base.decoded),
                "baseline_seconds": sum(base.seconds),
                "identical_to_baseline": mismatch is None,
                "first_mismatch": mismatch,  # {"turn", "index" into that turn's new tokens}; None: identical
                "phase_seconds": summed_phases([d.phase_seconds for d in run.decoded]),
                "in_draft_vocab": tokens_in(draft_vocab, [t for d in run.decoded for t in d.tokens]),
            }
        )
    return records


def summed_phases(turns: list[dict[str, float]]) -> dict[str, float] | None:
    """A conversation's phase seconds, its turns' summed; None when the method has none (transformers')."""
    if not all(turns):
        return None
    return {phase: sum(t.get(phase, 0.0) for t in turns) for phase in turns[0]}


def method_entry(name: str, kind: str, method: Method, records: list[dict]) -> dict[str, Any]:
    """One results.json entry: the headline figures, draft figures, per category, settings, records."""
    depth = method.max_depth

    def figures(rows):
        return {**summarize(rows, depth), **draft_figures(rows)}

    categories = dict.fromkeys(r["category"] for r in records if r["category"] is not None)
    return {
        "name": name,
        "method": kind,
        **figures(records),
        "per_category": {c: figures([r for r in records if r["category"] == c]) for c in categories},
        "settings": method.settings(),
        "per_prompt": records,
    }
