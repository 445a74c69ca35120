"""Tokenisation with loss masks taken from the target's own chat template.

`loss_mask[t] == 1` means token t is a training label: it is predicted from positions < t. Which
tokens are labels (`loss_on`):

    "assistant"        every assistant turn (default)
    "last_assistant"   only the last assistant turn
    "all"              every token
    a set of roles     e.g. {"user", "assistant"}: the turns of those roles

How an assistant turn is found, without ever splitting strings:

    * prefix renders (any template): the turn's tokens run from the end of
      `apply_chat_template(messages[:i], add_generation_prompt=True)` to the end of
      `apply_chat_template(messages[:i + 1])`, both taken as token positions in the full render (the
      longest common token prefix, so a token merged across the boundary counts as the turn's).
      A system or user turn runs from the end of `messages[:i]` (its header included).
    * generation markers: when the template wraps assistant content in `{% generation %}` and every
      assistant turn is trained on, the template's own marks (`return_assistant_tokens_mask`).

The end-of-turn token is trained on (`<|eot_id|>`, `<|im_end|>`, `</s>`, `<|end|>`): the model has to
learn to stop. Template whitespace rendered *after* the last special token of a turn (ChatML's "\\n"
after `<|im_end|>`) is not: generation stops at the end-of-turn token, so nothing ever drafts it.

A template that rewrites earlier turns when the conversation grows (Mistral v3 moves the system
prompt into the last user turn, Qwen3 drops earlier reasoning) has no consistent prefix renders;
that is a ChatMaskError pointing at `loss_on="last_assistant"` or generation markers. A chat row
whose mask is all zeros or all ones (before truncation) is a ChatMaskError showing the row.

`tokenize_rows` maps a whole dataset through this, truncates, and caches the result through
`datasets` fingerprinting (tokenizer files + template + settings), so a second run reads the cache.
A conversation that raises ChatMaskError there is a *bad row*, under the same rule as `load_rows`:
counted and reported with its row index and reason, skipped while there are at most `max_bad_rows`
(a count, or a fraction of the rows), BadRowsError above that.
Plain text rows are `tokenizer(text)` with the tokenizer's own special tokens, labels on every token;
a text longer than `max_length` is cut into consecutive windows of `max_length` tokens, each a
document of its own. A chat row longer than `max_length` is truncated on the right; one left without
any label is dropped (and counted in a warning). The first token of every row is never a label.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Sequence
from functools import partial

import datasets
from datasets import Features, List, Value
from datasets.fingerprint import Hasher

from specheads.data.readers import (
    RowsReport,
    check_max_bad_rows,
    drop_bad_rows,
    judged_stream,
)

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
LOSS_ON = ("assistant", "last_assistant", "all")
DATA_FORMAT_VERSION = 2  # bump when tokenize_rows' output changes, to invalidate cached datasets
_GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
_SHOW_CHARS = 600


class ChatMaskError(ValueError):
    """A conversation whose loss mask cannot be found, or comes out degenerate."""


def parse_loss_on(loss_on: str | Iterable[str]) -> tuple[frozenset[str] | None, bool]:
    """(roles trained on, or None for every token; last assistant turn only)."""
    if isinstance(loss_on, str):
        if loss_on not in LOSS_ON:
            raise ValueError(
                f"unknown loss_on {loss_on!r}; expected one of {LOSS_ON} or a set of roles {ROLES}"
            )
        if loss_on == "all":
            return None, False
        return frozenset({"assistant"}), loss_on == "last_assistant"
    roles = frozenset(loss_on)
    if not roles or not roles <= set(ROLES):
        raise ValueError(f"loss_on roles must be a non-empty subset of {ROLES}, got {sorted(roles)}")
    return roles, False


def has_generation_markers(chat_template: str | None) -> bool:
    return bool(chat_template) and bool(_GENERATION_MARKER.search(chat_template))


def _show(messages: Sequence[dict]) -> str:
    text = json.dumps(list(messages), ensure_ascii=False)
    return text if len(text) <= _SHOW_CHARS else text[:_SHOW_CHARS] + f"... ({len(text)} chars)"


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _special_ids(tokenizer) -> set[int]:
    ids = set(tokenizer.all_special_ids)
    ids.update(i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
    return ids


def _trim_after_end_of_turn(ids: Sequence[int], start: int, end: int, special: set[int], tokenizer) -> int:
    """End of a turn's span without the template whitespace after its last special token."""
    last = max((k for k in range(start, end) if ids[k] in special), default=None)
    if last is None or last + 1 == end or tokenizer.decode(ids[last + 1 : end]).strip():
        return end
    return last + 1


def _render(tokenizer, messages: Sequence[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=generation_prompt
    )


def _prefix_spans(
    messages: Sequence[dict], turns: list[int], full: str, tokenizer
) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of the full render and each turn's [start, end) from prefix renders."""
    bounds = []
    for i in turns:
        assistant = messages[i]["role"] == "assistant"
        before = _render(tokenizer, messages[:i], assistant) if (assistant or i > 0) else ""
        after = _render(tokenizer, messages[: i + 1], False)
        if not (full.startswith(before) and full.startswith(after)):
            raise ChatMaskError(
                f"the chat template renders turn {i} ({messages[i]['role']}) differently once later turns "
                "follow (it rewrites earlier turns, e.g. moves the system prompt into the last user turn "
                "or drops earlier reasoning), so its tokens cannot be found by prefix renders; use "
                "loss_on='last_assistant' or a template with {% generation %} markers"
            )
        bounds += [before, after]
    encoded = tokenizer([full, *bounds], add_special_tokens=False)["input_ids"]
    ids, prefixes = encoded[0], encoded[1:]
    special = _special_ids(tokenizer)
    spans = []
    for k in range(len(turns)):
        start = _common_prefix(prefixes[2 * k], ids)
        end = _common_prefix(prefixes[2 * k + 1], ids)
        spans.append((start, _trim_after_end_of_turn(ids, start, end, special, tokenizer)))
    return ids, spans


def tokenize_chat(
    messages: Sequence[dict], tokenizer, *, loss_on: str | Iterable[str] = "assistant", mask_by: str = "auto"
) -> tuple[list[int], list[int]]:
    """Token ids of one conversation in the tokenizer's chat template, and its loss mask (untruncated).

    Args:
        messages: [{"role", "content"}, ...] with roles in ROLES.
        loss_on: see the module docstring.
        mask_by: "auto" (generation markers when the template has them and every assistant turn is
            trained on, else prefix renders), "prefix" or "markers".

    Raises:
        ChatMaskError: the template fails on the conversation, rewrites earlier turns, or the mask
            comes out all zeros or all ones.
    """
    roles, last_only = parse_loss_on(loss_on)
    if tokenizer.chat_template is None:
        raise ChatMaskError(f"{type(tokenizer).__name__} has no chat_template; conversations need one")
    if mask_by not in ("auto", "prefix", "markers"):
        raise ValueError(f"unknown mask_by {mask_by!r}; expected 'auto', 'prefix' or 'markers'")
    markers = has_generation_markers(tokenizer.chat_template)
    if mask_by == "markers" and not (markers and roles == {"assistant"} and not last_only):
        raise ValueError("mask_by='markers' needs a template with {% generation %} and loss_on='assistant'")
    try:
        full = _render(tokenizer, messages, False)
        if roles is None:
            ids = tokenizer(full, add_special_tokens=False)["input_ids"]
            return ids, [1] * len(ids)
        if mask_by != "prefix" and markers and roles == {"assistant"} and not last_only:
            enc = tokenizer.apply_chat_template(
                list(messages), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, mask = list(enc["input_ids"]), list(enc["assistant_masks"])
        else:
            turns = [i for i, m in enumerate(messages) if m["role"] in roles]
            if last_only:
                turns = turns[-1:]
            ids, spans = _prefix_spans(messages, turns, full, tokenizer)
            mask = [0] * len(ids)
            for start, end in spans:
                mask[start:end] = [1] * (end - start)
    except ChatMaskError as e:
        raise ChatMaskError(f"{e}\n  conversation: {_show(messages)}") from None
    except Exception as e:  # the template's own raise_exception, or a jinja error
        if type(e).__module__.startswith("jinja2") or "TemplateError" in type(e).__name__:
            raise ChatMaskError(f"the chat template failed: {e}\n  conversation: {_show(messages)}") from e
        raise
    if not any(mask) or all(mask):
        what = "no token" if not any(mask) else "every token"
        raise ChatMaskError(
            f"loss mask for loss_on={loss_on!r} covers {what} of the conversation "
            f"({len(ids)} tokens); a chat row needs both prompt and trained tokens\n"
            f"  conversation: {_show(messages)}"
        )
    return ids, mask


def _tokenize_batch(
    batch: dict[str, list], indices: list[int], *, tokenizer, max_length: int, loss_on
) -> dict[str, list]:
    """input_ids / loss_mask per kept row; a chat row the template rejects gives an empty row whose
    `_error` says why (tokenize_rows counts, reports and drops those), `_error` is None otherwise."""
    out: dict[str, list] = {"input_ids": [], "loss_mask": [], "_where": [], "_error": []}

    def emit(ids, mask, where=None, error=None):
        for key, value in zip(out, (ids, mask, where, error)):
            out[key].append(value)

    if "messages" in batch:
        dropped = []
        for index, messages in zip(indices, batch["messages"]):
            try:
                ids, mask = tokenize_chat(messages, tokenizer, loss_on=loss_on)
            except ChatMaskError as e:
                emit([], [], f"row {index}", str(e))
                continue
            ids, mask = ids[:max_length], mask[:max_length]
            mask[0] = 0  # nothing precedes the first token
            if not any(mask):
                dropped.append(index)
                continue
            emit(ids, mask)
        if dropped:
            logger.warning(
                "dropped %d conversations with no trained token left after truncation to %d tokens "
                "(rows %s%s)",
                len(dropped),
                max_length,
                dropped[:10],
                "..." if len(dropped) > 10 else "",
            )
        return out
    for ids in tokenizer(batch["text"], add_special_tokens=True)["input_ids"]:
        for start in range(0, len(ids), max_length):
            window = ids[start : start + max_length]
            if len(window) > 1:
                emit(window, [0] + [1] * (len(window) - 1))
    return out


def _checked_stream(tokens, max_bad_rows: float | int):
    """The good rows of a streamed, tokenised dataset; bad ones counted as load_rows counts them."""
    report = RowsReport("tokenize_rows", failed="could not be tokenised")
    yield from judged_stream(tokens, report, max_bad_rows, ["input_ids", "loss_mask"])


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything about a tokenizer that decides tokenize_rows' output."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body = backend.to_str()
    else:
        body = Hasher.hash(tokenizer)
    extra = json.dumps(
        [type(tokenizer).__name__, tokenizer.chat_template, tokenizer.special_tokens_map],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256((body + extra).encode()).hexdigest()


def tokenize_rows(
    rows,
    tokenizer,
    *,
    max_length: int,
    loss_on: str | Iterable[str] = "assistant",
    max_bad_rows: float | int = 0.01,
    num_proc: int | None = None,
    batch_size: int = 256,
):
    """Tokenise rows from `load_rows` into `input_ids` and `loss_mask` (module docstring).

    Args:
        rows: a Dataset or IterableDataset with a "messages" or a "text" column.
        tokenizer: the target's tokenizer (its chat template is used for conversations).
        max_length: the longest row kept (longer chats are truncated, longer texts windowed).
        loss_on: which tokens are labels for conversations; text rows are always trained on fully.
        max_bad_rows: conversations whose mask cannot be found (ChatMaskError: the template rejects
            them, or their mask is empty) are skipped up to this many (int) or this fraction of the rows
            (float), each reported with its row index and reason; above it, BadRowsError. As in
            load_rows; streamed rows are judged as they arrive.
        num_proc: processes for `datasets.map`.

    Returns:
        The same kind of dataset with columns input_ids (list[int]) and loss_mask (list[int], 0/1),
        cached by fingerprint (a Dataset read from disk is tokenised once).
    """

    if max_length < 2:
        raise ValueError(f"max_length must be at least 2 tokens, got {max_length}")
    check_max_bad_rows(max_bad_rows)
    loss_on = loss_on if isinstance(loss_on, str) else sorted(set(loss_on))
    parse_loss_on(loss_on)
    columns = list(rows.column_names or rows.features or [])
    if "messages" in columns and tokenizer.chat_template is None:
        raise ChatMaskError(f"the rows are conversations but {type(tokenizer).__name__} has no chat_template")
    if "messages" not in columns and "text" not in columns:
        raise ValueError(f"rows need a 'messages' or a 'text' column (see load_rows), got {columns}")
    fn = partial(_tokenize_batch, tokenizer=tokenizer, max_length=max_length, loss_on=loss_on)
    features = Features(
        {
            "input_ids": List(Value("int32")),
            "loss_mask": List(Value("int8")),
            "_where": Value("string"),
            "_error": Value("string"),
        }
    )
    mapped = dict(batched=True, batch_size=batch_size, with_indices=True, remove_columns=columns)
    if isinstance(rows, datasets.IterableDataset):
        tokens = rows.map(fn, features=features, **mapped)
        return datasets.IterableDataset.from_generator(
            _checked_stream,
            features=Features({k: features[k] for k in ("input_ids", "loss_mask")}),
            gen_kwargs={"tokens": tokens, "max_bad_rows": max_bad_rows},
        )
    settings = json.dumps([DATA_FORMAT_VERSION, max_length, loss_on, tokenizer_fingerprint(tokenizer)])
    fingerprint = hashlib.sha256(f"{rows._fingerprint}|tokenize|{settings}".encode()).hexdigest()[:32]
    tokens = rows.map(
        fn, features=features, new_fingerprint=fingerprint, num_proc=num_proc, desc="tokenizing", **mapped
    )
    report = RowsReport("tokenize_rows", rows=len(rows), failed="could not be tokenised")
    return drop_bad_rows(tokens, ["input_ids", "loss_mask"], max_bad_rows, report)
