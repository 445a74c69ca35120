"""`specheads distill`: self-distillation, the target rewrites the answers of a dataset in its own words.

    specheads distill --source sharegpt.jsonl --target meta-llama/Llama-3.1-8B-Instruct --out data/sd
    specheads distill --source stdlib --target tiny --out data/stdlib-sd --max-rows 960 --shuffle
    specheads train recipes/tiny/medusa.yaml data=data/stdlib-sd              # train on the output

Draft heads are judged on the target's own outputs, so training them on text the target writes itself,
rather than on what a dataset's authors wrote, is Medusa's self-distillation (EAGLE reports a fixed
dataset nearly as good for its feature-level head). What is regenerated, per *prompt*:

    conversations   every assistant turn in order, each from the conversation so far (earlier answers
                    already regenerated) rendered by the target's chat template (or the one
                    --chat-template gives it, with --enable-thinking) with add_generation_prompt=True; a conversation ending on a user turn gets an answer
                    appended. System and user turns are kept. One prompt = one conversation.
    text            each text is cut into windows of prompt_tokens + max_new_tokens tokens (its
                    tokens with the tokenizer's special ones, as tokenize_rows cuts texts); the target
                    keeps the first prompt_tokens of each window and writes up to max_new_tokens after
                    them. One prompt = one window; a window of at most prompt_tokens tokens (the short
                    tail of a text) is not a prompt.

Decoding: `generate()` in batches of `batch_size` left-padded prompts, greedy at temperature 0, else
sampling with temperature and top_p only (the target's own generation_config sampling settings are
not used). A turn ends at an end token (the target's generation_config eos ids and the tokenizer's
eos), which is not written; answers are decoded without special tokens.

Output: a directory that `load_rows` and a recipe's `data:` read, written chunk by chunk, each chunk's
part then its record (the files: data/distill_folder.py).

Resuming: run the same command again; finished chunks are skipped (counted `skipped`), an unfinished
one is generated again from its start. Batches never cross a chunk and each generate() call is seeded
from (seed, the batch's first prompt, the turn), so a resumed run writes exactly the bytes an
uninterrupted one writes (on the same machine and software, where generate() is deterministic).

Too long: before anything is generated, every conversation is measured at its longest (rendered with
empty answers, plus max_new_tokens per answer) against the target's context and `max_length` (the
length the rows will train at). What happens to one that cannot fit is `long_prompts`: "refuse" stops
the run with their count and the longest (the command's default), "skip" leaves them out, counted in
the summary (`too_long`, --skip-long), "fail" counts each as a failed prompt, never generated.

Failures: a prompt the chat template rejects, one that does not fit the target's context with
max_new_tokens (a later turn whose answers merged into more tokens than measured), or one the target
answers with nothing, is left out, counted with its reason, and
judged by `max_bad_rows` as `load_rows` judges unreadable rows (a count, or a fraction of the prompts
read; above it the run stops with BadRowsError after its last finished chunk).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from specheads.core.atomic import write_text
from specheads.data.chat_masks import no_template_error
from specheads.data.checks import SUMMARY_FILE
from specheads.data.distill_folder import (
    check_settings,
    chunk_record_path,
    content_fingerprint,
    part_path,
    read_chunk_record,
    write_summary,
)
from specheads.data.readers import (
    STREAM_MIN_ROWS,
    BadRowsError,
    RowsReport,
    check_max_bad_rows,
    too_many_bad_rows,
)

DISTILL_VERSION = 1  # bump when the rows written for the same settings change


@dataclass(frozen=True)
class DistillConfig:
    """How the target rewrites a dataset. All but max_bad_rows decide the output."""

    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    max_new_tokens: int = 256  # per answer; for text, the tokens written after each window's prompt
    prompt_tokens: int = 32  # text: the tokens of each window kept as its prompt
    batch_size: int = 16
    chunk_rows: int = 256  # prompts per output part (the unit of resuming)
    seed: int = 0
    max_rows: int | None = None  # distil only the first max_rows prompts
    cache: str = "static"  # generate()'s KV cache: "static" (preallocated; ~2x faster here) or "dynamic"
    max_bad_rows: float | int = 0.01
    max_length: int | None = None  # the training rows' length: a conversation that cannot fit is too long
    # a conversation too long for max_length or the target's context: "refuse" the run before generating,
    # "skip" it (counted as too_long), or "fail" it (a failed prompt, judged by max_bad_rows)
    long_prompts: str = "fail"

    def __post_init__(self):
        check_max_bad_rows(self.max_bad_rows)
        for name in ("max_new_tokens", "prompt_tokens", "batch_size", "chunk_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(
                f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}"
            )
        if self.long_prompts not in ("refuse", "skip", "fail"):
            raise ValueError(f"long_prompts must be 'refuse', 'skip' or 'fail', got {self.long_prompts!r}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {self.max_length}")
        if self.max_rows is not None and self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")
        if self.cache not in ("static", "dynamic"):
            raise ValueError(f"cache must be 'static' or 'dynamic', got {self.cache!r}")


# The `stdlib-distilled` source (train/sources.py): 255-token windows, so that each row with the BOS
# that tokenize_rows adds is one 256-token row of the tiny recipes; greedy, as the decoder is measured.
# max_rows is replaced per run by one epoch of its budget (sources.epoch_rows); 960 is that epoch for
# the tiny recipes (120 steps x batch 8, one process), the size `specheads distill` users copy.
STDLIB_DISTILLED = DistillConfig(prompt_tokens=32, max_new_tokens=223, batch_size=128, max_rows=960)


def settings_of(cfg: DistillConfig) -> dict[str, Any]:
    settings = {k: v for k, v in asdict(cfg).items() if k != "max_bad_rows"}
    # recorded only when they change the output: older folders and caches stay valid ("refuse" writes
    # what "fail" writes, or nothing)
    if settings["max_length"] is None:
        del settings["max_length"]
    if settings["long_prompts"] != "skip":
        del settings["long_prompts"]
    return settings | {"version": DISTILL_VERSION}


# -- prompts --------------------------------------------------------------------------------------


@dataclass
class Prompt:
    """One unit of work: a conversation, or a window of a text (`ids`: its prompt tokens)."""

    index: int
    where: str
    messages: list[dict[str, str]] | None = None
    ids: list[int] | None = None
    unfit: str | None = None  # why it cannot fit, when it fails without being generated (long_prompts="fail")


def prompts_of(rows, tokenizer, cfg: DistillConfig) -> Iterator[Prompt]:
    """The prompts of `rows` (load_rows' {"messages"} or {"text"} rows) in order, numbered from 0."""
    index = 0
    window = cfg.prompt_tokens + cfg.max_new_tokens
    for i, row in enumerate(rows):
        if row.get("messages") is not None:
            yield Prompt(index, f"row {i}", messages=list(row["messages"]))
            index += 1
            continue
        ids = tokenizer(row["text"], add_special_tokens=True)["input_ids"]
        for w, start in enumerate(range(0, len(ids), window)):
            if len(ids) - start > cfg.prompt_tokens:
                yield Prompt(index, f"row {i} window {w}", ids=ids[start : start + cfg.prompt_tokens])
                index += 1


def chunks_of(prompts: Iterator[Prompt], cfg: DistillConfig) -> Iterator[list[Prompt]]:
    """Consecutive chunks of chunk_rows prompts (the last may be short), up to max_rows prompts."""
    chunk: list[Prompt] = []
    for prompt in prompts:
        if cfg.max_rows is not None and prompt.index >= cfg.max_rows:
            break
        chunk.append(prompt)
        if len(chunk) == cfg.chunk_rows:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def positions_needed(tokenizer, prompt: Prompt, cfg: DistillConfig) -> int | None:
    """The tokens a conversation takes once every answer is written at its longest: the conversation
    rendered with empty answers, plus max_new_tokens per answer (None: the template rejects it, which
    the generation reports as a failure)."""
    msgs = [{"role": "assistant", "content": ""} if m["role"] == "assistant" else m for m in prompt.messages]
    if msgs[-1]["role"] != "assistant":
        msgs.append({"role": "assistant", "content": ""})
    try:
        ids = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=False)
    except Exception as e:
        if not _template_error(e):
            raise
        return None
    answers = sum(m["role"] == "assistant" for m in msgs)
    return len(ids) + answers * cfg.max_new_tokens


def fitting_prompts(prompts: list[Prompt], tokenizer, cfg: DistillConfig, limit: int, what: str):
    """(the prompts to distil, [{"index", "where", "tokens"}] of those left out): those that cannot fit
    `limit` positions are refused, skipped, or kept to fail unanswered (`unfit`), as cfg.long_prompts says.

    Raises:
        ValueError: some do not fit and cfg.long_prompts is "refuse"; before anything is generated.
    """
    kept, long = [], []
    for p in prompts:
        needed = positions_needed(tokenizer, p, cfg)
        if needed is not None and needed > limit:
            long.append((p, needed))
            if cfg.long_prompts == "fail":
                p.unfit = f"needs up to {needed} tokens with max_new_tokens={cfg.max_new_tokens} an answer: does not fit {what}"
                kept.append(p)
        else:
            kept.append(p)
    if cfg.long_prompts == "fail":
        return kept, []
    if long and cfg.long_prompts == "refuse":
        worst, needed = max(long, key=lambda item: item[1])
        raise ValueError(
            f"{len(long)} of {len(prompts)} prompts cannot fit {what}: with max_new_tokens="
            f"{cfg.max_new_tokens} an answer, the longest (prompt {worst.index}, {worst.where}) needs "
            f"{needed} tokens. Nothing was generated; pass --skip-long to leave them out (counted in the "
            "summary), or lower --max-new-tokens"
        )
    return kept, [{"index": p.index, "where": p.where, "tokens": n} for p, n in long]


# -- generation -----------------------------------------------------------------------------------


def batch_seed(seed: int, first_index: int, turn: int) -> int:
    """The RNG seed of one generate() call: a function of where it is, never of when it runs."""
    digest = hashlib.sha256(f"specheads-distill|{seed}|{first_index}|{turn}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 2**63


def end_token_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("the target has no end token (generation_config.eos_token_id, tokenizer.eos_token)")
    return ids


def generate_batch(model, prompts: list[list[int]], cfg: DistillConfig, *, pad_id, end_ids, seed):
    """New tokens for each prompt (left padded into one batch), cut before the first end token.

    Returns [(tokens, ended)]: `ended` False when max_new_tokens ran out first.
    """
    from transformers import GenerationConfig  # lazy: transformers adds seconds to every command's start

    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros_like(input_ids)
    for b, ids in enumerate(prompts):
        input_ids[b, width - len(ids) :] = torch.tensor(ids)
        attention_mask[b, width - len(ids) :] = 1
    # Every setting that changes the distribution is pinned: one left None takes the target's
    # generation_config value (a chat model's may set temperature, top_k or a repetition penalty).
    sampling = dict(temperature=cfg.temperature, top_p=cfg.top_p, top_k=0, min_p=0.0, typical_p=1.0)
    config = GenerationConfig(
        max_new_tokens=cfg.max_new_tokens,
        do_sample=cfg.temperature > 0,
        **(sampling if cfg.temperature > 0 else {}),
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=end_ids,
        pad_token_id=pad_id,
        cache_implementation="static" if cfg.cache == "static" else None,
        disable_compile=True,  # a static cache would compile on GPUs, again for every prompt width
    )
    device = model.device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), generation_config=config
        )
    results = []
    for row in out[:, width:].tolist():
        cut = next((t for t, tok in enumerate(row) if tok in end_ids), None)
        results.append((row if cut is None else row[:cut], cut is not None))
    return results


@dataclass(frozen=True)
class Answer:
    """One answer a server wrote: its text (decoded without special tokens, as the in-process path decodes
    its tokens), how many tokens it took, and whether an end token stopped it (else max_new_tokens)."""

    text: str
    tokens: int
    ended: bool


@dataclass(frozen=True)
class FailedAnswer:
    """A request for one answer that failed (the server refused it, or kept failing): the prompt fails."""

    why: str


def read_answer(tokenizer, result) -> tuple[str, int, bool]:
    """(text, new tokens, ended) of one generated answer: a (tokens, ended) pair of generate_batch, or an
    Answer whose text a server decoded."""
    if isinstance(result, Answer):
        return result.text, result.tokens, result.ended
    tokens, ended = result
    return tokenizer.decode(tokens, skip_special_tokens=True), len(tokens), ended


@dataclass
class ChunkResult:
    rows: list[dict[str, Any]]
    failures: list[dict[str, Any]]  # {"index", "where", "why"}
    new_tokens: int = 0
    unfinished: int = 0  # answers cut by max_new_tokens


def _template_error(e: Exception) -> bool:
    return type(e).__module__.startswith("jinja2") or "TemplateError" in type(e).__name__


def _regenerate_conversations(tokenizer, batch: list[Prompt], cfg, gen, context, out: ChunkResult):
    """Every assistant turn of each conversation, in waves: wave j writes each one's j-th answer."""
    turns = []  # per conversation: its messages, None where an answer is to be written
    for p in batch:
        msgs = [None if m["role"] == "assistant" else dict(m) for m in p.messages]
        turns.append(msgs + ([None] if p.messages[-1]["role"] != "assistant" else []))
    failed = {c: p.unfit for c, p in enumerate(batch) if p.unfit is not None}
    capped: set[int] = set()  # conversations with an answer stopped by max_new_tokens before an end token
    for wave in range(max(t.count(None) for t in turns)):
        todo, prompts = [], []
        for c, msgs in enumerate(turns):
            if c in failed or None not in msgs:
                continue
            slot = msgs.index(None)
            try:
                ids = tokenizer.apply_chat_template(
                    msgs[:slot], add_generation_prompt=True, tokenize=True, return_dict=False
                )
            except Exception as e:
                if not _template_error(e):
                    raise
                failed[c] = f"the chat template failed at turn {slot}: {e}"
                continue
            if len(ids) + cfg.max_new_tokens > context:
                failed[c] = (
                    f"turn {slot}: a prompt of {len(ids)} tokens + max_new_tokens={cfg.max_new_tokens} "
                    f"does not fit the target's context of {context} tokens"
                )
                continue
            todo.append((c, slot))
            prompts.append(list(ids))
        if not todo:
            continue
        for (c, slot), result in zip(todo, gen(prompts, seed=batch_seed(cfg.seed, batch[0].index, wave))):
            if isinstance(result, FailedAnswer):
                failed[c] = f"turn {slot}: {result.why}"
                continue
            content, new_tokens, ended = read_answer(tokenizer, result)
            out.new_tokens += new_tokens
            out.unfinished += not ended
            if not ended:
                capped.add(c)
            if not content:
                failed[c] = f"turn {slot}: the target wrote an empty answer"
            turns[c][slot] = {"role": "assistant", "content": content}
    for c, p in enumerate(batch):
        if c in failed:
            out.failures.append({"index": p.index, "where": p.where, "why": failed[c]})
        else:
            out.rows.append(
                {"messages": turns[c], "index": p.index, **({"capped": True} if c in capped else {})}
            )


def _continue_texts(tokenizer, batch: list[Prompt], cfg, gen, out: ChunkResult):
    results = gen([p.ids for p in batch], seed=batch_seed(cfg.seed, batch[0].index, 0))
    for p, result in zip(batch, results):
        if isinstance(result, FailedAnswer):
            out.failures.append({"index": p.index, "where": p.where, "why": result.why})
            continue
        answer, new_tokens, ended = read_answer(tokenizer, result)
        out.new_tokens += new_tokens
        out.unfinished += not ended
        if not answer:
            out.failures.append({"index": p.index, "where": p.where, "why": "the target wrote nothing"})
            continue
        if isinstance(result, Answer):  # a server's text: the prompt's text, then the answer's
            text = tokenizer.decode(p.ids, skip_special_tokens=True) + answer
        else:
            text = tokenizer.decode(p.ids + result[0], skip_special_tokens=True)
        out.rows.append({"text": text, "index": p.index})


def distill_chunk(target, chunk: list[Prompt], cfg: DistillConfig, on_batch=None) -> ChunkResult:
    """The rows (and failures) of one chunk, in batches of cfg.batch_size prompts.

    `on_batch(n)` is called after each batch of n prompts (the progress bar).
    """
    model, tokenizer = target.model, target.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    end_ids = end_token_ids(model, tokenizer)
    context = getattr(model.config, "max_position_embeddings", None) or 10**9

    def gen(prompts, seed):
        return generate_batch(model, prompts, cfg, pad_id=pad_id, end_ids=end_ids, seed=seed)

    return answer_chunk(tokenizer, chunk, cfg, gen, context, cfg.batch_size, on_batch)


def answer_chunk(tokenizer, chunk, cfg: DistillConfig, gen, context: int, batch_size: int, on_batch=None):
    """The rows (and failures) of one chunk, `gen(prompts, seed)` writing the answers of a batch of
    `batch_size` prompts: [(tokens, ended)] (generate_batch), or an Answer or FailedAnswer each (a server)."""
    out = ChunkResult([], [])
    for start in range(0, len(chunk), batch_size):
        batch = chunk[start : start + batch_size]
        if batch[0].messages is not None:
            _regenerate_conversations(tokenizer, batch, cfg, gen, context, out)
        else:
            _continue_texts(tokenizer, batch, cfg, gen, out)
        if on_batch is not None:
            on_batch(len(batch))
    return out


# -- the output directory -------------------------------------------------------------------------


def commit_chunk(out: Path, k: int, chunk: list[Prompt], result: ChunkResult) -> dict:
    """Write chunk k's part, then its record (the part alone does not count as done)."""
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in result.rows)
    write_text(part_path(out, k), lines)
    record = {
        "first_index": chunk[0].index,
        "read": len(chunk),
        "written": len(result.rows),
        "failed": len(result.failures),
        "new_tokens": result.new_tokens,
        "unfinished": result.unfinished,
        "capped": sum(1 for row in result.rows if row.get("capped")),
        "failures": result.failures,
    }
    write_text(chunk_record_path(out, k), json.dumps(record, indent=1))
    return record


# -- the run --------------------------------------------------------------------------------------


def distill(
    rows,
    target,
    out: Path,
    cfg: DistillConfig,
    *,
    source: str = "",
    progress: bool = True,
    chat: dict | None = None,
) -> dict:
    """Regenerate the answers of `rows` with `target` into `out` (module docstring); resumable.

    Args:
        rows: a Dataset from load_rows ({"messages"} or {"text"} rows).
        target: a FrozenTarget with its tokenizer.
        out: the output directory (created; finished chunks in it are kept and skipped).
        source: a name for the rows, recorded in the settings.
        chat: {"chat_template": the template text, "enable_thinking": None, True or False} when the target's
            tokenizer was given them (--chat-template, --enable-thinking: `set_chat_template`), recorded in
            the settings (the template by its sha256), so that a resume with another template is refused.

    Returns:
        The summary also written to `_summary.json`.
    """
    out = Path(out)
    tokenizer = target.tokenizer
    if tokenizer is None:
        raise ValueError(f"target {target.name_or_path!r} has no tokenizer; distillation needs one")
    columns = list(rows.column_names)
    if "messages" in columns and tokenizer.chat_template is None:
        raise ValueError(
            f"the rows are conversations but {no_template_error(f'target {target.name_or_path!r}')}"
        )
    context = getattr(target.config, "max_position_embeddings", None)
    if "text" in columns and context and cfg.prompt_tokens + cfg.max_new_tokens > context:
        raise ValueError(
            f"prompt_tokens + max_new_tokens = {cfg.prompt_tokens + cfg.max_new_tokens} exceeds the target's "
            f"context of {context} tokens"
        )
    if "text" in columns and cfg.max_length and cfg.prompt_tokens + cfg.max_new_tokens > cfg.max_length:
        raise ValueError(
            f"prompt_tokens + max_new_tokens = {cfg.prompt_tokens + cfg.max_new_tokens} exceeds max_length="
            f"{cfg.max_length}"
        )
    if hasattr(target, "settings_record"):  # a target served elsewhere (data/server_distill.py)
        record = target.settings_record()
    else:
        record = target.record().to_dict()
        record.pop("name_or_path")  # the same model copied elsewhere is the same model
    settings = {
        "source": source,
        "source_fingerprint": content_fingerprint(rows),
        "target": record,
        **settings_of(cfg),
    }
    if chat is not None:  # recorded only when given: folders distilled with the target's own template resume
        template = chat.get("chat_template") or ""
        settings["chat_template_sha256"] = hashlib.sha256(template.encode()).hexdigest() if template else None
        settings["enable_thinking"] = chat.get("enable_thinking")
    prompts = prompts_of(rows, tokenizer, cfg)
    too_long: list[dict] = []
    if "messages" in columns:  # text windows have one size, checked above
        limits = [
            (n, w) for n, w in ((cfg.max_length, "max_length"), (context, "the target's context of")) if n
        ]
        if limits:
            limit, name = min(limits)
            prompts = [p for p in prompts if cfg.max_rows is None or p.index < cfg.max_rows]
            what = f"{name} {limit} tokens" if name != "max_length" else f"max_length={limit}"
            prompts, too_long = fitting_prompts(prompts, tokenizer, cfg, limit, what)
    check_settings(out, settings)
    (out / SUMMARY_FILE).unlink(missing_ok=True)

    started = time.perf_counter()
    counts = {"read": 0, "written": 0, "skipped": 0, "failed": 0, "new_tokens": 0, "unfinished": 0}
    records: list[dict] = []
    report = RowsReport(f"distill {source or 'rows'}", failed="failed")
    total = cfg.max_rows if "text" in columns else len(prompts)
    bar = tqdm(total=total, desc="distill", unit="prompt", disable=not progress, dynamic_ncols=True)
    for k, chunk in enumerate(chunks_of(iter(prompts), cfg)):
        done = read_chunk_record(out, k)
        if done is not None and (done["first_index"], done["read"]) != (chunk[0].index, len(chunk)):
            raise ValueError(
                f"{chunk_record_path(out, k)} does not describe chunk {k}; start over with --overwrite"
            )
        if done is not None:
            counts["skipped"] += len(chunk)
            bar.update(len(chunk))
        else:
            chunk_of = getattr(target, "distill_chunk", None) or partial(distill_chunk, target)
            done = commit_chunk(out, k, chunk, chunk_of(chunk, cfg, on_batch=bar.update))
            for key in ("written", "failed", "new_tokens", "unfinished"):
                counts[key] += done[key]
        counts["read"] += len(chunk)
        records.append(done)
        report.rows += done["read"]
        for f in done["failures"]:
            report.add_bad(f"prompt {f['index']} ({f['where']})", f["why"])
        bar.set_postfix(written=counts["written"], skipped=counts["skipped"], failed=counts["failed"])
        judged = isinstance(cfg.max_bad_rows, int) or report.rows >= STREAM_MIN_ROWS
        if judged and too_many_bad_rows(report, cfg.max_bad_rows):
            raise BadRowsError(report, cfg.max_bad_rows)
    bar.close()
    if too_many_bad_rows(report, cfg.max_bad_rows):
        raise BadRowsError(report, cfg.max_bad_rows)
    summary = write_summary(out, counts, records, time.perf_counter() - started)
    summary |= {"too_long": len(too_long), "too_long_prompts": too_long}
    write_text(out / SUMMARY_FILE, json.dumps(summary, indent=1))
    return summary


# -- command line ---------------------------------------------------------------------------------
