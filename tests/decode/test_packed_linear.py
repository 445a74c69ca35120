"""PackedLinears: the target's fp32 linears multiply MKL-packed weights for the tree forward's row count, on
the CPU, and the decoder stays identical to `generate()` with them (decode/packed_linear.py)."""

from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from test_batched import PAD, generate_one, make_drafter, prompts_of
from test_decoder import VOCAB, random_medusa
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.decode import MedusaDrafter, SpeculativeDecoder, default_tree
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.batched_inputs import left_pad
from specheads.decode.packed_linear import ENV, PackedLinears, available
from specheads.evaluate.step_timing import MeasuredTimer

from decode_helpers import random_prompts, reference_generate
from helpers import tiny_model

# x86 torch builds carry MKL; where a build does not, the decoder must leave the layers alone (tested below)
MKL = available()


@pytest.fixture(autouse=True)
def small_models_pack(monkeypatch):
    """These tests' models are far below the size where packing starts (MIN_TOTAL_BYTES): packed anyway."""
    monkeypatch.setattr(PackedLinears, "MIN_TOTAL_BYTES", 0)


def layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(48, 96), nn.Linear(96, 40, bias=False)).eval()


def plain(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    for layer in model:
        x = F.linear(x, layer.weight, layer.bias)
    return x


def swapped(model: nn.Module) -> list[bool]:
    return ["forward" in layer.__dict__ for layer in model.modules() if isinstance(layer, nn.Linear)]


def test_inside_rows_n_the_linears_multiply_packed_weights_and_afterwards_their_own():
    if not MKL:
        assert PackedLinears.for_target(FrozenTarget(tiny_model("llama", vocab_size=VOCAB))) is None
        return
    model, x = layers(), torch.randn(1, 5, 48)  # (B, T, H): 5 rows in all
    packed = PackedLinears(model)
    with torch.no_grad(), packed.rows(5):
        assert swapped(model) == [True, True]
        inside = model(x)
        other = model(torch.randn(3, 48))  # another row count inside the block: at::linear, as without it
    assert swapped(model) == [False, False]
    with torch.no_grad():
        assert torch.allclose(inside, plain(model, x), atol=1e-5, rtol=1e-5)  # another summation order
        y = torch.randn(3, 48)
        with packed.rows(5):
            fallback = model(y)
        assert torch.equal(fallback, plain(model, y))
    assert other.shape == (3, 40) and set(packed.packed) == {5}
    with pytest.raises(RuntimeError, match="inside"), packed.rows(5):
        raise RuntimeError("inside")
    assert swapped(model) == [False, False]  # put back after an error too


def test_packs_few_rows_per_row_count_up_to_a_few_then_leaves_the_layers_alone():
    if not MKL:  # nothing to pack: no target gets a packing
        assert PackedLinears.for_target(FrozenTarget(tiny_model("llama", vocab_size=VOCAB))) is None
        return
    model = layers()
    packed = PackedLinears(model)
    with packed.rows(PackedLinears.MAX_ROWS + 1):  # many rows: sgemm packs well enough by itself
        assert swapped(model) == [False, False]
    counts = list(range(1, PackedLinears.MAX_ROW_COUNTS + 2))
    for n in counts:
        with packed.rows(n):
            assert swapped(model) == [n <= PackedLinears.MAX_ROW_COUNTS] * 2
    assert sorted(packed.packed) == counts[:-1]


def test_only_a_large_fp32_target_on_the_cpu_is_packed_once_and_the_switch_turns_it_off(monkeypatch):
    target = FrozenTarget(tiny_model("llama", vocab_size=VOCAB))
    first = PackedLinears.for_target(target)
    assert (first is not None) == MKL
    assert PackedLinears.for_target(target) is first  # the decoders of one comparison share it
    bf16 = FrozenTarget(tiny_model("llama", vocab_size=VOCAB).to(torch.bfloat16))
    assert PackedLinears.for_target(bf16) is None
    small = FrozenTarget(tiny_model("llama", vocab_size=VOCAB))
    monkeypatch.setattr(PackedLinears, "MIN_TOTAL_BYTES", 10 << 20)  # a model the caches hold: not packed
    assert PackedLinears.for_target(small) is None
    monkeypatch.setattr(PackedLinears, "MIN_TOTAL_BYTES", 0)
    monkeypatch.setenv(ENV, "0")
    assert PackedLinears.for_target(small) is None


@pytest.mark.parametrize("tree_name", ["chain-4", "medusa-63"])
def test_the_decoder_packs_for_its_tree_and_equals_generate(tree_name, monkeypatch):
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    tree = default_tree(tree_name)
    decoder = SpeculativeDecoder(target, MedusaDrafter(random_medusa(target), tree))
    assert (decoder.packed is not None) == MKL
    outputs = []
    for prompt in random_prompts(3, seed=2):
        out = decoder.generate(prompt, max_new_tokens=24)
        assert torch.equal(out.tokens, reference_generate(model, prompt, 24)), prompt.tolist()
        outputs.append(out.tokens)
    if MKL:
        assert tree.num_nodes in decoder.packed.packed  # the tree forward's rows: one prompt, N nodes
    assert swapped(model) == [False] * len(swapped(model))
    monkeypatch.setenv(ENV, "0")  # the same decoding without packing: the same tokens
    unpacked = SpeculativeDecoder(FrozenTarget(model), MedusaDrafter(random_medusa(target), tree))
    assert unpacked.packed is None
    for prompt, tokens in zip(random_prompts(3, seed=2), outputs):
        assert torch.equal(unpacked.generate(prompt, max_new_tokens=24).tokens, tokens)


def test_batched_decoding_packs_its_rows_and_equals_generate():
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    prompts = prompts_of()[:4]  # 4 rows of a 16-node tree: 64 rows a forward, then fewer as rows finish
    decoder = BatchedSpeculativeDecoder(target, make_drafter("medusa", target))
    out = decoder.generate(*left_pad(prompts, PAD), 20)
    for r, prompt in enumerate(prompts):
        assert out.rows[r].tokens[0].tolist() == generate_one(model, prompt, 20), r
    if MKL:
        assert 4 * 16 in decoder.packed.packed and all(n % 16 == 0 for n in decoder.packed.packed)
    assert swapped(model) == [False] * len(swapped(model))


def test_the_calibration_sweep_times_every_size_packed_and_leaves_no_copies_behind(monkeypatch):
    """`--tree auto`'s step timing: more sizes than the packing keeps row counts, each timed with its weights
    packed (one size at a time), and released after, except a size a decoder already uses."""
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    sequence = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    timer = MeasuredTimer(target, (-1,), sequence, start=10, repeats=2)
    packed = timer.decoder.packed
    if not MKL:
        assert packed is None and set(timer.target_steps([1, 2, 4])) == {1, 2, 4}
        return
    sizes = list(range(1, PackedLinears.MAX_ROW_COUNTS + 3))  # more sizes than row counts kept
    with packed.rows(3):  # a decoder of 3 nodes already uses its packing
        pass
    inside, rows = [], packed.rows

    @contextmanager
    def recording(n):
        with rows(n):
            inside.append((n, all(swapped(model))))
            yield

    monkeypatch.setattr(packed, "rows", recording)
    steps = timer.target_steps(sizes)
    assert set(steps) == set(sizes) and all(seconds > 0 for seconds in steps.values())
    assert sorted({n for n, _ in inside}) == sizes and all(packed_then for _, packed_then in inside)
    assert [n for n, _ in inside] == [n for n in sizes for _ in range(3)]  # one size at a time, 3 rounds
    assert set(packed.packed) == {3}  # the decoder's packing stays; the sweep's are released
