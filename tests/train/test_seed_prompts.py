"""Training prompts written from seed topics (train/seed_prompts.py) never touch the evaluation sets."""

from __future__ import annotations

import json

from specheads.decode.conversations import prompt_set_path
from specheads.train.data import load_rows
from specheads.train.seed_prompts import main, question_texts, seed_prompts, shared_ngrams, words


def texts(rows):
    return [r["messages"][0]["content"] for r in rows]


def test_no_6_word_sequence_is_shared_with_mt_bench_or_spec_bench():
    # 6 words, not the customary 8: an evaluation prompt's phrasing reused around another topic
    # ("compose an engaging travel blog post about <topic>") shares 7 words, no 8.
    prompts = texts(seed_prompts())
    for name in ("mt-bench", "spec-bench"):
        reference = question_texts(prompt_set_path(name))  # every turn of every question
        assert len(reference) >= 160
        assert shared_ngrams(prompts, reference, n=6) == set(), name
        # the check sees a copy through case and punctuation
        leaked = prompts[:5] + [reference[7].upper().replace(" ", "  ,")]
        assert shared_ngrams(leaked, reference, n=6)


def test_prompts_are_distinct_seeded_and_cover_every_kind():
    rows = seed_prompts()
    assert len(rows) == len(set(texts(rows))) >= 2000
    assert rows == seed_prompts() and rows != seed_prompts(seed=1)
    assert len(seed_prompts(seed=1)) == len(rows)
    assert {r["category"] for r in rows} == {"writing", "roleplay", "stem", "humanities", "math", "coding"}
    assert all(len(words(t)) >= 4 for t in texts(rows))


def test_written_file_is_read_back_as_user_turns(tmp_path):
    out = tmp_path / "prompts.jsonl"
    assert main(["--out", str(out), "--max-rows", "50", "--check-against", prompt_set_path("mt-bench")]) == 0
    rows = load_rows(str(out))
    assert len(rows) == 50
    assert rows[0]["messages"] == [
        {"role": "user", "content": json.loads(out.read_text().splitlines()[0])["messages"][0]["content"]}
    ]
    assert texts(rows) == texts(seed_prompts()[:50])
