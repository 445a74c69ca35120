"""What the `specheads compare` tests share besides conftest.py's `compare_setup` (a tiny random target with
held-out files, random heads, an assistant draft): the questions and sources it writes, the command's
arguments, and every figure of a results.json entry recomputed (`check_entry`)."""

from pathlib import Path

import pytest

from helpers import command

compare_cli = command("compare")

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["Compose a blog post about Hawaii.", "Rewrite it."]},
    {
        "question_id": 101,
        "category": "reasoning",
        "turns": ["You overtake the second person.", "And the last?"],
    },
    {"question_id": 121, "category": "writing", "turns": ["Write a haiku about Python.", "Another one."]},
]
SOURCES = {
    "pkg/long.py": "import os\n\n\ndef join(a, b):\n    return os.path.join(a, b)\n" * 4,
    "short.py": "x = 1\n",
}
MAX_NEW = 8


def compare_args(setup, out: Path, prompts, *extra: str) -> list[str]:
    return [
        "--target",
        str(setup["target"]),
        "--prompts",
        str(prompts),
        "--out",
        str(out),
        "--max-new-tokens",
        str(MAX_NEW),
        "--no-progress",
        *extra,
    ]


def check_entry(entry: dict, baseline_rows: list[dict]) -> None:
    """Every figure of one method recomputed from its per-prompt records."""
    rows = entry["per_prompt"]
    accept = [n for r in rows for n in r["accept_lengths"]]
    sizes = [n for r in rows for n in r["draft_sizes"]]
    depths = [n for r in rows for n in r["draft_depths"]]
    assert len(accept) == len(sizes) == len(depths) == entry["steps"]
    for r, base in zip(rows, baseline_rows):
        assert r["id"] == base["id"]
        # Our decoder and generate() take the first token from prefill; transformers' assisted loop doesn't.
        assert r["new_tokens"] == r["prefill_token"] * r["turns"] + sum(r["accept_lengths"])
        assert r["new_tokens"] == sum(r["turn_new_tokens"]) <= MAX_NEW * r["turns"]
        assert r["baseline_new_tokens"] == base["new_tokens"] and r["baseline_seconds"] == base["seconds"]
        assert all(a <= d + 1 for a, d in zip(r["accept_lengths"], r["draft_depths"]))
        assert all(d <= s for d, s in zip(r["draft_depths"], r["draft_sizes"]))
    assert entry["mean_accept_length"] == pytest.approx(sum(accept) / len(accept))
    assert entry["new_tokens"] == sum(r["new_tokens"] for r in rows)
    assert entry["tokens_per_second"] == pytest.approx(entry["new_tokens"] / entry["seconds"])
    assert entry["speedup"] == pytest.approx(entry["tokens_per_second"] / entry["baseline_tokens_per_second"])
    if sum(sizes):
        assert entry["acceptance_rate"] == pytest.approx(sum(a - 1 for a in accept) / sum(sizes))
    else:
        assert entry["acceptance_rate"] is None
    assert entry["draft_efficiency"] == pytest.approx(sum(accept) / sum(d + 1 for d in depths))
    assert sum(entry["accept_length_counts"]) == entry["steps"]
    assert entry["deepest_draft"] == max(depths, default=0) <= len(entry["accept_rate_per_depth"])
    rates = entry["accept_rate_per_depth"]
    assert rates == pytest.approx(
        [sum(a > d for a in accept) / len(accept) for d in range(1, len(rates) + 1)]
    )
    assert entry["mean_accept_length"] == pytest.approx(1 + sum(rates))  # no step passes the listed depth
    n = len(rows)
    assert entry["identical_to_baseline"] == f"{n}/{n}"  # greedy: every method is lossless
