"""The prompts of `specheads compare`: question sets, held-out files, and multi-turn conversations.

A conversation is the user turns of one question (MT-Bench has two; Spec-Bench's MT-Bench part too)
or one held-out file's text. Turn k goes to a method after that method's own answers to turns
1..k-1, rendered with the target's chat template, as Spec-Bench's evaluation does; so a method whose
first answer differs from the baseline's is asked its second turn in its own context.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specheads.core.question_sets import prompt_set_path
from specheads.evaluate.prompts import Prompt, read_prompts


@dataclass
class Conversation:
    """One prompt: the user turns of a question (chat), or one file's text (raw)."""

    id: str
    question_id: Any  # as the questions file has it (Spec-Bench's answer files repeat it)
    category: str | None
    turns: list[str]
    chat: bool


@dataclass(frozen=True)
class TurnSettings:
    """What every method's every turn is decoded with."""

    max_new_tokens: int
    prompt_tokens: int  # file prompts are cut to this many tokens
    templated: bool  # chat turns go through the target's chat template
    limit: int | None  # the target's max_position_embeddings
    depth: int  # the deepest draft of any method: positions a step may use past the output


def read_conversations(
    source: str, target_dir: str, category: str | None, num_prompts: int | None, max_turns: int | None
) -> list[Conversation]:
    """The prompts of `source` (see the module docstring), every turn of each question up to max_turns."""
    path = prompt_set_path(source)
    firsts = read_prompts(path, target_dir, category, num_prompts)  # validates, filters, cuts
    turns = _all_turns(Path(path)) if path.endswith(".jsonl") else {}
    conversations = []
    for p in firsts:
        question_id, all_turns = turns.get(p.id, (p.id, [p.text]))
        conversations.append(Conversation(p.id, question_id, p.category, all_turns[:max_turns], p.chat))
    return conversations


def _all_turns(path: Path) -> dict[str, tuple[Any, list[str]]]:
    """id -> (question_id as written, every turn), keyed as evaluate.prompts.read_prompts keys them."""
    questions = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        question = json.loads(line)  # read_prompts has checked every line already
        turns = question["turns"]
        for k, turn in enumerate(turns[1:], 2):
            if not isinstance(turn, str) or not turn.strip():
                raise ValueError(f"{path}, line {n}: turn {k} must be a non-empty string, got {turn!r}")
        question_id = question.get("question_id", n)
        questions[str(question_id)] = (question_id, list(turns))
    return questions


def render_turn(
    tokenizer, conversation: Conversation, answers: list[str], templated: bool, prompt_tokens: int
) -> torch.Tensor:
    """(1, T) ids of turn len(answers) + 1: the user turns so far, with this method's own answers.

    The first turn tokenizes exactly as evaluate.prompts.encode_prompts does; later turns render the
    whole conversation with the chat template (without one: the texts joined by blank lines).
    """
    k = len(answers)
    if conversation.chat and templated:
        messages = []
        for user, answer in zip(conversation.turns[:k], answers):
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": conversation.turns[k]})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]  # the template has its BOS
    else:
        parts = [t for pair in zip(conversation.turns[:k], answers) for t in pair]
        ids = tokenizer("\n\n".join([*parts, conversation.turns[k]]))["input_ids"]
        ids = ids if conversation.chat else ids[:prompt_tokens]
    return torch.tensor([ids], dtype=torch.long)


def first_turns(conversations: list[Conversation], tokenizer, settings: TurnSettings) -> list[Prompt]:
    """Each conversation's first turn as a prompt (`--tree auto` calibrates on the held-out ones)."""
    return [
        Prompt(c.id, c.category, render_turn(tokenizer, c, [], settings.templated, settings.prompt_tokens))
        for c in conversations
    ]


def positions_needed(tokenizer, conversation: Conversation, settings: TurnSettings) -> int:
    """An upper bound on the positions the last turn needs: the user turns, every earlier answer at its
    longest (re-encoded answer text, with a margin for tokens that merge differently), the output and
    the deepest draft past it."""
    empty = [""] * (len(conversation.turns) - 1)
    base = render_turn(tokenizer, conversation, empty, settings.templated, settings.prompt_tokens).shape[1]
    return base + len(empty) * (settings.max_new_tokens + 8) + settings.max_new_tokens + settings.depth


def select_prompts(
    conversations: list[Conversation], tokenizer, settings: TurnSettings, skip_long: bool
) -> tuple[list[Conversation], list[str]]:
    """The conversations whose last turn fits the target's positions; (kept, skipped ids).

    Raises:
        ValueError: a prompt does not fit and --skip-long was not given, or none fits.
    """
    kept, skipped = [], []
    for c in conversations:
        needed = positions_needed(tokenizer, c, settings)
        if settings.limit is None or needed <= settings.limit:
            kept.append(c)
        elif skip_long:
            skipped.append(c.id)
        else:
            raise ValueError(
                f"prompt {c.id!r} ({len(c.turns)} turns) may need {needed} positions with --max-new-tokens "
                f"{settings.max_new_tokens} a turn, but the target has max_position_embeddings="
                f"{settings.limit}; pass --skip-long, --max-turns or --category"
            )
    if not kept:
        raise ValueError(f"no prompt fits the target's {settings.limit} positions ({len(skipped)} skipped)")
    return kept, skipped
