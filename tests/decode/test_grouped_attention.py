"""Grouped-query attention in the tree forward: on the CPU, a grouped-query target's tree forward attends its
grouped heads without copying the cache to every head, with the same logits and the same tokens as
`generate()` (decode/grouped_attention.py)."""

import inspect
import os
from types import SimpleNamespace

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_attention
from test_decoder import VOCAB, random_medusa

from specheads.core.target import FrozenTarget
from specheads.decode import MedusaDrafter, SpeculativeDecoder, default_tree
from specheads.decode.grouped_attention import (
    ENV,
    FORCE,
    forced_grouped_attention,
    grouped_attention_for,
    supported,
)

from decode_helpers import random_prompts, reference_generate
from helpers import tiny_model

# torch >= 2.5 with a transformers whose sdpa attention has the switch; elsewhere nothing may change (below)
SUPPORTED = supported()


@pytest.fixture
def repeat_kv_calls(monkeypatch):
    """Counts the copies of the cache to every query head that transformers' sdpa attention makes."""
    calls = []
    original = sdpa_attention.repeat_kv

    def counting(hidden_states, n_rep):
        calls.append(hidden_states.shape)
        return original(hidden_states, n_rep)

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting)
    return calls


def test_the_switch_is_set_inside_the_block_and_put_back_after_it(monkeypatch):
    monkeypatch.delenv(FORCE, raising=False)
    with forced_grouped_attention():
        assert os.environ[FORCE] == "1"
    assert FORCE not in os.environ
    monkeypatch.setenv(FORCE, "0")  # a user's own setting survives the block, also after an error
    with pytest.raises(RuntimeError, match="inside"), forced_grouped_attention():
        raise RuntimeError("inside")
    assert os.environ[FORCE] == "0"


def test_the_route_is_found_where_this_torch_and_transformers_have_it():
    """supported() asks transformers' own decision; it must agree with what the installed versions have (so
    the tests below, which expect the route where it is supported, cannot pass by not finding it)."""
    torch_has = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)
    transformers_has = FORCE in inspect.getsource(sdpa_attention)
    assert supported() == (torch_has and transformers_has)


def test_only_a_grouped_query_sdpa_target_on_the_cpu_takes_the_route(monkeypatch):
    grouped = FrozenTarget(tiny_model("llama", vocab_size=VOCAB))  # 4 query heads, 2 key/value heads
    assert grouped_attention_for(grouped) == SUPPORTED
    full = tiny_model("llama", vocab_size=VOCAB, num_key_value_heads=4)
    assert not grouped_attention_for(FrozenTarget(full))
    eager = tiny_model("llama", vocab_size=VOCAB, attn_implementation="eager")
    assert not grouped_attention_for(FrozenTarget(eager))
    # on CUDA, sdpa with a mask and enable_gqa would run the unfused math kernel: not taken
    assert not grouped_attention_for(SimpleNamespace(device=torch.device("cuda"), config=grouped.config))
    monkeypatch.setenv(ENV, "0")
    assert not grouped_attention_for(grouped)


def tree_forward_copies(decoder, calls, monkeypatch) -> list[int]:
    """The cache copies each of the decoder's tree forwards makes, in order."""
    copies, original = [], decoder.tree_forward

    def counted(*args, **kwargs):
        before = len(calls)
        out = original(*args, **kwargs)
        copies.append(len(calls) - before)
        return out

    monkeypatch.setattr(decoder, "tree_forward", counted)
    return copies


@pytest.mark.parametrize("tree_name", ["chain-4", "medusa-63"])
def test_the_tree_forward_copies_no_cache_and_the_decoder_equals_generate(
    tree_name, repeat_kv_calls, monkeypatch
):
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    tree, heads = default_tree(tree_name), random_medusa(target)
    per_forward = 2 * model.config.num_hidden_layers  # keys and values, every layer
    decoder = SpeculativeDecoder(target, MedusaDrafter(heads, tree))
    assert decoder.grouped == SUPPORTED
    copies = tree_forward_copies(decoder, repeat_kv_calls, monkeypatch)
    outputs = []
    for prompt in random_prompts(3, seed=2):
        out = decoder.generate(prompt, max_new_tokens=24)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 24)), prompt.tolist()
        outputs.append(out.tokens)
    assert copies and set(copies) == {0 if SUPPORTED else per_forward}, copies
    monkeypatch.setenv(ENV, "0")  # the same decoding with the cache expanded: the same tokens
    expanded = SpeculativeDecoder(FrozenTarget(model), MedusaDrafter(heads, tree))
    assert not expanded.grouped
    copies = tree_forward_copies(expanded, repeat_kv_calls, monkeypatch)
    for prompt, tokens in zip(random_prompts(3, seed=2), outputs):
        assert torch.equal(expanded.generate(prompt, max_new_tokens=24).tokens, tokens)
    assert copies and set(copies) == {per_forward}, copies  # what the route saves, every step


def test_the_tree_forward_logits_are_the_expanded_ones(monkeypatch):
    """Attending grouped heads directly is the same arithmetic: every tree forward's logits are equal."""
    model = tiny_model("llama", vocab_size=VOCAB)
    tree = default_tree("medusa-63")
    prompt = random_prompts(1, seed=4)[0]
    logits = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV, switch)
        target = FrozenTarget(model)
        decoder = SpeculativeDecoder(target, MedusaDrafter(random_medusa(target), tree))
        logits[switch] = record_logits(decoder, monkeypatch)
        decoder.generate(prompt, max_new_tokens=8)
    assert len(logits["1"]) == len(logits["0"]) > 1
    for grouped, expanded in zip(logits["1"], logits["0"]):
        assert torch.allclose(grouped, expanded, atol=1e-6, rtol=1e-6)


def record_logits(decoder, monkeypatch) -> list[torch.Tensor]:
    seen, original = [], decoder.tree_forward

    def recorded(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append(out.logits)
        return out

    monkeypatch.setattr(decoder, "tree_forward", recorded)
    return seen
