"""KV compaction: after a tree forward and compaction the cache is the one a plain forward over
past + accepted path builds, and decoding continues from it exactly."""

import pytest
import torch
from transformers import DynamicCache

from specheads.decode import DraftTree, compact_cache, default_tree, new_cache, tree_inputs

from helpers import tiny_model

VOCAB = 264


def tree_forward(model, prompt, draft, make_cache=new_cache):
    cache = make_cache()
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    inputs = tree_inputs(draft, prompt.shape[1], torch.float32)
    model(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        position_ids=inputs.position_ids,
        past_key_values=cache,
        use_cache=True,
    )
    return cache


def kv(cache):
    return [(layer.keys, layer.values) for layer in cache.layers]


@pytest.mark.parametrize(
    "choices",
    [
        # an accepted path that leaves nodes behind it and between its own nodes
        [(1,), (1, 0), (1, 0, 0)],
        [(0,)],  # node 1 right after the root: nothing moves, the rest is cropped
    ],
    ids=["scattered", "in-place"],
)
@pytest.mark.parametrize("make_cache", [new_cache, DynamicCache], ids=["buffered", "stock"])
def test_compacted_cache_equals_plain_cache_of_the_accepted_path(family, choices, make_cache):
    """In the decoders' cache (a buffer per layer, kv_buffer.py) and in transformers' own."""
    model = tiny_model(family, vocab_size=VOCAB)
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 256, (1, 7), generator=g)
    tree = default_tree("medusa-31")
    draft = DraftTree(torch.randint(0, 256, (1, tree.num_nodes), generator=g), torch.tensor([tree.parents]))
    path = torch.tensor([0, *(tree.choices.index(c) + 1 for c in choices)])
    cache = tree_forward(model, prompt, draft, make_cache)
    compact_cache(cache, past_len=7, path=path)
    assert cache.get_seq_length() == 7 + path.numel()

    sequence = torch.cat([prompt, draft.tokens[:, path]], dim=1)
    reference = new_cache()
    model(input_ids=sequence, past_key_values=reference, use_cache=True)
    for (k, v), (k_ref, v_ref) in zip(kv(cache), kv(reference)):
        torch.testing.assert_close(k, k_ref, atol=1e-5, rtol=0)
        torch.testing.assert_close(v, v_ref, atol=1e-5, rtol=0)

    # and decoding goes on from it as from the plain cache
    more = torch.randint(0, 256, (1, 3), generator=g)
    logits = model(input_ids=more, past_key_values=cache, use_cache=True).logits
    expected = model(input_ids=torch.cat([sequence, more], dim=1)).logits[:, -3:]
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)


def test_crop_only_when_something_must_go(monkeypatch):
    model = tiny_model("llama", vocab_size=VOCAB)
    prompt = torch.randint(0, 256, (1, 5))
    chain = DraftTree(torch.randint(0, 256, (1, 4)), torch.tensor([[-1, 0, 1, 2]]))
    crops = []

    cache = tree_forward(model, prompt, chain)
    monkeypatch.setattr(cache, "crop", lambda n: crops.append(n))
    compact_cache(cache, 5, torch.arange(4))  # the whole chain accepted: nothing to drop
    assert crops == [] and cache.get_seq_length() == 9

    cache = tree_forward(model, prompt, chain)
    original_crop = cache.crop
    monkeypatch.setattr(cache, "crop", lambda n: (crops.append(n), original_crop(n)))
    compact_cache(cache, 5, torch.arange(2))
    assert crops == [-2] and cache.get_seq_length() == 7


def test_config_built_cache_has_sliding_layers_and_compaction_refuses_it():
    """DynamicCache(config=...) gives a sliding-window model layers that drop positions on their own;
    `new_cache()` is built without config and keeps every position (the window lives in the mask)."""
    model = tiny_model("mistral", vocab_size=VOCAB, sliding_window=4)
    prompt = torch.randint(0, 256, (1, 9))
    config_built = DynamicCache(config=model.config)
    model(input_ids=prompt, past_key_values=config_built, use_cache=True)
    assert all(layer.is_sliding for layer in config_built.layers)
    with pytest.raises(ValueError, match="sliding-window layers.*new_cache"):
        compact_cache(config_built, 9, torch.arange(1))

    ours = new_cache()
    model(input_ids=prompt, past_key_values=ours, use_cache=True)
    assert not any(layer.is_sliding for layer in ours.layers)
    assert all(layer.keys.shape[-2] == 9 for layer in ours.layers)
