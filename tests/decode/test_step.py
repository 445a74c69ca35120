"""One step for every path (decode/step.py): the batch-1 layout gives the batch-1 verbs, and single
decoding, batched decoding, the calibration's recording and the step timing all run `speculative_step`."""

import time

import pytest
import torch

from specheads.core.target import FrozenTarget
from specheads.decode import (
    MedusaDrafter,
    SpeculativeDecoder,
    batched,
    decoder,
    default_tree,
    new_cache,
    tree_inputs,
)
from specheads.decode.batched import BatchedSpeculativeDecoder
from specheads.decode.batched_inputs import Layout, batched_tree_inputs, block_attention, compact_rows
from specheads.decode.calibrate_dynamic import record_dynamic_steps
from specheads.decode.kv_cache import compact_cache
from specheads.decode.step import PhaseClock, speculative_step
from specheads.decode.tree_inputs import additive_mask
from specheads.decode.trees import DraftTree
from specheads.evaluate.step_timing import MeasuredTimer
from specheads.heads import EagleConfig, EagleHead, MedusaConfig, MedusaHeads, layer_config_from

from helpers import tiny_model


@pytest.fixture(scope="module")
def target() -> FrozenTarget:
    return FrozenTarget(tiny_model("llama"))


def small_tree() -> DraftTree:
    return DraftTree(tokens=torch.tensor([[5, 6, 7, 8, 9]]), parents=torch.tensor([[-1, 0, 0, 1, 1]]))


@pytest.mark.parametrize("window", [None, 4, {"full_attention": None, "sliding_attention": 4}])
def test_the_contiguous_layout_gives_the_batch_one_tree_inputs(window):
    tree, past = small_tree(), 7
    one = tree_inputs(tree, past, torch.float32, window)
    rows = batched_tree_inputs(tree, Layout.contiguous(past), past, torch.float32, window)
    if isinstance(window, dict):  # one mask per layer type, each that of its window alone
        assert sorted(one.attention_mask) == sorted(rows.attention_mask) == sorted(window)
        for kind, w in window.items():
            assert torch.equal(
                one.attention_mask[kind], tree_inputs(tree, past, torch.float32, w).attention_mask
            )
            assert torch.equal(one.attention_mask[kind], rows.attention_mask[kind])
        assert not torch.equal(one.attention_mask["full_attention"], one.attention_mask["sliding_attention"])
    else:
        assert torch.equal(one.attention_mask, rows.attention_mask)
    assert torch.equal(one.position_ids, rows.position_ids)
    assert torch.equal(one.input_ids, rows.input_ids)


@pytest.mark.parametrize(
    "pad, length",
    [([0, 3], [9, 7]), ([0], [9]), ([3], [9]), ([0], [7])],
    ids=["two-rows", "one-row", "one-padded-row", "one-short-row"],
)
def test_a_static_trees_inputs_are_those_of_the_same_tree_built_from_parents(pad, length):
    """The mask built from its parts, the tree block cached per static shape (DraftTree.on_shape), equals
    the mask of every slot and node at once (block_attention), for padded or short rows and across steps."""
    static = default_tree("medusa-15")
    layout = Layout(pad=torch.tensor(pad), length=torch.tensor(length))
    rows = len(pad)
    for _ in range(2):  # the second reads the cached block
        tokens = torch.randint(0, 50, (rows, static.num_nodes))
        shaped = DraftTree.on_shape(tokens, static.shape())
        built = DraftTree(tokens=tokens, parents=torch.tensor([static.parents] * rows))
        fast = batched_tree_inputs(shaped, layout, 9, torch.float32)
        positions = layout.root_positions[:, None] + built.depths
        allowed = block_attention(layout, 9, built.ancestors, positions)
        assert torch.equal(fast.attention_mask, additive_mask(allowed, torch.float32))
        assert torch.equal(fast.position_ids, positions)
    assert list(static.shape().masks) == [torch.float32]


def test_the_contiguous_layout_compacts_as_the_batch_one_cache(target):
    prompt, tree, path = torch.tensor([[3, 9, 4, 12, 7, 1, 2]]), small_tree(), torch.tensor([0, 1, 4])
    caches = []
    for _ in range(2):
        cache = new_cache()
        target(prompt, past_key_values=cache)
        inputs = tree_inputs(tree, prompt.shape[1], torch.float32)
        target(
            inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            past_key_values=cache,
        )
        caches.append(cache)
    compact_cache(caches[0], prompt.shape[1], path)
    layout = Layout.contiguous(prompt.shape[1])
    compact_rows(caches[1], prompt.shape[1], path[None], torch.tensor([3]), layout.length)
    assert caches[0].get_seq_length() == caches[1].get_seq_length() == prompt.shape[1] + 3
    for a, b in zip(caches[0].layers, caches[1].layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.fixture
def counted(monkeypatch):
    """Counts the calls of `speculative_step` from the decoders (the only place it is called from)."""
    calls = []

    def counting(*args, **kwargs):
        calls.append(type(args[0]).__name__)
        return speculative_step(*args, **kwargs)

    monkeypatch.setattr(decoder, "speculative_step", counting)
    monkeypatch.setattr(batched, "speculative_step", counting)
    return calls


def medusa(target: FrozenTarget) -> MedusaDrafter:
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=3))
    return MedusaDrafter(heads.init_lm_heads_from(target.lm_head).eval(), default_tree("medusa-15"))


def test_every_path_runs_the_one_step(target, counted):
    prompt = torch.tensor([[3, 9, 4, 12, 7]])
    single = SpeculativeDecoder(target, medusa(target)).generate(prompt, 6, eos_token_id=[])
    assert counted.count("SpeculativeDecoder") == single.steps > 0

    counted.clear()
    out = BatchedSpeculativeDecoder(target, medusa(target)).generate(
        prompt.expand(2, -1), max_new_tokens=6, eos_token_id=[]
    )
    assert counted.count("BatchedSpeculativeDecoder") == out.steps > 0

    counted.clear()
    torch.manual_seed(0)
    head = EagleHead(EagleConfig(layer_config_from(target.config))).eval()
    steps, sequences = record_dynamic_steps(target, head, [prompt], top_k=2, depth=2, max_new_tokens=5)
    assert len(counted) == len(steps[0]) > 0  # one step per recorded root

    counted.clear()
    sequence, _ = sequences[0]
    timer = MeasuredTimer(target, (-1,), sequence, start=3, repeats=1)
    timer.target_steps([1, 3])
    assert len(counted) == 2 * 2  # (repeats + 1) rounds over two sizes


def test_the_phase_clock_sums_each_phase_and_refuses_nesting():
    clock = PhaseClock(sync=False)
    for _ in range(3):
        with clock("draft"):
            time.sleep(0.002)
        with clock("verify"):
            pass
    assert clock.totals["draft"] >= 0.006 and 0 <= clock.totals["verify"] < clock.totals["draft"]
    with pytest.raises(RuntimeError, match="'verify' started inside phase 'draft'"):
        with clock("draft"):
            with clock("verify"):
                pass


def test_the_decoders_device_follows_the_target_when_it_moves():
    """TreeDecoder.device reads the lm_head module it kept (not transformers' lookup, every step): the model
    moving after the decoder was built moves it too."""
    target = FrozenTarget(tiny_model("llama"))
    decoder = SpeculativeDecoder(target, medusa(target))
    assert decoder.device == target.device == torch.device("cpu")
    target.model.to("meta")
    assert decoder.device == target.device == torch.device("meta")
