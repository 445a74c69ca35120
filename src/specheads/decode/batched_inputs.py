"""Batch layout for speculative decoding of B rows at once: left padding, ragged lengths, masks, compaction.

One KV cache holds every live row, (B, H_kv, S, D) per layer with S = max_b length_b. Row b's slots:

    [0, pad_b)              its prompt's left padding (never attended to)
    [pad_b, length_b)       its real tokens in order (prompt, then every accepted token); slot j holds
                            position j - pad_b, so positions count real tokens only, as in HF `generate`
                            with left padding
    [length_b, S)           stale: left behind when the row accepted fewer tokens than another row
                            (never attended to; overwritten when the row accepts more)

A forward appends a block of Q columns at slots [S, S + Q) for every row (the padded prompt, a draft
tree, or a draft head's new entries). Each query attends to its row's real slots and to the block
columns `block_allowed` lets it see, through an additive mask (B, 1, Q, S + Q) whose last dimension is
the real KV length (tree_inputs.py explains why it must be additive and full length). Afterwards
`compact_rows` copies each row's kept columns (n_b of them, e.g. its accepted path) to
[length_b, length_b + n_b) and crops the cache to max_b (length_b + n_b). Stale slots therefore never
pile up: row b has S - length_b of them, the spread of the rows' lengths.

Rows that finish leave the batch (`select_cache_rows`), and the cache is cropped to its longest live row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specheads.decode.kv_cache import compact_cache, position_tensors
from specheads.decode.tree_inputs import Mask, TreeInputs, Window, additive_mask, per_layer_type
from specheads.decode.trees import DraftTree


@dataclass
class Layout:
    """Where each live row's tokens sit in the shared cache (module docstring).

    pad:    (B,) int64 left-padding slots of each row's prompt.
    length: (B,) int64 end of each row's real slots: its tokens fill [pad_b, length_b).
    """

    pad: torch.Tensor
    length: torch.Tensor

    @classmethod
    def contiguous(cls, length: int, batch: int = 1, device: torch.device | str | None = None) -> Layout:
        """`batch` rows of `length` real slots each, no padding: one prompt's cache is this with batch 1."""
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        return cls(pad=zeros, length=zeros + length)

    @property
    def total(self) -> int:
        """S: the cache length this layout needs (its longest row)."""
        return int(self.length.max()) if self.length.numel() else 0

    @property
    def root_positions(self) -> torch.Tensor:
        """(B,) real tokens cached per row: the position of the token after them (the root)."""
        return self.length - self.pad

    def real_slots(self, total: int) -> torch.Tensor:
        """(B, total) bool: which of the first `total` slots hold a row's real tokens."""
        slots = torch.arange(total, device=self.length.device)
        return (slots >= self.pad[:, None]) & (slots < self.length[:, None])

    def slot_positions(self, total: int) -> torch.Tensor:
        """(B, total) the position held by each slot (meaningless, but >= 0, where no real token is)."""
        slots = torch.arange(total, device=self.length.device)
        return (slots - self.pad[:, None]).clamp(min=0)

    def select(self, rows: torch.Tensor) -> Layout:
        return Layout(pad=self.pad[rows], length=self.length[rows])


# -- prompts ------------------------------------------------------------------------------------------


def left_pad(prompts: Sequence[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack prompts of different lengths, padded on the left as HF `generate` wants them.

    Args:
        prompts: each (T_b,) or (1, T_b) token ids, T_b >= 1.
        pad_token_id: the id written into the padding (never attended to).

    Returns:
        input_ids (B, T) and attention_mask (B, T) int64, 0 on padding, T = max_b T_b.
    """
    rows = []
    for i, p in enumerate(prompts):
        if p.ndim == 2 and p.shape[0] == 1:
            p = p[0]
        if p.ndim != 1 or p.numel() == 0:
            raise ValueError(f"prompt {i} must be (T,) or (1, T) with T >= 1, got shape {tuple(p.shape)}")
        rows.append(p)
    if not rows:
        raise ValueError("left_pad needs at least one prompt")
    width = max(p.numel() for p in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long, device=rows[0].device)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long, device=rows[0].device)
    for b, p in enumerate(rows):
        input_ids[b, width - p.numel() :] = p
        attention_mask[b, width - p.numel() :] = 1
    return input_ids, attention_mask


def left_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) 0/1 padding mask -> (B,) padding per row; raises unless every row is zeros then ones."""
    if attention_mask.ndim != 2:
        raise ValueError(f"attention_mask must be (B, T), got shape {tuple(attention_mask.shape)}")
    real = attention_mask.bool()
    empty = (~real.any(1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"attention_mask rows {empty} are all padding: every prompt needs a token")
    pad = (~real).sum(1)
    expected = torch.arange(real.shape[1], device=real.device) >= pad[:, None]
    bad = (real != expected).any(1).nonzero().flatten().tolist()
    if bad:
        raise ValueError(
            f"attention_mask row {bad[0]} is not left padding (zeros, then ones): "
            f"{attention_mask[bad[0]].tolist()}; pad prompts on the left (see left_pad)"
        )
    return pad


# -- masks and positions --------------------------------------------------------------------------------


def block_attention(
    layout: Layout,
    past: int,
    block_allowed: torch.Tensor,
    query_positions: torch.Tensor,
    window: int | None = None,
) -> torch.Tensor:
    """(B, Q, past + Q) bool: what a block of Q queries appended after `past` cached slots may see.

    Args:
        layout: the rows' real slots among the `past` cached ones.
        block_allowed: (B, Q, Q) which block columns each query sees (causal, or tree ancestors).
        query_positions: (B, Q) the queries' positions (for `window`).
        window: a sliding window: a key at position k is seen from position q only if q - k < window.
    """
    b, q = query_positions.shape
    allowed = torch.cat([layout.real_slots(past)[:, None].expand(b, q, past), block_allowed], dim=-1)
    if window is not None:
        key_positions = torch.cat([layout.slot_positions(past), query_positions], dim=-1)  # (B, past + Q)
        allowed &= (query_positions[:, :, None] - key_positions[:, None, :]) < window
    return allowed


def prefill_inputs(
    attention_mask: torch.Tensor, dtype: torch.dtype, window: Window = None
) -> tuple[Layout, Mask, torch.Tensor]:
    """The layout after prefilling left-padded prompts, and the prefill's mask and positions.

    Returns:
        layout: pad_b = the row's padding, length_b = T.
        mask: (B, 1, T, T) additive; causal over the row's real tokens (a padding query sees itself,
            so that no softmax row is empty); one per layer type when `window` is a dict.
        position_ids: (B, T) slot - pad_b (0 on padding).
    """
    pad = left_padding(attention_mask)
    b, t = attention_mask.shape
    device = attention_mask.device
    layout = Layout(pad=pad, length=torch.full((b,), t, dtype=torch.long, device=device))
    positions = layout.slot_positions(t)
    columns = torch.arange(t, device=device)
    causal = columns[:, None] >= columns[None, :]  # (T, T)
    real = columns[None, :] >= pad[:, None]  # (B, T) keys that are real tokens
    block = (causal & real[:, None, :]) | torch.eye(t, dtype=torch.bool, device=device)
    empty = Layout(pad=pad, length=torch.zeros_like(pad))
    mask = per_layer_type(
        window, lambda w: additive_mask(block_attention(empty, 0, block, positions, w), dtype)
    )
    return layout, mask, positions


def batched_tree_inputs(
    tree: DraftTree, layout: Layout, past: int, dtype: torch.dtype, window: Window = None
) -> TreeInputs:
    """Inputs for one target forward over B trees (one per row, N nodes each) after `past` slots.

    Node i of row b sits at position root_positions_b + depth_i and sees the row's real slots and its
    own ancestors: mask (B, 1, N, past + N), one per layer type when `window` is a dict.
    """
    positions = layout.root_positions[:, None] + tree.depths  # (B, N)
    mask = per_layer_type(window, lambda w: tree_mask(tree, layout, past, positions, dtype, w))
    return TreeInputs(input_ids=tree.tokens, attention_mask=mask, position_ids=positions)


def tree_mask(
    tree: DraftTree,
    layout: Layout,
    past: int,
    positions: torch.Tensor,
    dtype: torch.dtype,
    window: int | None,
) -> torch.Tensor:
    """(B, 1, N, past + N) additive: each node sees its row's real slots (those fewer than `window` positions
    behind it, with a window) and its ancestors."""
    if window is not None:
        return additive_mask(block_attention(layout, past, tree.ancestors, positions, window), dtype)
    # the same mask from its two parts: each row's real slots, the same for every node; the tree
    b, n = tree.tokens.shape
    mask = torch.zeros(b, 1, n, past + n, dtype=dtype, device=tree.tokens.device)
    if b > 1 or int(layout.pad[0]) > 0 or int(layout.length[0]) < past:  # some slots hold no token
        hidden_slots = ~layout.real_slots(past)[:, None, None]  # (B, 1, 1, past)
        mask[..., :past].masked_fill_(hidden_slots.to(mask.device), torch.finfo(dtype).min)
    mask[..., past:] = tree_block_mask(tree, dtype)
    return mask


def tree_block_mask(tree: DraftTree, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, N, N) additive: each node sees its ancestors and itself; built once per static tree shape."""
    shape = tree.static_shape
    if shape is None:
        return additive_mask(tree.ancestors, dtype)
    if dtype not in shape.masks:
        shape.masks[dtype] = additive_mask(shape.ancestors, dtype)
    return shape.masks[dtype].expand(tree.tokens.shape[0], -1, -1, -1)


# -- the cache --------------------------------------------------------------------------------------------


def pad_rows(rows: Sequence[torch.Tensor], fill: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged 1-D tensors -> (B, M) right-padded with `fill`, and (B,) their lengths."""
    counts = torch.tensor([r.numel() for r in rows], dtype=torch.long, device=rows[0].device)
    if len(rows) == 1:  # one row (single-prompt decoding, every step): nothing to pad
        return rows[0][None], counts
    out = torch.full((len(rows), int(counts.max())), fill, dtype=rows[0].dtype, device=rows[0].device)
    for b, r in enumerate(rows):
        out[b, : r.numel()] = r
    return out, counts


def compact_rows(cache, past: int, columns: torch.Tensor, counts: torch.Tensor, start: torch.Tensor) -> int:
    """Move each row's kept block columns into place and crop the cache; returns its new length.

    Args:
        cache: holding `past` slots, then the block the last forward appended.
        past: slots before the block.
        columns: (B, M) block columns to keep per row, in order (e.g. the accepted path, root first);
            entries past counts[b] are ignored.
        counts: (B,) columns kept per row.
        start: (B,) where row b's first kept column goes (its length before the block).

    Row b's column columns[b, i] moves to slot start_b + i, for i < counts_b; the cache is then cropped
    to max_b (start_b + counts_b). Every gather happens before any write, so sources and destinations
    may overlap.
    """
    if columns.shape[0] == 1 and int(start[0]) == past:  # one row right after its past: the plain copy
        compact_cache(cache, past, columns[0, : int(counts[0])])
        return past + int(counts[0])
    m = columns.shape[1]
    offsets = torch.arange(m, device=columns.device)
    destination = start[:, None] + offsets  # (B, M)
    kept = offsets < counts[:, None]
    source = torch.where(kept, past + columns, destination)  # an ignored entry copies a slot onto itself
    if not torch.equal(source, destination):
        for tensor, dim in position_tensors(cache):
            index = [1] * tensor.ndim  # (B, M) along the batch and position dimensions
            index[dim - 2], index[dim] = source.shape
            shape = [*tensor.shape[:dim], m, *tensor.shape[dim + 1 :]]
            src = source.to(tensor.device).view(index).expand(shape)  # e.g. (B, H_kv, M, D)
            dst = destination.to(tensor.device).view(index).expand(shape)
            tensor.scatter_(dim, dst, tensor.gather(dim, src))
    total, new_total = cache.get_seq_length(), int((start + counts).max())
    if total > new_total:
        cache.crop(-(total - new_total))
    return new_total


def select_cache_rows(cache, rows: torch.Tensor, total: int | None = None) -> None:
    """Keep only batch `rows` (indices, in order) of `cache`; crop it to `total` slots when given."""
    cache.batch_select_indices(rows)
    length = cache.get_seq_length()
    if total is not None and length > total:
        cache.crop(-(length - total))
