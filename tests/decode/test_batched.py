"""BatchedSpeculativeDecoder: every row's output equals the row decoded alone (SpeculativeDecoder) and the
target's own `generate(do_sample=False)`, batched with left padding and single, token for token in fp32:
with rows of different prompt lengths, ragged acceptance (rows accepting different numbers of tokens in
the same step), EOS reached by one row mid-path while the others go on, and max_new_tokens mid-path."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from transformers import DynamicCache

from specheads.core.target import FrozenTarget
from specheads.decode import EagleDrafter, MedusaDrafter, SpeculativeDecoder, default_tree, new_cache
from specheads.decode.batched import BatchedSpeculativeDecoder, as_batched
from specheads.decode.batched_inputs import compact_rows, left_pad, left_padding, prefill_inputs
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    layer_config_from,
)

from helpers import tiny_model

VOCAB, PAD = 264, 258
LENGTHS = (3, 11, 6, 17)  # prompt lengths of the four rows
DRAFTERS = ("medusa", "eagle-static", "eagle-dynamic", "eagle3-static", "eagle3-dynamic")


def prompts_of(lengths=LENGTHS, seed=0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (1, t), generator=g) for t in lengths]


def random_medusa(target: FrozenTarget, num_heads=3, seed=0) -> MedusaHeads:
    """Medusa heads moved off their identity initialisation, as after some training."""
    heads = MedusaHeads(MedusaConfig(target.hidden_size, target.vocab_size, num_heads=num_heads))
    heads.init_lm_heads_from(target.lm_head)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return heads.eval()


def make_drafter(kind: str, target: FrozenTarget):
    """A fresh batch-1 drafter of `kind` (random heads, seeded; the same heads on every call)."""
    if kind == "medusa":
        return MedusaDrafter(random_medusa(target), default_tree("medusa-15"))
    method, tree = kind.split("-")
    torch.manual_seed(0)
    layers = layer_config_from(target.config)
    if method == "eagle":
        head = EagleHead(EagleConfig(layers)).eval()
    else:
        head = Eagle3Head(Eagle3Config(layers, draft_vocab_size=VOCAB, target_layers=(1, 2, 4))).eval()
    if tree == "dynamic":
        return EagleDrafter(head, target, top_k=4, depth=4, total_tokens=16)
    return EagleDrafter(head, target, default_tree("medusa-15"))


def hf_eos(model, eos) -> tuple[dict, set[int]]:
    """`generate` kwargs and the stop set for `eos`: None = the generation config's, [] = never stop."""
    if eos is None:
        return {}, {model.generation_config.eos_token_id}
    eos = [eos] if isinstance(eos, int) else list(eos)
    return {"eos_token_id": eos or None}, set(eos)


def generate_rows(model, prompts, max_new_tokens, eos=None) -> list[list[int]]:
    """The target's own batched greedy `generate` (left padding), each row cut after its first EOS."""
    ids, mask = left_pad(prompts, PAD)
    kwargs, stop = hf_eos(model, eos)
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=PAD, **kwargs
    )[:, ids.shape[1] :]
    rows = []
    for row in out.tolist():
        cut = next((i for i, t in enumerate(row) if t in stop), len(row) - 1)
        rows.append(row[: cut + 1])
    return rows


def generate_one(model, prompt, max_new_tokens, eos=None) -> list[int]:
    """The target's own greedy `generate` of one prompt (1, T), unpadded."""
    kwargs, _ = hf_eos(model, eos)
    out = model.generate(prompt, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=PAD, **kwargs)
    return out[0, prompt.shape[1] :].tolist()


def continuation(model, prompt, n) -> list[int]:
    """prompt + the target's greedy continuation, n tokens, never stopping at EOS."""
    out = model.generate(prompt, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=PAD)
    return out[0].tolist()


# -- a drafter wrapper that makes whole paths of differing lengths accepted ------------------------------


class Inject:
    """Puts the target's greedy continuation on the first-child chain of every tree a drafter proposes,
    as deep as a draw keyed by (row, root position) says, so rows accept paths of different lengths
    in the same step, identically whether the row is decoded alone or in a batch.

    Records, per row, the trees the wrapped drafter proposed itself (before the injection), and the
    number of rows of every batched proposal.
    """

    def __init__(self, inner, truths: dict[int, list[int]], max_depth: int, row: int | None = None):
        self.inner, self.truths, self.max_depth, self.row = inner, truths, max_depth, row
        self.capture_layers = inner.capture_layers
        self.proposed: dict[int, list] = {r: [] for r in truths}
        self.batch_sizes: list[int] = []

    def propose(self, context):
        tree = self.inner.propose(context)
        if self.row is not None:  # batch 1: the row given, its whole sequence in context.tokens
            rows, roots_at = [self.row], [context.tokens.shape[1] - 1]
            assert context.tokens[0].tolist() == self.truths[self.row][: roots_at[0] + 1], (
                "left the greedy path"
            )
        else:
            rows, roots_at = context.rows.tolist(), context.layout.root_positions.tolist()
            for r, at, root in zip(rows, roots_at, context.roots.tolist()):
                assert root == self.truths[r][at], f"row {r} left the greedy path at {at}"
        self.batch_sizes.append(len(rows))
        tokens = tree.tokens.clone()
        for b, (r, at) in enumerate(zip(rows, roots_at)):
            parents = tree.parents[b].tolist()
            self.proposed[r].append((tree.tokens[b].tolist(), parents))
            depth = random.Random(1_000_003 * r + at).randint(0, self.max_depth)
            node = 0
            for d in range(1, depth + 1):
                node = next((i for i, p in enumerate(parents) if p == node), None)
                if node is None:
                    break
                tokens[b, node] = self.truths[r][at + d]
        tree.tokens = tokens
        return tree

    def select_rows(self, rows):
        self.inner.select_rows(rows)


def decode_both(kind, target, prompts, max_new_tokens, eos, truths, singles=True, max_depth=3):
    """(batched output, its Inject, [per-row SpeculativeDecoder outputs], [their Injects]); the
    single-row lists are empty without `singles`."""
    batched = Inject(as_batched(make_drafter(kind, target)), truths, max_depth)
    ids, mask = left_pad(prompts, PAD)
    out = BatchedSpeculativeDecoder(target, batched).generate(ids, mask, max_new_tokens, eos_token_id=eos)
    outs, injects = [], []
    for r, prompt in enumerate(prompts if singles else []):
        inject = Inject(make_drafter(kind, target), truths, max_depth, row=r)
        outs.append(SpeculativeDecoder(target, inject).generate(prompt, max_new_tokens, eos_token_id=eos))
        injects.append(inject)
    return out, batched, outs, injects


@dataclass
class Setup:
    """A tiny target, four prompts of different lengths, each one's greedy continuation (prompt
    included, 40 new tokens, no EOS) and the target's own batched `generate` of 25 tokens (no EOS)."""

    model: torch.nn.Module
    target: FrozenTarget
    prompts: list[torch.Tensor]
    truths: dict[int, list[int]]
    generated: list[list[int]]

    def new(self, r: int, n: int) -> list[int]:
        return self.truths[r][self.prompts[r].shape[1] :][:n]


@pytest.fixture(scope="module")
def setup():
    made = {}

    def get(family: str) -> Setup:
        if family not in made:
            model = tiny_model(family, vocab_size=VOCAB)
            prompts = prompts_of(seed=1)
            truths = {r: continuation(model, p, 40) for r, p in enumerate(prompts)}
            generated = generate_rows(model, prompts, 25, eos=[])
            made[family] = Setup(model, FrozenTarget(model), prompts, truths, generated)
        return made[family]

    return get


# -- layout pieces ---------------------------------------------------------------------------------------


def test_left_pad_and_padding_checks():
    ids, mask = left_pad([torch.tensor([5, 6, 7]), torch.tensor([[9]])], pad_token_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert left_padding(mask).tolist() == [0, 2]
    layout, additive, positions = prefill_inputs(mask, torch.float32)
    assert positions.tolist() == [[0, 1, 2], [0, 0, 0]] and layout.length.tolist() == [3, 3]
    assert (additive[1, 0, 2] == 0).tolist() == [False, False, True]  # the real token sees itself only
    with pytest.raises(ValueError, match=r"row 1 is not left padding"):
        left_padding(torch.tensor([[1, 1], [1, 0]]))
    with pytest.raises(ValueError, match=r"rows \[0\] are all padding"):
        left_padding(torch.tensor([[0, 0], [1, 1]]))
    target = FrozenTarget(tiny_model("llama", vocab_size=VOCAB))
    decoder = BatchedSpeculativeDecoder(target, make_drafter("medusa", target))
    with pytest.raises(ValueError, match=r"attention_mask \(2, 2\) does not match input_ids \(2, 3\)"):
        decoder.generate(ids, torch.ones(2, 2, dtype=torch.long), 4)
    with pytest.raises(
        TypeError, match=r"argument\(s\) 'max_new_token'; its sampling keywords are do_sample, "
    ):
        decoder.generate(ids, mask, max_new_token=4)
    with pytest.raises(TypeError, match="no batched form of object"):
        as_batched(object())


@pytest.mark.parametrize("make_cache", [new_cache, DynamicCache], ids=["buffered", "stock"])
def test_compact_rows_moves_each_rows_columns_after_its_own_tokens(make_cache):
    """Row b's kept block columns land at [start_b, start_b + n_b); earlier slots are untouched; the cache
    is cropped to the longest row. In the decoders' cache (a buffer per layer) and transformers' own."""
    past, block, heads, dim = 5, 4, 2, 3
    keys = torch.arange(3 * heads * (past + block) * dim, dtype=torch.float32).reshape(3, heads, -1, dim)
    cache = make_cache()
    cache.update(keys.clone(), -keys.clone(), 0)
    columns = torch.tensor([[0, 2, 3, 0], [0, 1, 0, 0], [0, 3, 0, 0]])
    counts, start = torch.tensor([3, 1, 2]), torch.tensor([5, 2, 4])
    assert compact_rows(cache, past, columns, counts, start) == 8
    layer = cache.layers[0]
    assert layer.keys.shape[2] == 8
    for b in range(3):
        s, n = int(start[b]), int(counts[b])
        assert torch.equal(layer.keys[b, :, :s], keys[b, :, :s])
        assert torch.equal(layer.keys[b, :, s : s + n], keys[b, :, past + columns[b, :n]])
        assert torch.equal(layer.values[b, :, s : s + n], -keys[b, :, past + columns[b, :n]])


# -- greedy equality -------------------------------------------------------------------------------------


def test_medusa_rows_equal_generate_and_single_rows():
    """Without any help from an oracle: fresh drafters, the target's own EOS, batch = 4 single rows."""
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    prompts = prompts_of()
    ids, mask = left_pad(prompts, PAD)
    out = BatchedSpeculativeDecoder(target, make_drafter("medusa", target)).generate(ids, mask, 20)
    batched_reference = generate_rows(model, prompts, 20)
    for r, prompt in enumerate(prompts):
        single = SpeculativeDecoder(target, make_drafter("medusa", target)).generate(prompt, 20)
        assert out.rows[r].tokens[0].tolist() == batched_reference[r] == generate_one(model, prompt, 20)
        assert (
            torch.equal(out.rows[r].tokens, single.tokens)
            and out.rows[r].accept_lengths == single.accept_lengths
        )
        assert out.rows[r].tokens.shape[1] == 1 + sum(out.rows[r].accept_lengths)
    assert out.steps == max(len(r.accept_lengths) for r in out.rows)


@pytest.mark.parametrize(
    "family, kind",
    [("llama", kind) for kind in DRAFTERS]
    + [("qwen2", "medusa"), ("qwen2", "eagle-dynamic"), ("qwen2", "eagle3-static")],
)
def test_ragged_acceptance_equals_single_rows_and_generate(setup, family, kind):
    """Rows accept paths of different lengths every step: outputs, accept lengths and every tree the
    drafter proposed itself equal those of each row decoded alone (so per-row compaction of the target's
    and the draft head's caches, masks and positions are right), and the output is the target's."""
    s = setup(family)
    out, batched, singles, injects = decode_both(kind, s.target, s.prompts, 25, [], s.truths)
    for r in range(len(s.prompts)):
        assert out.rows[r].tokens[0].tolist() == s.new(r, 25) == s.generated[r]
        assert torch.equal(out.rows[r].tokens, singles[r].tokens)
        assert out.rows[r].accept_lengths == singles[r].accept_lengths
        assert batched.proposed[r] == injects[r].proposed[r], f"row {r}: the drafter's own trees differ"
    lengths = [r.accept_lengths for r in out.rows]
    ragged = sum(len({row[i] for row in lengths if i < len(row)}) > 1 for i in range(out.steps))
    assert max(max(row) for row in lengths) >= 3 and ragged >= out.steps // 2, lengths
    if kind.endswith("dynamic"):  # EAGLE-2 trees take a shape of their own per row
        shapes = [{str(batched.proposed[r][i][1]) for r in s.truths} for i in range(3)]
        assert any(len(shape) > 1 for shape in shapes)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_eos_in_one_row_mid_path_while_the_others_go_on(setup, family):
    s = setup(family)
    news = [s.new(r, 30) for r in range(len(s.prompts))]
    free, *_ = decode_both("medusa", s.target, s.prompts, 30, [], s.truths, singles=False)
    # row 0's EOS: a token first emitted inside one of its steps (not a step's last token), that no
    # other row emits
    ends = {sum(free.rows[0].accept_lengths[: i + 1]) for i in range(free.rows[0].steps)}
    others = {t for new in news[1:] for t in new}
    at = max(
        i
        for i, t in enumerate(news[0])
        if 1 <= i < 25 and t not in news[0][:i] and t not in others and i not in ends
    )
    eos = news[0][at]
    out, batched, singles, _ = decode_both("medusa", s.target, s.prompts, 30, [eos], s.truths)
    assert out.rows[0].tokens[0].tolist() == news[0][: at + 1]
    assert [row.tokens[0].tolist() for row in out.rows[1:]] == news[1:]
    assert [row.tokens[0].tolist() for row in out.rows] == generate_rows(s.model, s.prompts, 30, eos=eos)
    for r in range(len(s.prompts)):
        assert torch.equal(out.rows[r].tokens, singles[r].tokens)
        assert out.rows[r].accept_lengths == singles[r].accept_lengths
    assert out.rows[0].accept_lengths[-1] < free.rows[0].accept_lengths[out.rows[0].steps - 1]  # cut mid-path
    assert batched.batch_sizes[0] == 4 and batched.batch_sizes[-1] < 4  # the finished row left the batch


def test_max_new_tokens_mid_path(setup):
    s = setup("qwen2")
    free, *_ = decode_both("eagle-static", s.target, s.prompts, 20, [], s.truths, singles=False)
    cut_mid_path = 0
    for max_new_tokens in (1, 2, 9, 14):
        out, *_ = decode_both(
            "eagle-static", s.target, s.prompts, max_new_tokens, [], s.truths, singles=False
        )
        for r in range(len(s.prompts)):
            assert out.rows[r].tokens[0].tolist() == s.new(r, max_new_tokens)
            # the same steps as without the limit, the last one cut where the limit falls
            expected, left = [], max_new_tokens - 1
            for n in free.rows[r].accept_lengths:
                if left == 0:
                    break
                expected.append(min(n, left))
                left -= expected[-1]
            assert out.rows[r].accept_lengths == expected
            cut_mid_path += expected != free.rows[r].accept_lengths[: len(expected)]
    assert cut_mid_path >= 3


@pytest.mark.parametrize(
    "family, overrides",
    [
        ("llama", dict(attn_implementation="eager")),
        ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=0)),
    ],
)
def test_eager_attention_and_sliding_window(family, overrides):
    model = tiny_model(family, vocab_size=VOCAB, **overrides)
    target = FrozenTarget(model)
    prompts = prompts_of(seed=4)
    truths = {r: continuation(model, p, 30) for r, p in enumerate(prompts)}
    out, *_ = decode_both("medusa", target, prompts, 20, [], truths, singles=False)
    for r, prompt in enumerate(prompts):
        assert out.rows[r].tokens[0].tolist() == truths[r][prompt.shape[1] :][:20]
    assert max(n for row in out.rows for n in row.accept_lengths) >= 3


def test_first_token_eos_and_zero_tokens():
    model = tiny_model("llama", vocab_size=VOCAB)
    target = FrozenTarget(model)
    prompts = prompts_of(seed=5)
    ids, mask = left_pad(prompts, PAD)
    decoder = BatchedSpeculativeDecoder(target, make_drafter("eagle-static", target))
    first = generate_one(model, prompts[1], 1)[0]
    out = decoder.generate(ids, mask, 12, eos_token_id=first)
    assert out.rows[1].tokens[0].tolist() == [first] and out.rows[1].steps == 0
    for r, prompt in enumerate(prompts):
        assert out.rows[r].tokens[0].tolist() == generate_one(model, prompt, 12, eos=first)
    empty = decoder.generate(ids, mask, 0)
    assert [row.tokens.shape for row in empty.rows] == [(1, 0)] * 4 and empty.steps == 0
