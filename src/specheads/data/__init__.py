"""The data pipeline: sources -> rows -> tokens with loss masks -> padded or packed batches.

    rows   = load_rows("sharegpt.jsonl")                      # {"messages": [...]} or {"text": str}
    tokens = tokenize_rows(rows, tokenizer, max_length=2048)  # input_ids, loss_mask (cached)
    loader = DataLoader(tokens, batch_size=8, collate_fn=partial(
        collate, pad_token_id=tokenizer.pad_token_id, packing=True, max_length=2048))

`load_rows(source, *, split="train", streaming=False, max_bad_rows=0.01, text_split="document",
config_name=None, cache_dir=None)` -> Dataset | IterableDataset (data/readers.py)
    Plain text (.txt/.md; a document is the whole file by default, or each blank-line-separated
    paragraph, or each line), JSON/JSONL of {"text"}, ShareGPT {"conversations": [{"from", "value"}]},
    OpenAI {"messages": [{"role", "content"}]}, UltraChat ({"data": [str, ...]} or the 200k layout),
    parquet, a directory saved with save_to_disk, a directory or glob of data files, a hub name.
    Rows come out as {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]} or
    {"text": str} (and a "reasoning_content" column where the data has some). A row that cannot be read is counted and reported with its line (`file:17`);
    `max_bad_rows` (int: a count, float: a fraction) decides between skipping and BadRowsError.

`tokenize_rows(rows, tokenizer, *, max_length, loss_on="assistant", max_bad_rows=0.01, num_proc=None,
reasoning="keep")` -> Dataset (data/chat_masks.py)
    Columns input_ids (list[int]) and loss_mask (list[int], 1 where the token is a *label*, i.e. it
    is predicted from positions < t). loss_on: "assistant", "last_assistant", "all", or a set of roles.
    Chat rows use the target's own chat template: assistant tokens come from prefix renders of
    apply_chat_template (token differences) or the template's {% generation %} markers, never from
    splitting strings; the end-of-turn token is a label. A turn that the template renders otherwise
    once later turns follow (Qwen3 drops earlier reasoning) is trained from the render in which it is
    last, a row of its own (`tokenize_chat_rows`). `set_chat_template(tokenizer, chat_template,
    enable_thinking)` gives a base model's tokenizer a template (the recipe's chat_template). Text rows: tokenizer(text) with its special
    tokens, every token a label, long texts cut into max_length windows. Chat rows are truncated on
    the right. The first token of a row is never a label. Cached through datasets fingerprinting.
    A conversation the template rejects, or whose mask comes out empty, is a bad row under the same
    `max_bad_rows` rule as load_rows (counted, reported with its row index and reason, skipped or
    BadRowsError).

`collate(examples, *, pad_token_id, packing, max_length, mask_dtype=torch.float32)` -> dict
(data/packing.py)
    input_ids (B, T) long, loss_mask (B, T) float (0 on padding), position_ids (B, T) long, and
    attention_mask: (B, T) 0/1 padding mask when unpacked (right padding); when packed, an additive
    (B, 1, T, T) mask (0 attend, finfo(mask_dtype).min masked), causal and block-diagonal per document,
    with position_ids restarting at 0 per document. A loss predicting token t + k from position t
    weights by `shift_loss_mask(loss_mask, position_ids, k)`, which is loss_mask[:, t + k] limited to
    the same document.

`distill(rows, target, out, DistillConfig(...))` (data/distillation.py, `specheads distill`)
    Self-distillation: the target regenerates every assistant turn of conversations (from the
    conversation so far, in its chat template), or continues a prompt of each max-length window of a
    text, in seeded batches of generate(). Writes `out/part-*.jsonl` (rows load_rows reads back) chunk
    by chunk with `_`-named records, so an interrupted run resumes to the same bytes; failures are
    counted with their reason under the same `max_bad_rows` rule.

`pack_rows(tokens, *, max_length)` packs a tokenised Dataset ahead of time (constant rows per batch);
its rows go through `collate(..., packing=True)` unchanged.
"""

from specheads.data.chat_masks import (
    ChatMaskError,
    set_chat_template,
    tokenize_chat,
    tokenize_chat_rows,
    tokenize_rows,
)
from specheads.data.packing import collate, document_attention_mask, pack_rows, shift_loss_mask
from specheads.data.readers import BadRowsError, DataSourceError, RowsReport, load_rows
from specheads.data.row_shapes import ROLE_NAMES, normalise_row

__all__ = [
    "ROLE_NAMES",
    "BadRowsError",
    "ChatMaskError",
    "DataSourceError",
    "RowsReport",
    "collate",
    "document_attention_mask",
    "load_rows",
    "normalise_row",
    "pack_rows",
    "shift_loss_mask",
    "set_chat_template",
    "tokenize_chat",
    "tokenize_chat_rows",
    "tokenize_rows",
]
