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

Templates that rewrite earlier turns when the conversation grows (Qwen3 drops the reasoning of turns
before the last user turn and renders them without their `<think>` block; Mistral v3 moves the system
prompt into the last user turn) render a turn differently once later turns follow, so the full render
does not hold it as the target wrote it. `tokenize_chat_rows` (what `tokenize_rows` uses) trains such
a turn from the render in which it is last, `apply_chat_template(messages[:i + 1])`, exactly as the
target saw it when it wrote the turn: the conversation gives the full render, with every turn the
template keeps as it was (always the last one), and one more row for each group of rewritten turns,
the render that ends with the latest of them, holding the turns it keeps as they were. Each turn is a
label in exactly one row. `tokenize_chat` gives the single full render, and refuses a conversation
that needs more. A user or system turn that the template rewrites (loss_on with those roles) cannot
be found; that is a ChatMaskError naming the cause and `loss_on`.

Thinking models: `reasoning` decides what reaches the template of an assistant turn's reasoning (its
`reasoning_content`, or a `<think>...</think>` block opening its content): "keep" (default) passes it
as it is, and the template decides what to render (Qwen3 renders it for the turns after the last user
turn); "drop" removes both, so that the heads train on answers only. `enable_thinking` is the
template's own switch (`set_chat_template`).

A chat row whose mask is all zeros or all ones (before truncation) is a ChatMaskError showing the row.

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
from pathlib import Path

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
REASONING = ("keep", "drop")
DATA_FORMAT_VERSION = 3  # bump when tokenize_rows' output changes, to invalidate cached datasets
_GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
_THINKING_SET = re.compile(r"^\{%- set enable_thinking = (true|false) %\}")
_THINK_BLOCK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)
# what names the settings that give a tokenizer a chat template, in errors
TEMPLATE_SETTINGS = (
    "the recipe key `chat_template: FILE` (or `--chat-template FILE` on distill, eval and compare)"
)
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


def no_template_error(what: str) -> str:
    """The error for conversations given to a tokenizer without a chat template (`what` names it)."""
    return (
        f"{what} has no chat_template (a base model), and conversations need one: give it one with "
        f"{TEMPLATE_SETTINGS}, a .jinja file or the template's text"
    )


def read_chat_template(chat_template: str) -> str:
    """The template text of a `chat_template` setting: a path to a file, or the template itself (text
    holding `{%` or `{{`)."""
    if "{%" in chat_template or "{{" in chat_template:
        return chat_template
    path = Path(chat_template).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"chat_template {chat_template!r}: no such file (give a .jinja file, or the template's text)"
        )
    return path.read_text()


def set_chat_template(tokenizer, chat_template: str = "", enable_thinking: bool | None = None):
    """Give `tokenizer` the chat template of a `chat_template` setting (a file or the template's text;
    "": keep its own), with `enable_thinking` fixed for every render (None: the template's default).

    enable_thinking is set at the head of the template text, so that every render of it, here and
    where the tokenizer goes (distillation, evaluation prompts, a server's tokenizer), passes it the
    same; the tokenizer's fingerprint, and so the cache of tokenised rows, changes with it.

    Raises:
        FileNotFoundError: chat_template names no file.
        ValueError: enable_thinking set for a tokenizer without a template, or one that never reads it.
    """
    if chat_template:
        tokenizer.chat_template = read_chat_template(chat_template)
    if enable_thinking is not None:
        template = tokenizer.chat_template
        if not isinstance(template, str):
            raise ValueError(f"enable_thinking is set but {no_template_error(type(tokenizer).__name__)}")
        if "enable_thinking" not in template:
            raise ValueError(
                "enable_thinking is set but the chat template never reads it (not a thinking model's "
                "template): leave enable_thinking unset, or give the template that reads it (chat_template)"
            )
        flag = "true" if enable_thinking else "false"
        template = _THINKING_SET.sub("", template, count=1)  # set again: the new value, once
        tokenizer.chat_template = f"{{%- set enable_thinking = {flag} %}}" + template
    return tokenizer


def prepared_messages(messages: Sequence[dict], reasoning: str = "keep") -> list[dict]:
    """The turns as the template gets them: a `reasoning_content` of None left out (rows read by
    load_rows hold one for every turn once any has one); with reasoning "drop", every assistant turn
    without its reasoning_content and without a `<think>...</think>` block opening its content."""
    if reasoning not in REASONING:
        raise ValueError(f"unknown reasoning {reasoning!r}; expected one of {REASONING}")
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if not (k == "reasoning_content" and v is None)}
        if reasoning == "drop" and m.get("role") == "assistant":
            m.pop("reasoning_content", None)
            if isinstance(m.get("content"), str):
                m["content"] = _THINK_BLOCK.sub("", m["content"], count=1)
        out.append(m)
    return out


def with_reasoning(messages: Sequence[dict], reasoning: Sequence[str | None] | None) -> list[dict]:
    """load_rows' messages with its `reasoning_content` column put back into the turns."""
    if reasoning is None:
        return list(messages)
    return [{**m, "reasoning_content": r} if r is not None else dict(m) for m, r in zip(messages, reasoning)]


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


def _bounds(tokenizer, messages: Sequence[dict], i: int) -> tuple[str, str]:
    """The renders that bound turn i: what precedes it (with the generation prompt before an assistant
    turn), and the conversation up to and including it (the render in which it is last)."""
    assistant = messages[i]["role"] == "assistant"
    before = _render(tokenizer, messages[:i], assistant) if (assistant or i > 0) else ""
    return before, _render(tokenizer, messages[: i + 1], False)


def _holds(text: str, bounds: tuple[str, str]) -> bool:
    return text.startswith(bounds[0]) and text.startswith(bounds[1])


def _rewritten(i: int, role: str) -> str:
    return (
        f"the chat template renders turn {i} ({role}) differently once later turns follow (it rewrites "
        "earlier turns, e.g. moves the system prompt into the last user turn or drops earlier reasoning)"
    )


def _row(text: str, turns: list[int], bounds: dict, tokenizer) -> tuple[list[int], list[int]]:
    """Token ids of render `text` and its mask over `turns` (each turn's bounds prefixes of `text`)."""
    parts = [b for i in turns for b in bounds[i]]
    encoded = tokenizer([text, *parts], add_special_tokens=False)["input_ids"]
    ids, prefixes = encoded[0], encoded[1:]
    special = _special_ids(tokenizer)
    mask = [0] * len(ids)
    for k in range(len(turns)):
        start = _common_prefix(prefixes[2 * k], ids)
        end = _trim_after_end_of_turn(
            ids, start, _common_prefix(prefixes[2 * k + 1], ids), special, tokenizer
        )
        mask[start:end] = [1] * (end - start)
    return ids, mask


def _prefix_rows(
    messages: Sequence[dict], turns: list[int], full: str, tokenizer, split: bool
) -> list[tuple[list[int], list[int]]]:
    """The rows of a conversation by prefix renders (module docstring): the full render with the turns
    it holds as they were, then (`split`) one row for each group of rewritten turns, the render ending
    with the latest of them; without `split` a rewritten turn is a ChatMaskError."""
    bounds = {i: _bounds(tokenizer, messages, i) for i in turns}
    left = [i for i in turns if not _holds(full, bounds[i])]
    for i in left:
        before, text = bounds[i]
        if messages[i]["role"] == "assistant" and not text.startswith(before):
            raise ChatMaskError(
                f"the chat template renders assistant turn {i} other than it prompts for it: the generation "
                "prompt before it is not how its render begins (with enable_thinking false, Qwen3 prompts "
                "with an empty <think> block, but renders the turn's reasoning in it), so the target would "
                "never have written it: drop the reasoning (reasoning: drop), or leave enable_thinking unset"
            )
    if left and not split:
        i = left[0]
        raise ChatMaskError(
            f"{_rewritten(i, messages[i]['role'])}, so the full render does not hold it as the target "
            "wrote it: tokenize_chat_rows (and so training) gives each such turn a row of its own, the "
            "render in which it is last; or use loss_on='last_assistant', or a template with "
            "{% generation %} markers"
        )
    plan = [(full, [i for i in turns if i not in left])]
    while left:
        last = left[-1]
        role = messages[last]["role"]
        text = bounds[last][1]
        if role != "assistant" or not text.startswith(bounds[last][0]):
            raise ChatMaskError(
                f"{_rewritten(last, role)}, and the render in which it is last does not begin with the "
                "render before it, so its tokens cannot be found: train on assistant turns only (loss_on: "
                "assistant or last_assistant), or give a template that keeps earlier turns as they are "
                "(chat_template)"
            )
        group = [i for i in left if i == last or _holds(text, bounds[i])]
        plan.insert(1, (text, group))
        left = [i for i in left if i not in group]
    plan = plan[1:] + plan[:1]  # in the order of the conversation: the full render last
    return [_row(text, group, bounds, tokenizer) for text, group in plan if group or len(plan) == 1]


def _check_template(tokenizer, mask_by: str, roles, last_only: bool) -> bool:
    """Whether the template's generation markers give the mask; raises on a tokenizer without a
    template or a mask_by it cannot do."""
    if tokenizer.chat_template is None:
        raise ChatMaskError(no_template_error(type(tokenizer).__name__))
    if mask_by not in ("auto", "prefix", "markers"):
        raise ValueError(f"unknown mask_by {mask_by!r}; expected 'auto', 'prefix' or 'markers'")
    markers = has_generation_markers(tokenizer.chat_template) and roles == {"assistant"} and not last_only
    if mask_by == "markers" and not markers:
        raise ValueError("mask_by='markers' needs a template with {% generation %} and loss_on='assistant'")
    return markers and mask_by != "prefix"


def _chat_rows(messages, tokenizer, loss_on, mask_by: str, reasoning: str, split: bool):
    roles, last_only = parse_loss_on(loss_on)
    by_markers = _check_template(tokenizer, mask_by, roles, last_only)
    original, messages = messages, prepared_messages(messages, reasoning)
    try:
        full = _render(tokenizer, messages, False)
        if roles is None:
            ids = tokenizer(full, add_special_tokens=False)["input_ids"]
            return [(ids, [1] * len(ids))]
        if by_markers:
            enc = tokenizer.apply_chat_template(
                list(messages), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            rows = [(list(enc["input_ids"]), list(enc["assistant_masks"]))]
        else:
            turns = [i for i, m in enumerate(messages) if m["role"] in roles]
            if last_only:
                turns = turns[-1:]
            rows = _prefix_rows(messages, turns, full, tokenizer, split)
    except ChatMaskError as e:
        raise ChatMaskError(f"{e}\n  conversation: {_show(original)}") from None
    except Exception as e:  # the template's own raise_exception, or a jinja error
        if type(e).__module__.startswith("jinja2") or "TemplateError" in type(e).__name__:
            raise ChatMaskError(f"the chat template failed: {e}\n  conversation: {_show(original)}") from e
        raise
    labelled = [(ids, mask) for ids, mask in rows if any(mask)]
    if not labelled or any(all(mask) for _, mask in rows):
        ids = rows[-1][0]
        what = "no token" if not labelled else "every token"
        raise ChatMaskError(
            f"loss mask for loss_on={loss_on!r} covers {what} of the conversation "
            f"({len(ids)} tokens); a chat row needs both prompt and trained tokens\n"
            f"  conversation: {_show(original)}"
        )
    return labelled


def tokenize_chat_rows(
    messages: Sequence[dict],
    tokenizer,
    *,
    loss_on: str | Iterable[str] = "assistant",
    mask_by: str = "auto",
    reasoning: str = "keep",
    split: bool = True,
) -> list[tuple[list[int], list[int]]]:
    """The training rows of one conversation, (token ids, loss mask) each, untruncated: its full render,
    and where the template rewrites earlier turns that are trained on, one more row for each group of
    them, the render in which the latest is last (module docstring). Each trained turn is a label in
    exactly one row; rows without a label are left out.

    Args:
        messages: [{"role", "content"}, ...] with roles in ROLES (and an assistant turn's
            reasoning_content, where it has one).
        loss_on: see the module docstring.
        mask_by: "auto" (generation markers when the template has them and every assistant turn is
            trained on, else prefix renders), "prefix" or "markers".
        reasoning: "keep" or "drop" the assistant turns' reasoning (module docstring).
        split: False: the full render alone, and a rewritten turn that is trained on is refused
            (tokenize_chat).

    Raises:
        ChatMaskError: the template fails on the conversation, rewrites an earlier turn that is trained
            on while `split` is False, or a mask comes out all zeros or all ones.
    """
    return _chat_rows(messages, tokenizer, loss_on, mask_by, reasoning, split)


def tokenize_chat(messages: Sequence[dict], tokenizer, **masking) -> tuple[list[int], list[int]]:
    """Token ids of one conversation in the tokenizer's chat template, and its loss mask (untruncated):
    its full render, refused where the template rewrites an earlier turn that is trained on.
    `masking`: tokenize_chat_rows's loss_on, mask_by and reasoning."""
    return tokenize_chat_rows(messages, tokenizer, split=False, **masking)[0]


def _tokenize_batch(
    batch: dict[str, list],
    indices: list[int],
    *,
    tokenizer,
    max_length: int,
    loss_on,
    reasoning: str = "keep",
) -> dict[str, list]:
    """input_ids / loss_mask per kept row (a conversation may give several, tokenize_chat_rows); a chat
    row the template rejects gives an empty row whose `_error` says why (tokenize_rows counts, reports
    and drops those), `_error` is None otherwise."""
    out: dict[str, list] = {"input_ids": [], "loss_mask": [], "_where": [], "_error": []}

    def emit(ids, mask, where=None, error=None):
        for key, value in zip(out, (ids, mask, where, error)):
            out[key].append(value)

    if "messages" in batch:
        dropped = []
        reasonings = batch.get("reasoning_content") or [None] * len(indices)
        for index, messages, reasoning_of in zip(indices, batch["messages"], reasonings):
            try:
                rows = tokenize_chat_rows(
                    with_reasoning(messages, reasoning_of), tokenizer, loss_on=loss_on, reasoning=reasoning
                )
            except ChatMaskError as e:
                emit([], [], f"row {index}", str(e))
                continue
            kept = 0
            for ids, mask in rows:
                ids, mask = ids[:max_length], mask[:max_length]
                mask[0] = 0  # nothing precedes the first token
                if any(mask):
                    emit(ids, mask)
                    kept += 1
            if not kept:
                dropped.append(index)
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
    reasoning: str = "keep",
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
        reasoning: "keep" or "drop" the assistant turns' reasoning (module docstring).

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
    if reasoning not in REASONING:
        raise ValueError(f"unknown reasoning {reasoning!r}; expected one of {REASONING}")
    if "messages" in columns and tokenizer.chat_template is None:
        raise ChatMaskError(f"the rows are conversations but {no_template_error(type(tokenizer).__name__)}")
    if "messages" not in columns and "text" not in columns:
        raise ValueError(f"rows need a 'messages' or a 'text' column (see load_rows), got {columns}")
    fn = partial(
        _tokenize_batch, tokenizer=tokenizer, max_length=max_length, loss_on=loss_on, reasoning=reasoning
    )
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
    settings = [DATA_FORMAT_VERSION, max_length, loss_on, tokenizer_fingerprint(tokenizer)]
    settings = json.dumps(settings + ([reasoning] if reasoning != "keep" else []))
    fingerprint = hashlib.sha256(f"{rows._fingerprint}|tokenize|{settings}".encode()).hexdigest()[:32]
    tokens = rows.map(
        fn, features=features, new_fingerprint=fingerprint, num_proc=num_proc, desc="tokenizing", **mapped
    )
    report = RowsReport("tokenize_rows", rows=len(rows), failed="could not be tokenised")
    return drop_bad_rows(tokens, ["input_ids", "loss_mask"], max_bad_rows, report)
