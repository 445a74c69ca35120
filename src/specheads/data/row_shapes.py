"""One raw row (a JSON object, a dataset row) normalised to one of the two shapes that `load_rows`
(data/readers.py) gives: {"messages": [...]} (with "reasoning_content" where its turns have some) or
{"text": str}; RowError says why a row cannot be.

A JSON object (or dataset row) is recognised by its keys, first match wins:

    "messages"          OpenAI style [{"role", "content"}] (also UltraChat-200k, which adds "prompt")
    "conversations"     ShareGPT style [{"from", "value"}] (or role/content)
    "data"              UltraChat style: a list of strings, alternating user / assistant
    "text"              plain text

Role names are normalised (`ROLE_NAMES`, case-insensitive): human/user -> user; gpt/assistant/bot/
chatgpt/bing/model -> assistant; system. Content may be a string or a list of OpenAI text parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ROLE_NAMES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "bot": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "model": "assistant",
}


class RowError(ValueError):
    """One row that cannot be read; the message says why."""


def normalise_role(name: Any) -> str:
    role = ROLE_NAMES.get(name.strip().lower()) if isinstance(name, str) else None
    if role is None:
        raise RowError(f"unknown role {name!r}; expected one of {sorted(ROLE_NAMES)}")
    return role


def _content(value: Any) -> str:
    """A turn's content: a string, or a list of OpenAI content parts of type text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, Mapping) and p.get("type") == "text" for p in value):
        return "".join(str(p.get("text", "")) for p in value)
    raise RowError(f"content must be a string or a list of text parts, got {type(value).__name__}")


def _reasoning(turns: list[Any]) -> list[str | None] | None:
    """Each turn's `reasoning_content` (None where it has none), or None when no turn has one."""
    found = [t.get("reasoning_content") if isinstance(t, Mapping) else None for t in turns]
    for i, r in enumerate(found):
        if r is not None and not isinstance(r, str):
            raise RowError(f"turn {i}: reasoning_content must be a string, got {type(r).__name__}")
    return found if any(r is not None for r in found) else None


def _turns(turns: Any, key: str) -> list[dict[str, str]]:
    if not isinstance(turns, list) or not turns:
        raise RowError(f"{key!r} must be a non-empty list of turns, got {turns!r:.80}")
    out = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise RowError(f"{key}[{i}] is not an object: {turn!r:.80}")
        role = turn.get("role", turn.get("from"))
        content = turn.get("content", turn.get("value"))
        if role is None or content is None:
            raise RowError(
                f"{key}[{i}] needs 'role'/'content' (or ShareGPT 'from'/'value'), has {sorted(turn)}"
            )
        try:
            out.append({"role": normalise_role(role), "content": _content(content)})
        except RowError as e:
            raise RowError(f"{key}[{i}]: {e}") from None
    return out


def _alternating(strings: Any) -> list[dict[str, str]]:
    """UltraChat's `data`: user, assistant, user, ... as bare strings."""
    if not isinstance(strings, list) or not strings or not all(isinstance(s, str) for s in strings):
        raise RowError(f"'data' must be a non-empty list of strings (UltraChat), got {strings!r:.80}")
    return [{"role": ("user", "assistant")[i % 2], "content": s} for i, s in enumerate(strings)]


def normalise_row(row: Any) -> dict[str, Any]:
    """One raw row -> {"messages": [...]} or {"text": str}; RowError says why it cannot be read."""
    if not isinstance(row, Mapping):
        raise RowError(f"expected a JSON object, got {type(row).__name__}")
    for key in ("messages", "conversations"):
        if row.get(key) is not None:
            messages = _turns(row[key], key)
            reasoning = _reasoning(row[key])
            return {"messages": messages, **({"reasoning_content": reasoning} if reasoning else {})}
    if row.get("data") is not None:
        return {"messages": _alternating(row["data"])}
    if row.get("text") is not None:
        if not isinstance(row["text"], str):
            raise RowError(f"'text' must be a string, got {type(row['text']).__name__}")
        if not row["text"]:
            raise RowError("empty text")
        return {"text": row["text"]}
    raise RowError(
        f"neither 'text' nor a conversation ('messages', 'conversations' or 'data'); keys: {sorted(row)}"
    )
