"""Training prompts written from seed topics (train/data/seed_prompts.py) never touch the evaluation sets."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from specheads.evaluate.conversations import prompt_set_path
from specheads.train.data import load_rows
from specheads.train.data.seed_prompts import ngrams, question_texts, seed_prompts, shared_ngrams, words

from helpers import command


def texts(rows):
    return [r["messages"][0]["content"] for r in rows]


# Every 6-word sequence of every turn of MT-Bench and Spec-Bench (../shared/data), as 8-byte blake2b digests,
# so the check runs on a fresh clone without the evaluation sets beside it. Regenerated from them with
# fingerprint() below; the test compares the two whenever the files are found.
FINGERPRINT = Path(__file__).parent / "data" / "eval-6grams.bin.gz"
# MT-Bench question 81, first turn: a known evaluation prompt for the leak checks.
MT_BENCH_81 = (
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
    "and must-see attractions."
)


def digest(gram: tuple[str, ...]) -> bytes:
    return hashlib.blake2b(" ".join(gram).encode(), digest_size=8).digest()


def fingerprint(texts_) -> set[bytes]:
    return {digest(g) for g in ngrams(texts_, 6)}


def evaluation_fingerprint() -> set[bytes]:
    raw = gzip.decompress(FINGERPRINT.read_bytes())
    shipped = {raw[i : i + 8] for i in range(0, len(raw), 8)}
    try:
        paths = [prompt_set_path(name) for name in ("mt-bench", "spec-bench")]
    except FileNotFoundError:  # a clone without ../shared/data: the shipped digests stand in
        return shipped
    real = set().union(*(fingerprint(question_texts(path)) for path in paths))
    assert real == shipped, "tests/train/data/eval-6grams.bin.gz is stale: regenerate it from ../shared/data"
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
