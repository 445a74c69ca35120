"""`specheads seed-prompts --out FILE`: chat prompts to train on, composed from seed topics and disjoint from
MT-Bench and Spec-Bench (data/seed_prompts.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specheads.core.atomic import write_text
from specheads.data.seed_prompts import question_texts, seed_prompts, shared_ngrams


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="JSONL file to write (OpenAI `messages` rows)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-rows", type=int, default=None)
    p.add_argument(
        "--check-against", type=Path, nargs="*", default=[], help="question files to prove disjoint"
    )


def run(args: argparse.Namespace) -> int:
    rows = seed_prompts(args.seed)[: args.max_rows]
    texts = [r["messages"][0]["content"] for r in rows]
    for path in args.check_against:
        common = shared_ngrams(texts, question_texts(path))
        if common:
            raise ValueError(
                f"{len(common)} 6-word sequences shared with {path}, e.g. {' '.join(min(common))!r}"
            )
        print(f"no 6-word sequence shared with {path}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} prompts written to {args.out}")
    return 0
