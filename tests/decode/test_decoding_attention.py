"""Decoding on CUDA runs SDPA without cuDNN's backend (decode/step.py: decoding_attention), which builds a plan
for every new key length; the decoders, the step, and the commands' decoding loops go through it."""

import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.decode import MedusaDrafter, SpeculativeDecoder, default_tree, step
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.step import KEEP_CUDNN_SDPA, decoding_attention
from specheads.heads import MedusaConfig, MedusaHeads

from helpers import record_decoding_attention, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")
CUDA = torch.backends.cuda


def backends() -> tuple[bool, bool, bool, bool]:
    return (
        CUDA.cudnn_sdp_enabled(),
        CUDA.flash_sdp_enabled(),
        CUDA.mem_efficient_sdp_enabled(),
        CUDA.math_sdp_enabled(),
    )


def test_on_cuda_the_cudnn_backend_is_off_inside_and_restored_after(monkeypatch):
    monkeypatch.delenv(KEEP_CUDNN_SDPA, raising=False)
    before = backends()
    assert before[0]  # torch's default: cuDNN attention on
    with decoding_attention(torch.device("cuda")):
        assert backends() == (False, True, True, True)
        with decoding_attention(torch.device("cuda", 0)):  # nested, as generate around its steps
            assert backends() == (False, True, True, True)
        assert backends() == (False, True, True, True)
    assert backends() == before
    with pytest.raises(RuntimeError), decoding_attention(torch.device("cuda")):
        raise RuntimeError("a failed decode")
    assert backends() == before  # restored on errors too


def test_elsewhere_or_when_asked_the_backends_stay_as_they_are(monkeypatch):
    before = backends()
    with decoding_attention(torch.device("cpu")):
        assert backends() == before
    monkeypatch.setenv(KEEP_CUDNN_SDPA, "1")
    with decoding_attention(torch.device("cuda")):
        assert backends() == before


def test_both_decoders_and_every_step_decode_under_it(monkeypatch):
    entered = record_decoding_attention(monkeypatch, step)
    target = FrozenTarget(tiny_model("llama"))
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=3))
    drafter = MedusaDrafter(heads.init_lm_heads_from(target.lm_head).eval(), default_tree("medusa-15"))
    prompt = torch.tensor([[3, 9, 4, 12, 7]])
    out = SpeculativeDecoder(target, drafter).generate(prompt, 6, eos_token_id=[])
    assert entered == ["cpu"] * (1 + out.steps)  # generate, then each step inside it
    entered.clear()
    out = BatchedSpeculativeDecoder(target, drafter).generate(
        prompt.expand(2, -1), max_new_tokens=6, eos_token_id=[]
    )
    assert entered == ["cpu"] * (1 + out.steps)
