"""DraftLayer: the lean CPU forward of an EAGLE head's layer equals the head's own forward."""

import pytest
import torch
from transformers import DynamicCache

from specheads.core.target import FrozenTarget
from specheads.decode.draft_layer import DraftLayer
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.heads import Eagle3Config, Eagle3Head, EagleConfig, EagleHead, layer_config_from

from helpers import tiny_model


def make_head(method: str, target: FrozenTarget):
    torch.manual_seed(0)
    layer_config = layer_config_from(target.config)
    if method == "eagle":
        return EagleHead(EagleConfig(layer_config)).eval()
    return Eagle3Head(Eagle3Config(layer_config, draft_vocab_size=64, target_layers=(1, 2, 4))).eval()


@torch.no_grad()
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_lean_forward_equals_the_heads_own(family, method):
    """Two blocks appended to a cache (a tree-like mask, positions out of order) give the head's outputs
    and leave the same keys and values in its cache."""
    target = FrozenTarget(tiny_model(family, vocab_size=264))
    head = make_head(method, target)
    head.layer.post_attention_layernorm.weight.uniform_(0.5, 1.5)  # a trained norm, not the ones
    lean = DraftLayer.of(head.layer, head.rotary_emb)
    assert lean is not None
    h = head.config.hidden_size
    caches = (DynamicCache(), DynamicCache())
    past = 0
    for m in (5, 3):
        hidden, embeds = torch.randn(1, m, h), torch.randn(1, m, h)
        positions = torch.tensor([[past + 2, past, past + 1, past + 4, past + 3][:m]])
        allowed = torch.rand(m, past + m) > 0.3
        allowed[:, past:] |= torch.eye(m, dtype=torch.bool)
        mask = torch.zeros(1, 1, m, past + m).masked_fill(~allowed, torch.finfo(torch.float32).min)
        own = head(hidden, embeds, positions, mask, caches[0])
        residual, attn_input = head.attention_inputs(hidden, embeds)
        fast = lean(residual, attn_input, positions, mask, caches[1])
        torch.testing.assert_close(fast, own, rtol=1e-5, atol=1e-5)
        past += m
    for a, b in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(a.keys, b.keys)
        torch.testing.assert_close(a.values, b.values)


def test_layers_it_does_not_know_keep_the_stock_forward():
    """Qwen3's q/k norms, an eager-attention head: the drafter keeps the head's own forward."""
    qwen3 = FrozenTarget(tiny_model("qwen3", vocab_size=264))
    head = make_head("eagle", qwen3)
    assert DraftLayer.of(head.layer, head.rotary_emb) is None
    assert EagleDrafter(head, qwen3).draft_layer is None
    llama = FrozenTarget(tiny_model("llama", vocab_size=264))
    head = make_head("eagle", llama)
    assert EagleDrafter(head, llama).draft_layer is not None
    head.layer.self_attn.config._attn_implementation = "eager"
    assert DraftLayer.of(head.layer, head.rotary_emb) is None
    head = make_head("eagle", llama)  # a norm other than RMSNorm after attention
    head.layer.post_attention_layernorm = torch.nn.LayerNorm(head.config.hidden_size)
    assert DraftLayer.of(head.layer, head.rotary_emb) is None
