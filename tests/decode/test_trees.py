"""Trees: Medusa tree choices and their validation, draft-tree structure, the default trees, the builder."""

import itertools

import pytest
import torch

from specheads.decode import (
    DEFAULT_TREES,
    DraftTree,
    SampledTree,
    StaticTree,
    build_tree,
    default_tree,
    expected_accept_length,
)
from specheads.decode.trees import MC_SIM_7B_63, ancestor_mask


def test_static_tree_layout_from_choices():
    tree = StaticTree.from_choices([(1,), (0, 0), (0,), (1, 0), (0, 0, 2)])
    # canonical order: by depth, then ranks
    assert tree.choices == ((0,), (1,), (0, 0), (1, 0), (0, 0, 2))
    assert tree.parents == (-1, 0, 0, 1, 2, 3)
    assert tree.depths == (0, 1, 1, 2, 2, 3)
    assert tree.ranks == (0, 0, 1, 0, 0, 2)
    assert (tree.num_nodes, tree.max_depth, tree.topk) == (6, 3, 3)


def test_empty_choices_is_the_root_alone():
    tree = StaticTree.from_choices([])
    assert tree.parents == (-1,) and tree.num_nodes == 1 and tree.max_depth == 0 and tree.topk == 1


@pytest.mark.parametrize(
    "choices, kwargs, message",
    [
        ([(0,), (0, 0), (0, 0, 0)], dict(num_heads=2), r"\(0, 0, 0\) has depth 3 but there are only 2 heads"),
        ([(0,), (0, 1, 0)], {}, r"\(0, 1, 0\) needs its prefix \(0, 1\)"),
        ([(0,), (1, 0)], {}, r"\(1, 0\) needs its prefix \(1,\)"),
        ([(0,), (0, 4)], dict(topk=4), r"\(0, 4\): rank 4 at depth 2 is past top-k=4"),
        ([(0,), (1,), (0,)], {}, r"\(0,\) appears more than once"),
        ([(0,), [0, 0], (0, 0)], {}, r"\(0, 0\) appears more than once"),
        ([(0,), ()], {}, r"\(\) must be a non-empty sequence"),
        ([(0,), (0, -1)], {}, r"\(0, -1\) must hold ranks that are ints >= 0"),
        ([(0,), "01"], {}, r"'01' must be a non-empty sequence"),
    ],
)
def test_bad_tree_choices_are_named(choices, kwargs, message):
    with pytest.raises(ValueError, match=message):
        StaticTree.from_choices(choices, **kwargs)


def test_default_trees_are_valid_and_have_the_advertised_sizes():
    for name, choices in DEFAULT_TREES.items():
        tree = StaticTree.from_choices(choices)
        assert tree.num_nodes - 1 == int(name.split("-")[1])
        assert tree.max_depth <= 4
    # Medusa's list is in the order its greedy search grew it: every prefix is a tree.
    for n in range(len(MC_SIM_7B_63) + 1):
        StaticTree.from_choices(MC_SIM_7B_63[:n])
    assert StaticTree.from_choices(MC_SIM_7B_63).topk == 10


def test_default_tree_keeps_what_the_heads_can_fill():
    tree = default_tree("medusa-63", num_heads=2)
    assert tree.max_depth == 2
    assert set(tree.choices) == {p for p in MC_SIM_7B_63 if len(p) <= 2}
    with pytest.raises(ValueError, match="unknown tree 'medusa-7'"):
        default_tree("medusa-7")


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_chain_k_is_the_top_guess_at_each_of_k_depths(k):
    tree = default_tree(f"chain-{k}")
    assert tree.choices == tuple((0,) * d for d in range(1, k + 1))
    assert (tree.num_nodes, tree.max_depth, tree.topk) == (k + 1, k, 1)
    assert tree.parents == (-1, *range(k))
    assert default_tree(f"chain-{k}", num_heads=2).max_depth == min(k, 2)  # cut to the heads, as any tree


@pytest.mark.parametrize("name", ["chain-0", "chain-", "chain-03", "chain-2x", "chains-2"])
def test_a_malformed_chain_is_an_unknown_tree(name):
    with pytest.raises(ValueError, match=f"unknown tree '{name}'.*chain-K with K >= 1"):
        default_tree(name)


def test_ancestors_and_depths_of_a_draft_tree():
    #      0
    #    1   2
    #    3     4
    #    5
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3]])
    tree = DraftTree(tokens=torch.arange(6)[None], parents=parents)
    assert tree.depths.tolist() == [[0, 1, 1, 2, 2, 3]]
    expected = [[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4], [0, 1, 3, 5]]
    for i, row in enumerate(tree.ancestors[0]):
        assert row.nonzero().flatten().tolist() == expected[i]
    # batched: each row its own tree
    both = ancestor_mask(torch.tensor([[-1, 0, 1], [-1, 0, 0]]))
    assert both[0, 2].tolist() == [True, True, True] and both[1, 2].tolist() == [True, False, True]


def test_a_tree_on_a_static_shape_is_the_tree_built_from_its_parents():
    """DraftTree.on_shape (the static trees' per-step constructor) equals DraftTree(tokens, parents), the
    subclass's own fields kept, and the shape is built once per device."""
    static = default_tree("medusa-31")
    tokens = torch.randint(0, 100, (3, static.num_nodes))
    shaped = SampledTree.on_shape(tokens, static.shape("cpu"), draft_probs=torch.ones(1), children="iid")
    built = DraftTree(tokens=tokens, parents=torch.tensor([static.parents]).expand(3, -1))
    assert type(shaped) is SampledTree and shaped.children == "iid" and shaped.draft_probs is not None
    assert torch.equal(shaped.tokens, tokens) and torch.equal(shaped.parents, built.parents)
    assert torch.equal(shaped.ancestors, built.ancestors) and torch.equal(shaped.depths, built.depths)
    assert static.shape("cpu") is static.shape(torch.device("cpu"))


@pytest.mark.parametrize(
    "parents", [[[-1, 0, 2]], [[0, 0, 1]], [[-1, -1, 1]], [[-1, 0, 3]]], ids=["self", "root", "neg", "later"]
)
def test_draft_tree_rejects_parents_that_are_not_earlier_nodes(parents):
    with pytest.raises(ValueError, match="parents must be -1 at the root"):
        DraftTree(tokens=torch.zeros(1, 3, dtype=torch.long), parents=torch.tensor(parents))
    with pytest.raises(ValueError, match="same shape"):
        DraftTree(tokens=torch.zeros(1, 4, dtype=torch.long), parents=torch.tensor([[-1, 0, 1]]))


# -- the builder -----------------------------------------------------------------------------------

HAND_ACCURACIES = [[0.6, 0.3], [0.5, 0.1]]  # head 0 ranks 0/1, head 1 ranks 0/1
# path values: (0,) .6 | (1,) .3 | (0,0) .3 | (1,0) .15 | (0,1) .06 | (1,1) .03


def test_builder_grows_paths_by_expected_acceptance():
    assert build_tree(HAND_ACCURACIES, 6) == [
        (0,),
        (0, 0),
        (1,),
        (1, 0),
        (0, 1),
        (1, 1),
    ]  # (0,0) ties (1,): smaller first
    assert build_tree(HAND_ACCURACIES, 3) == [(0,), (0, 0), (1,)]
    assert build_tree(HAND_ACCURACIES, 0) == []
    assert expected_accept_length([(0,), (0, 0), (1,)], HAND_ACCURACIES) == pytest.approx(1 + 0.6 + 0.3 + 0.3)
    StaticTree.from_choices(build_tree(HAND_ACCURACIES, 4), num_heads=2, topk=2)


def test_builder_matches_brute_force_over_all_trees_of_that_size():
    acc = torch.tensor([[0.45, 0.2, 0.1], [0.35, 0.25, 0.05]])
    paths = [(r,) for r in range(3)] + [(r, s) for r in range(3) for s in range(3)]
    for size in range(1, 7):
        best = max(
            expected_accept_length(subset, acc)
            for subset in itertools.combinations(paths, size)
            if all(len(p) == 1 or p[:1] in subset for p in subset)
        )
        built = build_tree(acc, size)
        assert expected_accept_length(built, acc) == pytest.approx(best), size
        for n in range(size + 1):  # grown in order: every prefix is a tree
            StaticTree.from_choices(built[:n])


def test_builder_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"at most 6"):
        build_tree(HAND_ACCURACIES, 7)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        build_tree([[1.5, 0.1]], 1)
    with pytest.raises(ValueError, match=r"\(heads, ranks\)"):
        build_tree([0.5, 0.2], 1)
