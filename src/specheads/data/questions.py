"""Question files (MT-Bench / Spec-Bench's `turns` format) as conversations for `specheads distill`.

    {"question_id": 7, "category": "writing", "turns": ["Write a haiku about tea.", "Now one about coffee."]}

Each question becomes one conversation whose user turns are the question's turns, each followed by an
assistant turn for the target to write: distill answers turn 1, then turn 2 given its own answer, and so
on. The evaluation sets themselves (`mt-bench`, `spec-bench`, or a file holding any of their turns) are
refused: evaluation prompts are never training prompts (heads trained on them would report a τ no user
sees). `allow_eval_prompts` lets them through with a warning, for experiments that say so.
"""

from __future__ import annotations

import logging
from pathlib import Path

import datasets

from specheads.core.question_sets import (
    PROMPT_SETS,
    evaluation_overlap,
    is_question_file,
    prompt_set_path,
    read_questions,
)

logger = logging.getLogger(__name__)

UNWRITTEN = ""  # the content of an assistant turn the target is to write (distill replaces every one)


def question_source(source: str) -> Path | None:
    """The question file `source` names (`mt-bench`, `spec-bench`, or a `turns` .jsonl), else None."""
    if source in PROMPT_SETS:
        return Path(prompt_set_path(source, flag="--source"))
    return Path(source) if is_question_file(source) else None


def question_rows(path: str | Path, *, allow_eval_prompts: bool = False) -> datasets.Dataset:
    """The questions of `path` as {"messages"} rows: user turn, assistant turn to write, user turn, ...

    Raises:
        ValueError: the file is not a question file, or holds evaluation questions and
            `allow_eval_prompts` is False.
    """
    questions = read_questions(path)
    overlap = evaluation_overlap([t for q in questions for t in q["turns"]])
    if overlap:
        found = ", ".join(f"{n} turns of {name}" for name, n in overlap.items())
        message = (
            f"{path} holds evaluation questions ({found}): training on them is forbidden, since heads "
            "that saw the evaluation prompts report a τ no user sees. Use your own questions in this "
            "format (or `specheads seed-prompts`)"
        )
        if not allow_eval_prompts:
            raise ValueError(message + "; --allow-eval-prompts overrides")
        logger.warning("WARNING: %s. Going on because of --allow-eval-prompts.", message)
    rows = []
    for q in questions:
        messages = []
        for turn in q["turns"]:
            messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": UNWRITTEN}]
        rows.append({"messages": messages})
    return datasets.Dataset.from_list(rows)
