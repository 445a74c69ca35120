"""Tree inputs on stock HF models: the logits over a tree equal plain forwards of each root-to-leaf
path, for every family, under sdpa and eager, with and without a sliding window; and the traps."""

import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.decode import (
    DraftTree,
    MedusaDrafter,
    SpeculativeDecoder,
    attention_window,
    check_attention_implementation,
    default_tree,
    new_cache,
    tree_attention_mask,
    tree_inputs,
    tree_position_ids,
)
from specheads.heads import MedusaConfig, MedusaHeads

from helpers import tiny_model

VOCAB = 264
MIN = torch.finfo(torch.float32).min


def random_draft(tree_name="medusa-15", seed=0) -> DraftTree:
    tree = default_tree(tree_name)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 256, (1, tree.num_nodes), generator=g)
    return DraftTree(tokens=tokens, parents=torch.tensor([tree.parents]))


def forward_tree(model, prompt, draft, window=None, mask=None):
    """Prefill `prompt` into a fresh cache, then one forward over the tree; returns (logits (N, V), cache)."""
    cache = new_cache()
    model(input_ids=prompt, past_key_values=cache, use_cache=True)
    inputs = tree_inputs(draft, prompt.shape[1], torch.float32, window)
    out = model(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask if mask is None else mask,
        position_ids=inputs.position_ids,
        past_key_values=cache,
        use_cache=True,
    )
    return out.logits[0], cache


def leaf_paths(draft):
    has_child = set(draft.parents[0, 1:].tolist())
    return [draft.ancestors[0, i].nonzero().flatten() for i in range(draft.num_nodes) if i not in has_child]


def assert_tree_matches_paths(model, prompt, draft, logits, atol=1e-5):
    t = prompt.shape[1]
    for path in leaf_paths(draft):
        sequence = torch.cat([prompt, draft.tokens[:, path]], dim=1)
        reference = model(input_ids=sequence).logits[0, t:]  # logits after each path node
        torch.testing.assert_close(logits[path], reference, atol=atol, rtol=0, msg=f"path {path.tolist()}")


def test_mask_and_positions_of_a_small_tree():
    #   root(0) -> 1, 2 ; 1 -> 3
    draft = DraftTree(tokens=torch.tensor([[7, 8, 9, 10]]), parents=torch.tensor([[-1, 0, 0, 1]]))
    mask = tree_attention_mask(draft, past_len=2, dtype=torch.float32)
    assert mask.shape == (1, 1, 4, 6) and mask.dtype == torch.float32
    allowed = [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 1, 0],
        [1, 1, 1, 1, 0, 1],
    ]
    expected = torch.where(torch.tensor(allowed, dtype=torch.bool), 0.0, MIN)
    assert torch.equal(mask[0, 0], expected)
    assert tree_position_ids(draft, past_len=2).tolist() == [[2, 3, 3, 4]]
    # a window of 3 positions: node 3 (position 4) no longer sees positions 0 and 1
    windowed = tree_attention_mask(draft, past_len=2, dtype=torch.bfloat16, window=3)
    assert windowed.dtype == torch.bfloat16
    assert (windowed[0, 0, 3] == 0).tolist() == [False, False, True, True, False, True]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_logits_equal_plain_forward_of_each_path(family, attn):
    model = tiny_model(family, attn_implementation=attn, vocab_size=VOCAB)
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(1))
    draft = random_draft("medusa-15")
    logits, cache = forward_tree(model, prompt, draft)
    assert cache.get_seq_length() == 9 + draft.num_nodes
    assert_tree_matches_paths(model, prompt, draft, logits)


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("mistral", dict(sliding_window=4)),
        ("qwen2", dict(use_sliding_window=True, sliding_window=4, max_window_layers=0)),
    ],
)
def test_sliding_window_targets_get_the_window_in_the_tree_mask(family, overrides):
    model = tiny_model(family, vocab_size=VOCAB, **overrides)
    window = attention_window(model.config)
    assert window == 4
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    draft = random_draft("medusa-31")
    logits, _ = forward_tree(model, prompt, draft, window=window)
    assert_tree_matches_paths(model, prompt, draft, logits)  # the reference uses the model's own window mask


def test_targets_mixing_full_and_sliding_layers_get_a_window_per_layer_type():
    """No longer refused: one mask per layer type (tests/decode/test_mixed_attention.py decodes them)."""
    model = tiny_model(
        "qwen2", vocab_size=VOCAB, use_sliding_window=True, sliding_window=4, max_window_layers=2
    )
    assert attention_window(model.config) == {"full_attention": None, "sliding_attention": 4}
    assert attention_window(tiny_model("llama", vocab_size=VOCAB).config) is None
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    draft = random_draft("medusa-31")
    logits, _ = forward_tree(model, prompt, draft, window=attention_window(model.config))
    assert_tree_matches_paths(model, prompt, draft, logits)


# -- the traps (DESIGN.md: tree attention on stock HF models) ------------------------------------------


def test_boolean_mask_is_silently_wrong_under_eager():
    """Eager attention adds the mask to the scores: a boolean mask adds 0/1 and masks nothing. Ours is float."""
    model = tiny_model("llama", attn_implementation="eager", vocab_size=VOCAB)
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(3))
    draft = random_draft("medusa-15")
    float_mask = tree_attention_mask(draft, 9, torch.float32)
    assert float_mask.is_floating_point() and set(float_mask.unique().tolist()) == {0.0, MIN}
    bool_mask = float_mask == 0  # True = attend, the form sdpa would accept
    logits, _ = forward_tree(model, prompt, draft, mask=bool_mask)  # runs without complaint...
    with pytest.raises(AssertionError):  # ...and is wrong
        assert_tree_matches_paths(model, prompt, draft, logits, atol=1e-3)


def test_flash_attention_is_refused_with_a_clear_error():
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=VOCAB, num_heads=2))
    drafter = MedusaDrafter(heads, default_tree("chain-4", num_heads=2))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="honours a custom 4D mask.*'flash_attention_2'.*sdpa"):
        SpeculativeDecoder(target, drafter)
    for impl in ("sdpa", "eager"):
        model.config._attn_implementation = impl
        check_attention_implementation(model.config)
        SpeculativeDecoder(target, drafter)


def test_mask_must_cover_the_real_kv_length():
    model = tiny_model("qwen3", vocab_size=VOCAB)
    target = FrozenTarget(model)
    heads = MedusaHeads(MedusaConfig(hidden_size=64, vocab_size=VOCAB, num_heads=2))
    decoder = SpeculativeDecoder(target, MedusaDrafter(heads, default_tree("chain-4", num_heads=2)))
    cache = new_cache()
    prompt = torch.randint(0, 256, (1, 9))
    decoder.prefill(prompt, cache)
    draft = random_draft("chain-4")
    stale = tree_inputs(draft, past_len=8, dtype=torch.float32)  # one position short of the cache
    with pytest.raises(ValueError, match="covers 13 keys but the cache will hold 14.*real KV length"):
        decoder.tree_forward(draft, stale, cache)
    assert cache.get_seq_length() == 9  # refused before the forward touched the cache
    out = decoder.tree_forward(draft, tree_inputs(draft, 9, torch.float32), cache)
    assert out.logits.shape == (1, 5, VOCAB)
