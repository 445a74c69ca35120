"""Batches: padding, or packing several documents into one row with document-aware attention.

`collate` turns tokenised examples ({"input_ids", "loss_mask"}, from `tokenize_rows`) into tensors:

    input_ids       (B, T) long     padded with pad_token_id on the right
    loss_mask       (B, T) float    1 where the token is a label (predicted from positions < t); 0 on padding
    position_ids    (B, T) long     0, 1, 2, ... restarting at 0 for every document
    attention_mask  unpacked: (B, T) long, 1 = token, 0 = padding
                    packed:   (B, 1, T, T) additive float, 0 = attend, finfo(dtype).min = masked;
                              causal and block-diagonal per document, so no document sees another

A packed row holds whole documents one after another (first-fit decreasing into rows of at most
`max_length` tokens). Padding keys are masked for every token; each padding query attends only to
itself so that no row of the mask is fully masked (a fully masked row turns into NaN in kernels that
meet -inf, and a float16/bfloat16 cast of finfo(float32).min is -inf).

Documents are told apart by their positions, so a loss that predicts token t + k from position t
must not cross into the next document: `shift_loss_mask(loss_mask, position_ids, k)` gives the
weights for that (k = 1: the target's next token / EAGLE; k = 2 + i: Medusa head i).

Stock HF models take the 4D float mask as it is (transformers 5.23, Llama / Qwen2 / Mistral, sdpa and
eager: packed logits equal unpacked ones, tests/train/test_data_packing.py); pass `position_ids` with
it. Two look-alikes are wrong: a *boolean* 4D mask is added as 0/1 under eager, and position_ids
alone (attention_mask=None) isolates documents only with use_cache=False, because the model's own
cache turns off transformers' packed-sequence detection. `mask_dtype` casts the mask to the model's
dtype; on CPU an fp32 mask also works with bf16/fp16 models (CUDA kernels were not checked here).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import partial

import torch
from datasets import Features, List, Value

PACKING_VERSION = 1  # bump when pack_rows' output changes, to invalidate cached datasets


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of indices (each bin's lengths sum to <= capacity), longest items placed first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        if lengths[i] > capacity:
            raise ValueError(
                f"an example of {lengths[i]} tokens is longer than max_length={capacity}; "
                "tokenize with the same max_length"
            )
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return [sorted(b) for b in bins]


def document_attention_mask(
    position_ids: torch.Tensor, padding: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Additive (B, 1, T, T) mask: causal within each document, nothing across documents.

    A document starts wherever position_ids is 0. `padding` (B, T) is True on padding tokens, which
    attend only to themselves and are never attended to.
    """
    B, T = position_ids.shape
    doc = torch.cumsum(position_ids == 0, dim=1)  # (B, T) document number, from 1
    pad_ids = -torch.arange(1, T + 1, device=doc.device).expand(B, T)  # a document of its own each
    doc = torch.where(padding, pad_ids, doc)
    causal = torch.ones(T, T, dtype=torch.bool, device=doc.device).tril()
    allowed = (doc[:, :, None] == doc[:, None, :]) & causal  # (B, T, T) query x key
    mask = torch.zeros(B, 1, T, T, dtype=dtype, device=doc.device)
    return mask.masked_fill(~allowed[:, None], torch.finfo(dtype).min)


def shift_loss_mask(loss_mask: torch.Tensor, position_ids: torch.Tensor, offset: int) -> torch.Tensor:
    """(B, T) weights for predicting token t + offset from position t.

    [b, t] = loss_mask[b, t + offset] when token t + offset is in the same document as t (positions
    restart at 0 per document, so that is position_ids[t + offset] == position_ids[t] + offset);
    0 for the last `offset` positions.
    """
    if offset < 1:
        raise ValueError(f"offset must be >= 1, got {offset}")
    out = torch.zeros_like(loss_mask)
    if offset < loss_mask.shape[1]:
        same_doc = position_ids[:, offset:] == position_ids[:, :-offset] + offset
        out[:, :-offset] = loss_mask[:, offset:] * same_doc.to(loss_mask.dtype)
    return out


def label_positions(
    loss_mask: torch.Tensor, position_ids: torch.Tensor, offsets: list[int]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each offset, (b, t) of the positions with a label that far ahead (shift_loss_mask > 0), in
    row-major order, as `nonzero(as_tuple=True)` gives them.

    One read on the host for all offsets: on a GPU every `nonzero` waits for all the work queued before
    it, and the heads' losses need positions for each head or test step. The masks are stacked and
    read once (a GPU's one synchronisation here), and the indices go back without waiting (pageable
    host memory is staged at once, so a non-blocking copy of it is safe).
    """
    masks = torch.stack([shift_loss_mask(loss_mask, position_ids, o) > 0 for o in offsets])  # (K, B, T)
    host = masks.cpu()
    idx, counts = host.nonzero(), host.sum((1, 2)).tolist()  # idx (M, 3): offset's index, b, t
    if masks.device.type != "cpu":
        idx = idx.to(masks.device, non_blocking=True)
    return [(part[:, 1], part[:, 2]) for part in idx.split(counts)]


def _rows_from(examples: list[dict], packing: bool, max_length: int) -> list[list[dict]]:
    """Group the examples into rows (lists of documents)."""
    prepacked = ["position_ids" in ex for ex in examples]
    if any(prepacked):
        if not all(prepacked) or not packing:
            raise ValueError("rows from pack_rows (with position_ids) need packing=True and no other rows")
        for ex in examples:
            if len(ex["input_ids"]) > max_length:
                raise ValueError(f"a packed row of {len(ex['input_ids'])} tokens is longer than {max_length}")
        return [[ex] for ex in examples]
    if not packing:
        for ex in examples:
            if len(ex["input_ids"]) > max_length:
                raise ValueError(
                    f"an example of {len(ex['input_ids'])} tokens is longer than max_length={max_length}; "
                    "tokenize with the same max_length"
                )
        return [[ex] for ex in examples]
    bins = first_fit_decreasing([len(ex["input_ids"]) for ex in examples], max_length)
    return [[examples[i] for i in b] for b in bins]


def collate(
    examples: list[dict],
    *,
    pad_token_id: int,
    packing: bool,
    max_length: int,
    mask_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.Tensor]:
    """Pad (or pack, then pad) tokenised examples into a batch (module docstring for the tensors).

    Args:
        examples: dicts with input_ids and loss_mask (lists), from tokenize_rows or pack_rows.
        pad_token_id: the id written into padding.
        packing: pack several examples per row with a document mask; else one example per row.
        max_length: the longest row.
        mask_dtype: dtype of the packed 4D mask (use the model's).
    """
    if not examples:
        raise ValueError("collate got no examples")
    rows = _rows_from(examples, packing, max_length)
    B, T = len(rows), max(sum(len(d["input_ids"]) for d in row) for row in rows)
    input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    loss_mask = torch.zeros(B, T, dtype=torch.float32)
    position_ids = torch.zeros(B, T, dtype=torch.long)
    padding = torch.ones(B, T, dtype=torch.bool)
    for b, row in enumerate(rows):
        t = 0
        for doc in row:
            n = len(doc["input_ids"])
            input_ids[b, t : t + n] = torch.as_tensor(doc["input_ids"], dtype=torch.long)
            loss_mask[b, t : t + n] = torch.as_tensor(doc["loss_mask"], dtype=torch.float32)
            if "position_ids" in doc:
                position_ids[b, t : t + n] = torch.as_tensor(doc["position_ids"], dtype=torch.long)
            else:
                position_ids[b, t : t + n] = torch.arange(n)
            t += n
        padding[b, :t] = False
    if not packing:
        position_ids = torch.arange(T).expand(B, T).clone()  # HF's default positions, padding included
        return {
            "input_ids": input_ids,
            "loss_mask": loss_mask,
            "position_ids": position_ids,
            "attention_mask": (~padding).long(),
        }
    return {
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "attention_mask": document_attention_mask(position_ids, padding, mask_dtype),
    }


def _pack_batch(batch: dict[str, list], *, max_length: int) -> dict[str, list]:
    out: dict[str, list] = {"input_ids": [], "loss_mask": [], "position_ids": []}
    for b in first_fit_decreasing([len(ids) for ids in batch["input_ids"]], max_length):
        out["input_ids"].append([t for i in b for t in batch["input_ids"][i]])
        out["loss_mask"].append([m for i in b for m in batch["loss_mask"][i]])
        out["position_ids"].append([p for i in b for p in range(len(batch["input_ids"][i]))])
    return out


def pack_rows(rows, *, max_length: int, batch_size: int = 1000, num_proc: int | None = None):
    """Pack a tokenised Dataset into rows of whole documents, each at most `max_length` tokens.

    Documents are packed first-fit decreasing within each group of `batch_size` examples. The result
    has input_ids, loss_mask and position_ids (restarting per document); `collate(..., packing=True)`
    pads it and builds the document mask, so every batch has the same number of rows.
    """

    features = Features(
        {
            "input_ids": List(Value("int32")),
            "loss_mask": List(Value("int8")),
            "position_ids": List(Value("int32")),
        }
    )
    settings = json.dumps([PACKING_VERSION, max_length, batch_size])
    fingerprint = hashlib.sha256(f"{rows._fingerprint}|pack|{settings}".encode()).hexdigest()[:32]
    return rows.map(
        partial(_pack_batch, max_length=max_length),
        batched=True,
        batch_size=batch_size,
        remove_columns=rows.column_names,
        features=features,
        new_fingerprint=fingerprint,
        num_proc=num_proc,
        desc="packing",
    )
