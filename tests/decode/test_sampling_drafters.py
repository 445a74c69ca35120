"""Drafters under sampling hand the verifier the right q: the distribution each node's children were drawn
from (children="iid" / "without-replacement") or ranked by (top-k), at the sampling temperature, in the
target's vocabulary; drawn children follow it; and decoding with drawn children runs and reproduces."""

import pytest
import torch
from test_eagle_drafter import make_head, node_path, reference_logprobs

from specheads.core.target import FrozenTarget
from specheads.decode import MedusaDrafter, SpeculativeDecoder, StaticTree
from specheads.decode.drafters import DraftContext, SampledTree
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.decode.sampling import SamplingParams, check_generator
from specheads.heads import MedusaConfig, MedusaHeads

from helpers import tiny_model

VOCAB = 24
TREE = StaticTree.from_choices([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
PARAMS = SamplingParams(temperature=1.3, top_p=0.9)  # q takes the temperature only


@pytest.fixture(scope="module")
def target() -> FrozenTarget:
    model = tiny_model("llama", vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    with torch.no_grad():
        model.lm_head.weight.mul_(10)
    return FrozenTarget(model)


def medusa_heads(target):
    heads = MedusaHeads(MedusaConfig(target.hidden_size, VOCAB, num_heads=3)).init_lm_heads_from(
        target.lm_head
    )
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return heads.eval()


def context_for(target, drafter, seed=0) -> DraftContext:
    tokens = torch.randint(3, VOCAB, (1, 8), generator=torch.Generator().manual_seed(seed))
    out = target(tokens[:, :-1], capture=drafter.capture_layers)
    # keyed as the drafter asked for the layers, as the decoder hands them over
    hidden = {layer: out.hidden[target.layer_id(layer)] for layer in drafter.capture_layers}
    return DraftContext(tokens, hidden, step=0, sampling=PARAMS, generator=check_generator(None))


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = counts.sum() * probs.double()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "drew a token q gives probability 0"
    statistic = ((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = torch.tensor((int(keep.sum()) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2))


@pytest.mark.parametrize("restricted", [False, True])
@pytest.mark.parametrize("children", ["iid", "without-replacement"])
def test_medusa_children_are_drawn_from_the_q_it_reports(target, children, restricted):
    """`restricted`: the heads propose from a draft vocabulary (every other id), q is their distribution
    over it, zero elsewhere, and the children are drawn from that."""
    heads = medusa_heads(target)
    vocab = torch.arange(1, VOCAB, 2) if restricted else None
    drafter = MedusaDrafter(heads, TREE, children=children, vocab=vocab)
    context = context_for(target, drafter)
    feature = context.hidden[-1][:, -1:]
    with torch.no_grad():
        logits = heads(feature)[:, 0, 0]  # (K, V)
        if restricted:
            q_heads = torch.zeros_like(logits)
            q_heads[:, vocab] = torch.softmax(logits[:, vocab] / PARAMS.temperature, -1)
        else:
            q_heads = torch.softmax(logits / PARAMS.temperature, -1)
    kids = {a: [i for i, p in enumerate(TREE.parents) if p == a] for a in range(TREE.num_nodes)}
    first_child = {a: torch.zeros(VOCAB, dtype=torch.float64) for a, k in kids.items() if k}
    context.generator.manual_seed(1)
    for _ in range(400):
        tree = drafter.propose(context)
        assert isinstance(tree, SampledTree) and tree.children == children
        for a, k in kids.items():
            if k:  # q at a is head depth(a)'s distribution, the one a's children were drawn from
                torch.testing.assert_close(tree.draft_probs[0, a], q_heads[TREE.depths[a]])
                first_child[a][tree.tokens[0, k[0]]] += 1
                if children == "without-replacement":
                    assert len(set(tree.tokens[0, k].tolist())) == len(k)
    for a, counts in first_child.items():
        assert chi_square_p_value(counts, q_heads[TREE.depths[a]]) > 1e-3, a


@pytest.mark.parametrize("tree", ["static", "dynamic"])
@pytest.mark.parametrize("method", ["eagle", "eagle3", "eagle-vocab"])
def test_eagle_q_is_the_heads_own_distribution_at_each_node(target, method, tree):
    """q at every node with children equals the head's distribution there computed from scratch, at the
    sampling temperature, scattered into the target's vocabulary (EAGLE-3's draft vocabulary is sparse;
    "eagle-vocab": an EAGLE-1 head decoded over a draft vocabulary, its distribution over those ids)."""
    vocab = torch.arange(0, VOCAB, 2) if method != "eagle" else None
    head = make_head(method.removesuffix("-vocab"), target, draft_vocab=vocab if method == "eagle3" else None)
    static = TREE if tree == "static" else None
    restrict = vocab if method == "eagle-vocab" else None
    drafter = EagleDrafter(head, target, static, top_k=3, depth=3, total_tokens=10, vocab=restrict)
    context = context_for(target, drafter)
    proposed = drafter.propose(context)
    tokens, parents = proposed.tokens[0].tolist(), proposed.parents[0].tolist()
    target_ids = drafter.to_target_ids(torch.arange(drafter.draft_vocab_size))
    if restrict is not None:
        assert set(tokens[1:]) <= set(restrict.tolist())
    checked = 0
    for node in range(proposed.num_nodes):
        if node not in parents:  # a leaf: its row is unused
            continue
        ref = reference_logprobs(head, target, context.tokens, node_path(parents, tokens, node))
        if restrict is not None:
            ref = ref[..., restrict]
        expected = torch.zeros(VOCAB)
        expected[target_ids] = torch.softmax(ref / PARAMS.temperature, -1)
        torch.testing.assert_close(proposed.draft_probs[0, node], expected, atol=1e-5, rtol=1e-4)
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("children", ["iid", "without-replacement"])
def test_eagle_static_children_are_drawn_from_q(target, children):
    drafter = EagleDrafter(make_head("eagle", target), target, TREE, children=children)
    context = context_for(target, drafter)
    context.generator.manual_seed(2)
    root_kids = [i for i, p in enumerate(TREE.parents) if p == 0]
    counts, q_root = torch.zeros(VOCAB, dtype=torch.float64), None
    for _ in range(150):
        tree = drafter.propose(context)
        q_root = tree.draft_probs[0, 0] if q_root is None else q_root
        torch.testing.assert_close(tree.draft_probs[0, 0], q_root)
        counts[tree.tokens[0, root_kids[0]]] += 1
        if children == "without-replacement":
            assert len(set(tree.tokens[0, root_kids].tolist())) == len(root_kids)
    assert chi_square_p_value(counts, q_root) > 1e-3


def test_drawn_children_need_a_static_tree(target):
    with pytest.raises(ValueError, match="children='iid' needs a static tree"):
        EagleDrafter(make_head("eagle", target), target, None, children="iid")
    with pytest.raises(ValueError, match="children='sampled': expected one of"):
        MedusaDrafter(medusa_heads(target), TREE, children="sampled")


@pytest.mark.parametrize("children", ["iid", "without-replacement"])
def test_decoding_with_drawn_children_accepts_and_reproduces(target, children):
    drafters = {
        "medusa": MedusaDrafter(medusa_heads(target), TREE, children=children),
        "eagle": EagleDrafter(make_head("eagle", target), target, TREE, children=children),
    }
    prompt = torch.tensor([[5, 9, 3, 17, 8]])
    for name, drafter in drafters.items():
        decoder = SpeculativeDecoder(target, drafter)
        runs = [
            decoder.generate(
                prompt,
                30,
                eos_token_id=[],
                do_sample=True,
                top_p=0.95,
                generator=torch.Generator().manual_seed(0),
            )
            for _ in range(2)
        ]
        assert torch.equal(runs[0].tokens, runs[1].tokens), name
        assert runs[0].tokens.shape[1] == 30 and max(runs[0].accept_lengths) > 1, name
