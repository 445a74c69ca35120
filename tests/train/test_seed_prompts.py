"""Training prompts written from seed topics (data/seed_prompts.py) never touch the evaluation sets."""

from __future__ import annotations

import json

import pytest

from specheads.data import load_rows
from specheads.data.seed_prompts import (
    EVAL_NGRAMS,
    fingerprint,
    question_texts,
    seed_prompts,
    shared_ngrams,
    touches_evaluation,
    words,
)
from specheads.data.seed_prompts import evaluation_fingerprint as shipped_fingerprint
from specheads.evaluate.conversations import prompt_set_path

from helpers import command


def texts(rows):
    return [r["messages"][0]["content"] for r in rows]


# MT-Bench question 81, first turn: a known evaluation prompt for the leak checks.
MT_BENCH_81 = (
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
    "and must-see attractions."
)


def evaluation_fingerprint() -> set[bytes]:
    """The shipped digests (data/eval-6grams.bin.gz), checked against the evaluation sets when found."""
    shipped = set(shipped_fingerprint())
    try:
        paths = [prompt_set_path(name) for name in ("mt-bench", "spec-bench")]
    except FileNotFoundError:  # a set not found: the shipped digests stand in
        return shipped
    real = set().union(*(fingerprint(question_texts(path)) for path in paths))
    assert real == shipped, f"{EVAL_NGRAMS} is stale: regenerate it from {paths}"
    return real


def test_no_6_word_sequence_is_shared_with_mt_bench_or_spec_bench():
    # 6 words, not the customary 8: an evaluation prompt's phrasing reused around another topic
    # ("compose an engaging travel blog post about <topic>") shares 7 words, no 8.
    reference = evaluation_fingerprint()
    assert len(reference) > 90_000
    prompts = texts(seed_prompts())
    assert fingerprint(prompts) & reference == set()
    # the check sees a copy through case and punctuation
    leaked = prompts[:5] + [MT_BENCH_81.upper().replace(" ", "  ,")]
    assert fingerprint(leaked) & reference
    assert shared_ngrams(leaked, [MT_BENCH_81], n=6)


def test_prompts_are_distinct_seeded_and_cover_every_kind():
    rows = seed_prompts()
    assert len(rows) == len(set(texts(rows))) >= 2000
    assert rows == seed_prompts() and rows != seed_prompts(seed=1)
    assert len(seed_prompts(seed=1)) == len(rows)
    assert {r["category"] for r in rows} == {"writing", "roleplay", "stem", "humanities", "math", "coding"}
    assert all(len(words(t)) >= 4 for t in texts(rows))


def test_written_file_is_read_back_as_user_turns(tmp_path):
    out = tmp_path / "prompts.jsonl"
    questions = tmp_path / "questions.jsonl"
    questions.write_text(json.dumps({"question_id": 81, "turns": [MT_BENCH_81, "Rewrite it."]}) + "\n")
    assert (
        command("seed-prompts")(["--out", str(out), "--max-rows", "50", "--check-against", str(questions)])
        == 0
    )
    rows = load_rows(str(out))
    assert len(rows) == 50
    assert rows[0]["messages"] == [
        {"role": "user", "content": json.loads(out.read_text().splitlines()[0])["messages"][0]["content"]}
    ]
    assert texts(rows) == texts(seed_prompts()[:50])


def test_stdlib_chats_share_no_6_word_sequence_with_the_evaluation_sets(tmp_path, monkeypatch):
    # `stdlib-chats`, the labelled-text route's training rows (train/sources.py): both turns
    monkeypatch.setenv("SPECHEADS_CACHE", str(tmp_path))
    from specheads.train.sources import stdlib_chat_rows

    rows = stdlib_chat_rows(heldout=False)
    assert len(rows) > 2000
    turns = [m["content"] for r in rows for m in r["messages"]]
    assert fingerprint(turns) & evaluation_fingerprint() == set()
    # the filter that makes it so: a chat quoting an evaluation prompt is left out
    assert touches_evaluation(["So what is " + MT_BENCH_81.lower()])
    assert not touches_evaluation(turns)


def test_a_file_that_is_not_questions_is_named(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# Evaluation sets\n")
    out = tmp_path / "prompts.jsonl"
    args = ["--out", str(out), "--max-rows", "5", "--check-against", str(readme)]
    with pytest.raises(ValueError, match=r"README\.md, line 1: not a question row"):
        command("seed-prompts")(args)
    assert not out.exists()
