"""The target's KV cache during tree decoding: the stock `DynamicCache`, and its compaction.

After a tree forward the cache holds past + all N tree nodes, in tree order. Only the accepted path
(root first) belongs to the sequence: compaction copies those nodes' keys and values into place
right after the past, then crops what is left over. The bonus token is not in the cache; it is the
next tree's root.

On transformers 5.x a `DynamicCache` keeps one layer object per decoder layer, with `keys` and
`values` of shape (B, H_kv, S, D_head); 4.4x kept them in `key_cache` / `value_cache` lists. Both
grow by concatenation and `crop(-n)` drops the last n positions on every layer. On 5.x, `new_cache`
swaps the layers for `BufferedLayer`s (kv_buffer.py): the same views, written in place in one buffer per
layer, which compaction moves keys and values of at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def new_cache():
    """An empty `DynamicCache` with a full (unwindowed) layer per decoder layer: on transformers 5.x one
    whose layers keep keys and values in a growing buffer (kv_buffer.py), which a tree step appends to,
    crops and compacts without copying whole layers; on 4.4x the stock one.

    Built *without* `config` on purpose: a config-built cache gives sliding-window models
    `DynamicSlidingWindowLayer`s that drop old positions on their own, which breaks compaction by
    position (a window, where the model has one, is applied by the tree mask instead).
    """
    try:  # lazy: transformers adds seconds to every command's start
        from specheads.decode.kv_buffer import buffered_cache
    except ImportError:  # transformers 4.4x: no cache layers to replace
        from transformers import DynamicCache  # lazy: as above

        return DynamicCache()
    return buffered_cache()


def layer_buffers(cache) -> list[torch.Tensor] | None:
    """`kv_buffer.buffers(cache)`: each layer's (2, B, H_kv, capacity, D) buffer, or None for a stock cache.
    Only called on a cache a forward has filled, so transformers is imported already."""
    if getattr(cache, "layers", None) is None:  # transformers 4.4x
        return None
    from specheads.decode.kv_buffer import buffers  # lazy: transformers (imported by now; see above)

    return buffers(cache)


def position_tensors(cache) -> list[tuple[torch.Tensor, int]]:
    """The tensors holding the cache's positions, each with its position dimension (the batch dimension is
    two before it): a `BufferedLayer`'s buffer, keys and values at once, (2, B, H_kv, capacity, D) at 3; a
    stock layer's keys and its values, (B, H_kv, S, D) at 2. Compaction moves positions in these."""
    buffers = layer_buffers(cache)
    if buffers is not None:
        return [(buffer, 3) for buffer in buffers]
    return [(tensor, 2) for pair in kv_pairs(cache) for tensor in pair]


def kv_pairs(cache) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per initialised layer, each (B, H_kv, S, D_head)."""
    layers = getattr(cache, "layers", None)
    if layers is None:  # transformers 4.4x
        yield from zip(cache.key_cache, cache.value_cache)
        return
    for layer in layers:
        if getattr(layer, "is_sliding", False):
            raise ValueError(
                f"cannot compact a cache with sliding-window layers ({type(layer).__name__}): they drop "
                f"positions on their own. Build the cache with `new_cache()` (DynamicCache() without config)"
            )
        if getattr(layer, "keys", None) is not None and layer.keys.numel() > 0:
            yield layer.keys, layer.values


def compact_cache(cache, past_len: int, path: torch.Tensor) -> None:
    """Keep the accepted nodes' keys/values right after the past; drop the rest of the tree.

    Args:
        cache: the cache after the tree forward, holding past_len + N positions.
        past_len: cached positions before the tree.
        path: (n,) accepted node ids, root first, increasing (node i sits at position past_len + i).

    Afterwards the cache holds past_len + n positions.
    """
    moved = position_tensors(cache)  # the stock layers are checked for sliding windows whatever moves
    total = cache.get_seq_length()
    n = path.numel()
    kept = past_len + n
    # The root (node 0) is in place already, and a path whose ids run 0, 1, ..., n - 1 (they increase, so
    # when the last is n - 1) is all in place: only the other nodes move.
    if n > 1 and int(path[-1]) != n - 1:
        source = past_len + path[1:].to(torch.long)  # (n - 1,) where the accepted nodes are now
        for tensor, dim in moved:
            index = source.to(tensor.device)  # layers may sit on different devices (device_map)
            # index_select copies before the write, so overlapping source and destination are safe.
            tensor.narrow(dim, past_len + 1, n - 1).copy_(tensor.index_select(dim, index))
    if total > kept:
        cache.crop(-(total - kept))
