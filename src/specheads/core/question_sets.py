"""The evaluation question sets (MT-Bench, Spec-Bench) by name, and how to tell them from a user's own
questions in their `turns` format.

    {"question_id": 81, "category": "writing", "turns": ["first user turn", "second user turn"]}

`mt-bench` / `spec-bench` are looked up in $SPECHEADS_DATA (a folder of your own copies), then in the copies
shipped with the package (core/prompt_sets/, Apache-2.0).
eval and compare read them (evaluate/); distill reads a user's own file in that format (data/), and
refuses one that holds evaluation questions: evaluation prompts are never training prompts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

PROMPT_SETS = {"mt-bench": "mt_bench_question.jsonl", "spec-bench": "spec_bench_question.jsonl"}


def data_roots() -> list[Path]:
    """Where the named sets are looked for, in order."""
    roots = [os.environ.get("SPECHEADS_DATA"), Path(__file__).resolve().with_name("prompt_sets")]
    return [Path(r) for r in roots if r]


def prompt_set_path(source: str, flag: str = "--prompts") -> str:
    """`mt-bench` / `spec-bench` as a file path; any other source unchanged."""
    if source not in PROMPT_SETS:
        return source
    for root in data_roots():
        if (root / PROMPT_SETS[source]).is_file():
            return str(root / PROMPT_SETS[source])
    raise FileNotFoundError(
        f"{flag} {source}: {PROMPT_SETS[source]} is in none of {[str(r) for r in data_roots()]}; set "
        f"SPECHEADS_DATA to the folder holding it, or pass the file's path"
    )


def read_questions(path: str | Path) -> list[dict]:
    """Every question of a `turns` file, checked: {"question_id", "category", "turns": [non-empty str]}.

    Raises:
        ValueError: a line is not such a question (naming the file and line), or the file holds none.
    """
    path = Path(path)
    questions = []
    for n, line in enumerate(utf8_lines(path), 1):
        if not line.strip():
            continue
        try:
            question = json.loads(line)
            turns = question["turns"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(
                f"{path}, line {n}: expected a question like "
                f'{{"question_id": 81, "category": "writing", "turns": ["..."]}} ({e!r})'
            ) from e
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"{path}, line {n}: turns must be a non-empty list, got {turns!r}")
        for k, turn in enumerate(turns, 1):
            if not isinstance(turn, str) or not turn.strip():
                raise ValueError(f"{path}, line {n}: turn {k} must be a non-empty string, got {turn!r}")
            try:
                turn.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate, "\ud800" in the JSON: no text encodes it
                raise ValueError(
                    f"{path}, line {n}: turn {k} holds a lone surrogate ({turn[e.start : e.end]!r} at character "
                    f"{e.start}), which is not text: fix or drop the line"
                ) from None
        questions.append(
            {
                "question_id": question.get("question_id", n),
                "category": question.get("category"),
                "turns": turns,
            }
        )
    if not questions:
        raise ValueError(f"{path} holds no questions")
    return questions


def utf8_lines(path: str | Path) -> list[str]:
    """The lines of a text file; bytes that are not UTF-8 are an error naming the file and line."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    out = []
    for n, raw in enumerate(lines, 1):
        try:
            out.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise ValueError(
                f"{path}, line {n}: not valid UTF-8 (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the "
                "line): save the file as UTF-8"
            ) from None
    return out[:-1] if out and out[-1] == "" else out


def is_question_file(path: str | Path) -> bool:
    """Whether `path` is a .jsonl whose first row is a question (has "turns" and none of the keys of
    conversation or text rows)."""
    path = Path(path)
    if path.suffix not in (".jsonl", ".json") or not path.is_file():
        return False
    with path.open(encoding="utf-8", errors="replace") as f:  # a bad byte: the reader names its line
        first = next((line for line in f if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    other = ("messages", "conversations", "data", "text")
    return isinstance(row, dict) and "turns" in row and not any(k in row for k in other)


def evaluation_overlap(turns: list[str]) -> dict[str, int]:
    """How many of `turns` are (whitespace aside) turns of each evaluation set found; sets that hold none
    of them, or that cannot be found, are left out."""
    wanted = {" ".join(t.split()) for t in turns}
    overlap = {}
    for name, file in PROMPT_SETS.items():
        path = next((r / file for r in data_roots() if (r / file).is_file()), None)
        if path is None:
            continue
        theirs = {" ".join(t.split()) for q in read_questions(path) for t in q["turns"]}
        if n := len(wanted & theirs):
            overlap[name] = n
    return overlap
