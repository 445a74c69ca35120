"""The KV cache reaches every stock module under the name its transformers release takes (core/hf_compat.py):
no deprecated keyword, and a cache that is filled, not silently dropped."""

import warnings

import pytest
import torch
from torch import nn

from specheads.core.hf_compat import _installed_keyword, cache_kwargs
from specheads.core.target import FrozenTarget
from specheads.decode.kv_cache import new_cache
from specheads.heads import Eagle3Config, Eagle3Head, EagleConfig, EagleHead, layer_config_from

from helpers import causal_mask, tiny_config, tiny_model

B, T, H = 1, 5, 64


class New(nn.Module):
    def forward(self, x, cache=None):
        return x


class Old(nn.Module):
    def forward(self, x, past_key_values=None):
        return x


class Wrapper(nn.Module):
    def forward(self, *args, **kwargs):
        return args


class NoCache(nn.Module):
    def forward(self, x):
        return x


def test_the_keyword_is_the_one_the_module_takes():
    assert cache_kwargs(New(), "c") == {"cache": "c"}
    assert cache_kwargs(Old(), "c") == {"past_key_values": "c"}
    # a wrapper passing **kwargs through (peft, accelerate) gets the installed transformers' own name
    assert cache_kwargs(Wrapper(), "c") == {_installed_keyword(): "c"}
    with pytest.raises(TypeError, match="NoCache.forward takes neither `cache` nor `past_key_values`"):
        cache_kwargs(NoCache(), "c")


@pytest.fixture
def no_deprecated_cache_keyword():
    """Any FutureWarning naming `past_key_values` fails the test (transformers 5.40 drops that name)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*", category=FutureWarning)
        yield


@pytest.mark.usefixtures("no_deprecated_cache_keyword")
def test_the_target_fills_the_cache_it_is_given():
    target = FrozenTarget(tiny_model("llama", vocab_size=264))
    ids = torch.randint(0, 264, (B, T), generator=torch.Generator().manual_seed(0))
    whole = target(ids).logits
    cache = new_cache()
    target(ids[:, :-1], past_key_values=cache)
    assert cache.get_seq_length() == T - 1
    last = target(ids[:, -1:], past_key_values=cache, position_ids=torch.tensor([[T - 1]])).logits
    torch.testing.assert_close(last[:, -1], whole[:, -1], rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("no_deprecated_cache_keyword")
@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_the_draft_layer_fills_the_cache_it_is_given(method):
    torch.manual_seed(0)
    layer_config = layer_config_from(tiny_config("llama"))
    if method == "eagle":
        head = EagleHead(EagleConfig(layer_config)).eval()
    else:
        head = Eagle3Head(Eagle3Config(layer_config, draft_vocab_size=100, target_layers=(1, 2, 3))).eval()
    hidden, embeds = torch.randn(B, T, H), torch.randn(B, T, H)
    positions = torch.arange(T).expand(B, T)
    with torch.no_grad():
        whole = head(hidden, embeds, positions, causal_mask(T))
        cache = new_cache()
        head(hidden[:, :-1], embeds[:, :-1], positions[:, :-1], causal_mask(T - 1), cache=cache)
        assert cache.get_seq_length() == T - 1
        last = head(
            hidden[:, -1:], embeds[:, -1:], positions[:, -1:], causal_mask(1, past=T - 1), cache=cache
        )
    torch.testing.assert_close(last[:, -1], whole[:, -1], rtol=1e-4, atol=1e-4)


def test_a_forward_without_a_cache_reads_no_deprecated_field(monkeypatch):
    """A forward with no cache (training's) returns none, and reads no `past_key_values` of the output:
    transformers 5.x answers that old name through a property that logs a deprecation warning."""
    import transformers.utils.generic as generic

    logged = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda message, *a, **k: logged.append(message))
    target = FrozenTarget(tiny_model("llama", vocab_size=264))
    out = target(torch.randint(0, 264, (B, T), generator=torch.Generator().manual_seed(0)))
    assert out.past_key_values is None
    assert not [m for m in logged if "past_key_values" in str(m)]
