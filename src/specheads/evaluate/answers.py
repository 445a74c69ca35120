"""Spec-Bench answer files: `specheads compare` writes one per method, `answers/<method>.jsonl`, in the
format Spec-Bench's evaluation/eval.py writes and its evaluation/speed.py reads."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specheads.core.atomic import write_text

ANSWERS_DIR = "answers"


def answer_rows(model_id: str, runs: Sequence[Any], conversations: Sequence[Any]) -> list[dict[str, Any]]:
    """Spec-Bench answer-file rows: one per question (a compare_records.Run and its Conversation), one choice, per
    turn its answer text, decoding steps, new tokens and wall time, and every step's accept length."""
    return [
        {
            "question_id": conversation.question_id,
            "category": conversation.category,
            "answer_id": uuid.uuid4().hex,
            "model_id": model_id,
            "choices": [
                {
                    "index": 0,
                    "turns": run.answers,
                    "decoding_steps": [len(d.accept_lengths) for d in run.decoded],
                    "new_tokens": [len(d.tokens) for d in run.decoded],
                    "wall_time": run.seconds,
                    "accept_lengths": [n for d in run.decoded for n in d.accept_lengths],
                }
            ],
            "tstamp": time.time(),
        }
        for run, conversation in zip(runs, conversations)
    ]


def answer_file(name: str) -> str:
    """A method's answer file, relative to the output folder."""
    return f"{ANSWERS_DIR}/{name.replace(':', '-').replace('/', '-')}.jsonl"


def write_answers(out: Path, results: dict[str, Any], runs: dict[str, Sequence[Any]], conversations) -> None:
    """Every method's answer file (`results["answers"]`: method -> file), model ids as Spec-Bench names them."""
    (out / ANSWERS_DIR).mkdir(parents=True, exist_ok=True)
    model = Path(results["target"]["path"]).name
    for name, path in results["answers"].items():
        rows = answer_rows(f"{model}-{name}-{results['dtype']}", runs[name], conversations)
        write_text(out / path, "".join(json.dumps(row) + "\n" for row in rows))
