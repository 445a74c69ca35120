"""The decoders' cache layer (decode/kv_buffer.py): keys and values in one buffer per layer, written in place,
read as the stock `DynamicLayer`'s are. Whatever a decoder does to a cache (prefill, tree forwards, crops,
compaction, dropping rows) leaves a buffered cache equal to transformers' own, forward outputs included."""

import pytest
import torch
from transformers import DynamicCache

from specheads.decode import compact_cache, new_cache
from specheads.decode.batched_inputs import compact_rows, select_cache_rows
from specheads.decode.kv_buffer import BufferedLayer, buffers

from helpers import tiny_model

VOCAB = 264


def assert_same(cache, reference):
    assert cache.get_seq_length() == reference.get_seq_length()
    for layer, ref in zip(cache.layers, reference.layers, strict=True):
        assert torch.equal(layer.keys, ref.keys) and torch.equal(layer.values, ref.values)


def test_new_cache_buffers_its_layers():
    model = tiny_model("llama", vocab_size=VOCAB)
    cache = new_cache()
    model(input_ids=torch.randint(0, 256, (2, 5)), past_key_values=cache, use_cache=True)
    assert len(cache.layers) == model.config.num_hidden_layers
    assert all(isinstance(layer, BufferedLayer) for layer in cache.layers)
    assert [tuple(b.shape[:3]) for b in buffers(cache)] == [(2, 2, model.config.num_key_value_heads)] * len(
        cache.layers
    )
    assert buffers(DynamicCache()) is None


def test_a_buffered_cache_follows_the_stock_one_through_a_decoders_life():
    """Prefill, tree forwards past the buffer's capacity, compaction, crops and dropped rows: the same keys,
    values and logits as transformers' DynamicCache given the same calls."""
    model = tiny_model("llama", vocab_size=VOCAB)
    g = torch.Generator().manual_seed(0)
    caches = [new_cache(), DynamicCache()]
    prompt = torch.randint(0, 256, (3, 6), generator=g)
    outs = [model(input_ids=prompt, past_key_values=c, use_cache=True).logits for c in caches]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    capacity = buffers(caches[0])[0].shape[3]
    for step in range(6):
        past, rows = caches[0].get_seq_length(), caches[0].layers[0].keys.shape[0]
        block = torch.randint(0, 256, (rows, 5), generator=g)
        positions = torch.arange(past, past + 5).expand(rows, -1)
        outs = [
            model(input_ids=block, position_ids=positions, past_key_values=c, use_cache=True).logits
            for c in caches
        ]
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
        assert_same(*caches)
        if rows == 1:  # one row: the batch-1 copy
            for c in caches:
                compact_cache(c, past, torch.tensor([0, 2, 4]))
        else:  # ragged rows, each after its own tokens
            columns = torch.tensor([[0, 3, 4], [0, 1, 0], [0, 2, 0]])[:rows]
            counts, start = torch.tensor([3, 1, 2])[:rows], torch.tensor([past, past - 1, past - 2])[:rows]
            for c in caches:
                compact_rows(c, past, columns, counts, start)
        assert_same(*caches)
        if step == 2:
            for c in caches:
                select_cache_rows(c, torch.tensor([1]), total=past + 1)
            assert_same(*caches)
    assert buffers(caches[0])[0].shape[3] > capacity  # it grew, and kept what it held


def test_crop_reset_and_assignment():
    layer = BufferedLayer()
    keys, values = torch.randn(1, 2, 4, 3), torch.randn(1, 2, 4, 3)
    out_k, out_v = layer.update(keys, values)
    assert torch.equal(out_k, keys) and torch.equal(out_v, values) and layer.get_seq_length() == 4
    layer.crop(-3)
    assert layer.get_seq_length() == 1 and torch.equal(layer.keys, keys[:, :, :1])
    with pytest.raises(ValueError, match="negative count"):
        layer.crop(2)
    with pytest.raises(AttributeError, match="view of its buffer"):
        layer.keys = keys
    layer.reset()
    assert layer.keys is None and layer.get_seq_length() == 0 and not layer.is_initialized
    layer.update(values, keys)  # starts afresh
    assert torch.equal(layer.keys, values) and torch.equal(layer.values, keys)
