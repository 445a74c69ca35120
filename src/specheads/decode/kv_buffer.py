"""A cache layer that keeps its keys and values in one buffer with room to grow (`new_cache` builds these).

transformers' `DynamicLayer` grows by concatenation: every forward copies the whole layer to append a few
positions, and a crop slices it anew. Tree decoding appends N positions and crops most of them again on
every step, then moves the accepted ones into place (kv_cache.py). `BufferedLayer` holds both in one tensor,

    buffer (2, B, H_kv, capacity, D_head): [0] the keys, [1] the values; positions [0, length) are real,

writes the new positions in place (the capacity doubles when it runs out), crops by shortening `length`, and
lets compaction move keys and values of a layer in one call (`buffers`). `keys` and `values` are views of the
buffer's real positions, so whatever reads a `DynamicLayer`'s reads these the same.

This module imports transformers at the top: `kv_cache.new_cache` imports it lazily.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class BufferedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values live in one growing buffer (module docstring)."""

    def __init__(self, **kwargs):
        self.buffer: torch.Tensor | None = None
        self.length = 0
        super().__init__(**kwargs)  # sets keys and values to None: no buffer yet

    # keys and values: views, never stored. Setting None (what the base classes do to empty a layer) drops
    # the buffer; any other assignment would detach the layer from its buffer, so it is refused.
    keys = property(lambda self: self._view(0), lambda self, value: self._drop(value, "keys"))
    values = property(lambda self: self._view(1), lambda self, value: self._drop(value, "values"))

    def _view(self, part: int) -> torch.Tensor | None:
        """The buffer's real positions of part 0 (keys) or 1 (values): (B, H_kv, length, D)."""
        return None if self.buffer is None else self.buffer[part, :, :, : self.length]

    def _drop(self, value: torch.Tensor | None, name: str) -> None:
        if value is not None:
            raise AttributeError(f"BufferedLayer.{name} is a view of its buffer: write through update()")
        self.buffer, self.length = None, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device, self.dtype = key_states.device, key_states.dtype
        b, h, _, d = key_states.shape
        self.buffer, self.length = key_states.new_empty(2, b, h, 0, d), 0
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions after the real ones; the layer's keys and values, (B, H_kv, length, D)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self.buffer.shape[3]:
            two, b, h, capacity, d = self.buffer.shape
            grown = self.buffer.new_empty(two, b, h, max(end, 2 * capacity), d)
            grown[:, :, :, :start] = self.buffer[:, :, :, :start]
            self.buffer = grown
        self.buffer[0, :, :, start:end] = key_states
        self.buffer[1, :, :, start:end] = value_states
        self.length = end
        return self.buffer[0, :, :, :end], self.buffer[1, :, :, :end]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last -tokens_to_remove positions (a negative count, as `DynamicLayer.crop` takes)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of positions to remove, got {tokens_to_remove}")
        self.length = max(self.length + tokens_to_remove, 0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.buffer is not None:
            self.buffer = self.buffer[:, indices.to(self.buffer.device)]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.buffer is not None:
            self.buffer = self.buffer.repeat_interleave(repeats, dim=1)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        if self.buffer is not None:
            self.buffer = self.buffer.index_select(1, beam_idx.to(self.buffer.device))

    def offload(self) -> None:
        if self.buffer is not None:
            self.buffer = self.buffer.to("cpu", non_blocking=True)

    def prefetch(self) -> None:
        if self.buffer is not None and self.buffer.device != self.device:
            self.buffer = self.buffer.to(self.device, non_blocking=True)


def buffered_cache():
    """An empty `DynamicCache` whose layers, made as the model first writes to them, are `BufferedLayer`s."""
    cache = DynamicCache()  # without config: a full (unwindowed) layer per decoder layer (kv_cache.new_cache)
    cache.layer_class_to_replicate = BufferedLayer
    return cache


def buffers(cache) -> list[torch.Tensor] | None:
    """Each layer's buffer (2, B, H_kv, capacity, D) when every layer of `cache` is a `BufferedLayer` holding
    one, else None (a stock cache: compaction then moves keys and values apart)."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(
        isinstance(layer, BufferedLayer) and layer.buffer is not None for layer in layers
    ):
        return None
    return [layer.buffer for layer in layers]
