"""Verification on hand-made trees: greedy (the longest matching path plus the bonus token), the sampling
walk's bookkeeping, and Medusa's typical acceptance (the exactness of the sampling rules is proved in
test_sampling_rules.py and test_sampling_decoder.py)."""

import pytest
import torch

from specheads.decode import DraftTree, verify_greedy
from specheads.decode.trees import TreeShape
from specheads.decode.verify import TypicalAcceptance, verify_sampling, verify_typical

V = 10


def logits_choosing(choices):
    """(1, N, V) logits whose argmax at node i is choices[i]."""
    logits = torch.zeros(1, len(choices), V)
    logits[0, torch.arange(len(choices)), torch.tensor(choices)] = 1.0
    return logits


#        root(5)
#       a(1)   b(2)
#       c(3)   d(4)
TREE = DraftTree(tokens=torch.tensor([[5, 1, 2, 3, 4]]), parents=torch.tensor([[-1, 0, 0, 1, 2]]))


def test_longest_matching_path_and_bonus():
    # target: after root -> 2 (b), after b -> 4 (d), after d -> 7 (bonus)
    [acc] = verify_greedy(TREE, logits_choosing([2, 0, 4, 0, 7]))
    assert acc.path.tolist() == [0, 2, 4]
    assert acc.tokens.tolist() == [2, 4, 7]
    assert acc.accept_length == 3 and acc.bonus == 7


def test_a_match_below_a_rejected_node_does_not_count():
    # after root -> 1 (a accepted), after a -> 9 (c rejected); d's token 4 equals the target's choice at
    # b, but b itself was rejected.
    [acc] = verify_greedy(TREE, logits_choosing([1, 9, 4, 0, 0]))
    assert acc.path.tolist() == [0, 1] and acc.tokens.tolist() == [1, 9]


def test_nothing_accepted_still_emits_the_bonus_token():
    [acc] = verify_greedy(TREE, logits_choosing([8, 0, 0, 0, 0]))
    assert acc.path.tolist() == [0] and acc.tokens.tolist() == [8] and acc.accept_length == 1


def test_root_alone_is_one_plain_decoding_step():
    tree = DraftTree(tokens=torch.tensor([[3]]), parents=torch.tensor([[-1]]))
    [acc] = verify_greedy(tree, logits_choosing([6]))
    assert acc.path.tolist() == [0] and acc.tokens.tolist() == [6]


def test_whole_chain_accepted():
    chain = DraftTree(tokens=torch.tensor([[0, 1, 2, 3]]), parents=torch.tensor([[-1, 0, 1, 2]]))
    [acc] = verify_greedy(chain, logits_choosing([1, 2, 3, 4]))
    assert acc.path.tolist() == [0, 1, 2, 3] and acc.tokens.tolist() == [1, 2, 3, 4]


def test_each_batch_row_is_verified_on_its_own_tree():
    tokens = torch.tensor([[5, 1, 2, 3, 4], [5, 1, 2, 3, 4]])
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3]])  # row 1 is a chain
    logits = torch.cat([logits_choosing([2, 0, 4, 0, 7]), logits_choosing([1, 2, 3, 4, 9])])
    first, second = verify_greedy(DraftTree(tokens, parents), logits)
    assert first.tokens.tolist() == [2, 4, 7]
    assert second.path.tolist() == [0, 1, 2, 3, 4] and second.tokens.tolist() == [1, 2, 3, 4, 9]


def test_argmax_ties_go_to_the_lowest_token_id_like_generate():
    logits = torch.zeros(1, 5, V)
    logits[0, 0, [2, 6]] = 1.0  # a tie after the root: argmax takes 2, as torch.argmax in generate does
    [acc] = verify_greedy(TREE, logits)
    assert acc.path.tolist()[:2] == [0, 2]


def test_a_tie_with_a_larger_id_is_not_a_match_even_when_it_leads_deeper():
    # after the root, tokens 1 (a) and 2 (b) tie: argmax takes 1, so a is accepted and b is not, although
    # b's child d matches the target there and would make a deeper path
    logits = logits_choosing([1, 9, 4, 0, 7])
    logits[0, 0, 2] = 1.0
    for walk in (True, False):
        [acc] = verify_greedy(TREE, logits, walk=walk)
        assert acc.path.tolist() == [0, 1] and acc.tokens.tolist() == [1, 9]


def test_siblings_with_one_token_follow_the_deeper_one():
    # a and b both carry token 1, the target's choice after the root; only b's child matches below
    tree = DraftTree(tokens=torch.tensor([[5, 1, 1, 3, 4]]), parents=torch.tensor([[-1, 0, 0, 1, 2]]))
    for walk in (True, False):
        [acc] = verify_greedy(tree, logits_choosing([1, 9, 4, 0, 7]), walk=walk)
        assert acc.path.tolist() == [0, 2, 4] and acc.tokens.tolist() == [1, 4, 7]


def random_trees(seed: int, count: int, batch: int, max_nodes: int):
    """`count` random batches of trees (parents, tokens (B, N)) with integer logits (B, N, 4) over V = 4:
    ties and repeated sibling tokens are common."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(count):
        nodes = int(torch.randint(1, max_nodes + 1, (1,), generator=gen))
        parents = torch.full((batch, nodes), -1)
        for i in range(1, nodes):
            parents[:, i] = torch.randint(0, i, (batch,), generator=gen)
        tokens = torch.randint(0, 4, (batch, nodes), generator=gen)
        yield parents, tokens, torch.randint(0, 3, (batch, nodes, 4), generator=gen).float()


@pytest.mark.parametrize("static", [False, True], ids=["grown", "static-shape"])
@pytest.mark.parametrize("walk", [True, False], ids=["walk", "whole-tree"])
def test_greedy_equals_the_whole_tree_argmax_rule_on_random_trees(walk, static):
    """Both ways of verify_greedy (the walk from the root, the argmax at every node) on random trees
    (batched, ties and repeated sibling tokens common at V = 4 in integer logits) return what the rule
    at every node gives."""
    for parents, tokens, logits in random_trees(seed=0, count=200, batch=3, max_nodes=11):
        batch, nodes = tokens.shape
        if static:  # one shape for every row, its children cached with it
            parents = parents[:1].expand(batch, -1)
            tree = DraftTree.on_shape(tokens, TreeShape.of(parents[0].tolist()))
        else:
            tree = DraftTree(tokens, parents)
        greedy = logits.argmax(-1)  # the rule at every node
        for b, acc in enumerate(verify_greedy(tree, logits, walk=walk)):
            path = acc.path.tolist()
            assert path[0] == 0 and all(parents[b, path[i + 1]] == path[i] for i in range(len(path) - 1))
            assert all(tokens[b, n] == greedy[b, parents[b, n]] for n in path[1:])
            kids = [n for n in range(nodes) if parents[b, n] == path[-1]]
            assert not any(tokens[b, n] == greedy[b, path[-1]] for n in kids)  # nothing deeper matched
            accepted = {0}  # every node whose root path matches all the way, parents before children
            for n in range(1, nodes):
                if int(parents[b, n]) in accepted and tokens[b, n] == greedy[b, parents[b, n]]:
                    accepted.add(n)
            deepest = max(tree.depths[b, n] for n in accepted)
            assert len(path) - 1 == deepest  # the deepest of them, the first of that depth
            assert path[-1] == min(n for n in accepted if tree.depths[b, n] == deepest)
            assert acc.tokens.tolist() == [*tokens[b, path[1:]].tolist(), int(greedy[b, path[-1]])]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_the_walk_reads_the_argmax_in_any_dtype(dtype):
    """The walk takes its argmax through numpy where numpy has the dtype (float16, float32, float64) and
    through torch elsewhere (bfloat16): on random trees with ties everywhere, every dtype's walk equals the
    whole-tree rule in float32, with int64 paths and tokens."""
    for parents, tokens, logits in random_trees(seed=1, count=50, batch=2, max_nodes=9):
        tree = DraftTree(tokens, parents)  # integer logits: exact in every dtype
        walked = verify_greedy(tree, logits.to(dtype), walk=True)
        for got, want in zip(walked, verify_greedy(tree, logits, walk=False)):
            assert got.path.dtype == got.tokens.dtype == torch.long
            assert got.path.tolist() == want.path.tolist() and got.tokens.tolist() == want.tokens.tolist()


# -- sampling: the tree walk on hand-made distributions ----------------------------------------------


def one_hot_probs(tokens):
    """(1, N, V) p at node i concentrated on tokens[i]."""
    probs = torch.zeros(1, len(tokens), V, dtype=torch.float64)
    probs[0, torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return probs


@pytest.mark.parametrize("rule", ["top-k", "iid", "without-replacement"])
def test_sampling_walk_follows_certain_acceptances(rule):
    # p after root -> 2 (b), after b -> 4 (d), after d -> 7: b and d are accepted with certainty, a is
    # rejected with certainty (p(1) = 0), whatever q is; the bonus after d is 7.
    probs = one_hot_probs([2, 0, 4, 0, 7])
    q = torch.full((1, 5, V), 1.0 / V, dtype=torch.float64)
    for seed in range(5):
        [acc] = verify_sampling(TREE, probs, torch.Generator().manual_seed(seed), rule, q)
        assert acc.path.tolist() == [0, 2, 4] and acc.tokens.tolist() == [2, 4, 7]


def test_sampling_walk_stops_at_the_first_rejection_and_draws_the_bonus_from_the_residual():
    # after root: p = (a: 0.5, 9: 0.5); a is the only child. If a is rejected the residual is all on 9.
    probs = one_hot_probs([0, 3, 0, 0, 0])
    probs[0, 0] = 0.0
    probs[0, 0, [1, 9]] = 0.5
    tree = DraftTree(tokens=torch.tensor([[5, 1, 3]]), parents=torch.tensor([[-1, 0, 1]]))
    seen = set()
    for seed in range(40):
        [acc] = verify_sampling(tree, probs[:, :3], torch.Generator().manual_seed(seed), "top-k")
        seen.add((tuple(acc.path.tolist()), tuple(acc.tokens.tolist())))
    # accepted: a, then c (p after a is on 3), then the bonus from p at c (on 0); or rejected: bonus 9
    assert seen == {((0, 1, 2), (1, 3, 0)), ((0,), (9,))}


def test_sampling_rules_need_what_they_read():
    probs = one_hot_probs([2, 0, 4, 0, 7])
    with pytest.raises(ValueError, match="unknown verification rule 'greedy'"):
        verify_sampling(TREE, probs, torch.Generator(), "greedy")
    with pytest.raises(ValueError, match="rule 'iid' needs the draft's distributions"):
        verify_sampling(TREE, probs, torch.Generator(), "iid")


# -- typical acceptance (LOSSY) ------------------------------------------------------------------------


def test_typical_acceptance_threshold_is_medusas():
    """Accept x when p(x) > min(ε, α·exp(-H(p))); the walk keeps the deepest passing path."""
    p_root = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05] + [0.0] * (V - 5), dtype=torch.float64)
    entropy = -(p_root[:5] * p_root[:5].log()).sum()
    probs = one_hot_probs([0, 6, 6, 6, 6])
    probs[0, 0] = p_root
    tree = DraftTree(tokens=torch.tensor([[9, 4, 3, 6]]), parents=torch.tensor([[-1, 0, 0, 2]]))
    cutoff = min(0.09, 0.3 * torch.exp(-entropy).item())  # 0.3·e^-1.33 = 0.079: 0.1 passes, 0.05 fails
    assert 0.05 < cutoff < 0.1
    [acc] = verify_typical(tree, probs[:, :4], torch.Generator(), TypicalAcceptance(0.09, 0.3))
    assert acc.path.tolist() == [0, 2, 3] and acc.tokens.tolist() == [3, 6, 6]
    # a threshold below 0.05 also accepts token 4 (node 1), but node 2's path is deeper
    [acc] = verify_typical(tree, probs[:, :4], torch.Generator(), TypicalAcceptance(0.01, 0.3))
    assert acc.path.tolist() == [0, 2, 3]


def test_typical_acceptance_is_lossy():
    """p after the root is (0.6, 0.4): typical acceptance takes a drafted 1 every time (0.4 > ε), where p
    would emit it 40% of the time."""
    probs = torch.zeros(1, 2, V, dtype=torch.float64)
    probs[0, 0, [0, 1]] = torch.tensor([0.6, 0.4], dtype=torch.float64)
    probs[0, 1, 0] = 1.0
    tree = DraftTree(tokens=torch.tensor([[5, 1]]), parents=torch.tensor([[-1, 0]]))
    firsts = [
        verify_typical(tree, probs, torch.Generator().manual_seed(s), TypicalAcceptance())[0].tokens[0].item()
        for s in range(20)
    ]
    assert firsts == [1] * 20
