"""EAGLE-2 dynamic trees: which nodes are expanded and kept, and that the result is a valid tree."""

import pytest
import torch

from specheads.decode.dynamic_tree import Candidates, dynamic_tree, grow_candidates, rerank

V = 30


def path_logprobs(path: tuple[int, ...]) -> torch.Tensor:
    """A made-up draft: next-token log-probabilities that depend on the whole path."""
    g = torch.Generator().manual_seed(hash(path) % (2**31))
    return (3 * torch.randn(V, generator=g)).log_softmax(-1)


def path_of(candidates: Candidates, node: int) -> tuple[int, ...]:
    path = []
    while node >= 0:
        path.append(int(candidates.tokens[node]))
        node = int(candidates.parents[node])
    return tuple(path[::-1])


class Recorder:
    """The `expand` callback: log-probabilities of the made-up draft, and a record of what was fed."""

    def __init__(self):
        self.fed: list[list[int]] = []

    def __call__(self, candidates: Candidates, ids: torch.Tensor) -> torch.Tensor:
        self.fed.append(ids.tolist())
        return torch.stack([path_logprobs(path_of(candidates, int(i))) for i in ids])


@pytest.mark.parametrize("top_k, depth", [(1, 1), (3, 4), (5, 3)])
def test_expansion_follows_eagle2(top_k, depth):
    expand = Recorder()
    root = path_logprobs(())
    candidates = grow_candidates(root, expand, top_k=top_k, depth=depth)
    assert len(candidates) == top_k + (depth - 1) * top_k**2
    assert len(expand.fed) == depth - 1 and all(len(ids) == top_k for ids in expand.fed)
    # depth 1: the root's top-k, all expanded; values are cumulative log-probabilities
    assert candidates.tokens[:top_k].tolist() == root.topk(top_k).indices.tolist()
    for node in range(len(candidates)):
        path = path_of(candidates, node)
        value = sum(path_logprobs(path[:d])[path[d]] for d in range(len(path)))
        assert candidates.scores[node].item() == pytest.approx(float(value), abs=1e-4)
    # each later depth expands the top-k (by value) of the candidates the depth before made
    start = top_k
    for level, ids in enumerate(expand.fed[1:]):
        made = torch.arange(start, start + top_k**2)
        best = made[candidates.scores[made].topk(top_k).indices]
        assert sorted(ids) == sorted(best.tolist()), level
        start += top_k**2
    assert expand.fed[0] == list(range(top_k)) if expand.fed else True


@pytest.mark.parametrize("total_tokens", [1, 2, 10, 40, 200])
def test_rerank_keeps_the_most_valuable_nodes_as_a_tree(total_tokens):
    expand = Recorder()
    root_token = torch.tensor(7)
    tree = dynamic_tree(root_token, path_logprobs(()), expand, top_k=4, depth=4, total_tokens=total_tokens)
    candidates = grow_candidates(path_logprobs(()), Recorder(), top_k=4, depth=4)
    n = min(total_tokens, len(candidates) + 1)
    assert tree.num_nodes == n  # size = total_tokens (the root included), or every candidate
    parents = tree.parents[0]
    assert parents[0] == -1 and (parents[1:] < torch.arange(1, n)).all() and (parents[1:] >= 0).all()
    assert tree.tokens[0, 0] == 7
    kept = rerank(candidates, total_tokens - 1)
    assert torch.equal(tree.tokens[0, 1:], candidates.tokens[kept])
    if 0 < kept.numel() < len(candidates):  # nothing dropped is worth more than what was kept
        dropped = torch.ones(len(candidates), dtype=torch.bool)
        dropped[kept] = False
        assert candidates.scores[kept].min() >= candidates.scores[dropped].max()
    # the ancestry the mask is built from is the candidates' own
    for node in range(1, n):
        chain = tree.ancestors[0, node].nonzero().squeeze(-1).tolist()
        assert tuple(tree.tokens[0, chain[1:]].tolist()) == path_of(candidates, int(kept[node - 1]))
        assert tree.depths[0, node] == len(chain) - 1


def test_ties_keep_parents_before_children():
    flat = torch.zeros(V).log_softmax(-1)  # every token equally likely: all ties
    tree = dynamic_tree(
        torch.tensor(0), flat, lambda c, ids: flat.expand(len(ids), V), top_k=3, depth=3, total_tokens=8
    )
    assert tree.num_nodes == 8 and (tree.parents[0, 1:] < torch.arange(1, 8)).all()


def test_draft_ids_are_mapped_to_target_ids():
    tree = dynamic_tree(
        torch.tensor(500),
        path_logprobs(()),
        Recorder(),
        top_k=3,
        depth=2,
        total_tokens=6,
        to_target=lambda i: i + 100,
    )
    assert tree.tokens[0, 0] == 500 and (tree.tokens[0, 1:] >= 100).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match="top_k >= 1 and depth >= 1"):
        grow_candidates(path_logprobs(()), Recorder(), top_k=0, depth=2)
    with pytest.raises(ValueError, match="total_tokens counts the root"):
        dynamic_tree(torch.tensor(0), path_logprobs(()), Recorder(), top_k=2, depth=2, total_tokens=0)


def test_rows_grow_as_each_row_alone():
    """grow_rows over B rows (the batched drafter's growth) is grow_candidates row by row."""
    from specheads.decode.dynamic_tree import grow_rows

    roots = [(r,) for r in range(3)]  # each row's made-up draft starts from a different path

    def expand_rows(candidates, frontier, depth):
        return torch.stack(
            [
                torch.stack(
                    [path_logprobs(roots[b] + path_of(candidates.row(b), int(i))) for i in frontier[b]]
                )
                for b in range(frontier.shape[0])
            ]
        )

    rows = grow_rows(torch.stack([path_logprobs(r) for r in roots]), expand_rows, top_k=3, depth=4)
    for b, root in enumerate(roots):

        def expand(candidates, ids, root=root):
            return torch.stack([path_logprobs(root + path_of(candidates, int(i))) for i in ids])

        alone = grow_candidates(path_logprobs(root), expand, top_k=3, depth=4)
        assert torch.equal(rows.row(b).tokens, alone.tokens) and torch.equal(
            rows.row(b).parents, alone.parents
        )
        assert torch.allclose(rows.row(b).scores, alone.scores)


def sharp_logprobs(scale: float):
    """A made-up draft like `path_logprobs`, `scale` times as sharp: at 60 its top token's log-probability
    is 0.0 in float (exact ties down a confident chain), at 0.3 nearly flat."""

    def draft(path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(path) % (2**31))
        return (scale * torch.randn(V, generator=g)).log_softmax(-1)

    return draft


@pytest.mark.parametrize("scale", [0.3, 3.0, 60.0])
@pytest.mark.parametrize("total_tokens", [1, 2, 4, 8, 16, 32, 200])
def test_growth_stops_early_and_keeps_the_same_tree(scale, total_tokens):
    """Growing with `keep` skips expansions, never the tree: the kept candidates (tokens, parents, values)
    are those of full growth, for flat drafts, sharp ones (ties at log q = 0) and every size."""
    draft = sharp_logprobs(scale)
    for root in range(6):

        def expand(candidates, ids, root=root):
            return torch.stack([draft((root,) + path_of(candidates, int(i))) for i in ids])

        full = grow_candidates(draft((root,)), expand, top_k=4, depth=5)
        fed: list[int] = []

        def counted(candidates, ids, root=root, fed=fed):
            fed.append(len(ids))
            return expand(candidates, ids, root)

        early = grow_candidates(draft((root,)), counted, top_k=4, depth=5, keep=total_tokens - 1)
        kept_full, kept_early = rerank(full, total_tokens - 1), rerank(early, total_tokens - 1)
        assert torch.equal(full.tokens[kept_full], early.tokens[kept_early]), (scale, total_tokens, root)
        assert torch.equal(full.parents[kept_full], early.parents[kept_early])
        assert torch.equal(full.scores[kept_full], early.scores[kept_early])
        assert len(fed) <= 4
        if total_tokens <= 2:  # the best depth-1 node is the best candidate: nothing below can beat it
            assert fed == []
        if total_tokens == 200:  # more than there are candidates: every level grows
            assert len(fed) == 4


def test_rows_stop_only_when_every_row_can():
    """B rows stop together: a confident row keeps the growth going for all, and each row's kept set is
    still its full growth's."""
    from specheads.decode.dynamic_tree import grow_rows

    def grow(drafts, keep=None):
        def expand_rows(candidates, frontier, depth):
            return torch.stack(
                [
                    torch.stack([drafts[b](path_of(candidates.row(b), int(i))) for i in frontier[b]])
                    for b in range(frontier.shape[0])
                ]
            )

        return grow_rows(torch.stack([d(()) for d in drafts]), expand_rows, top_k=3, depth=5, keep=keep)

    drafts = [sharp_logprobs(60.0), sharp_logprobs(0.3)]  # a deep chain beside a flat row
    full, early, flat_alone = grow(drafts), grow(drafts, keep=5), grow(drafts[1:], keep=5)
    assert len(early) == len(full)  # the sharp row's chain stays worth keeping to the last level
    assert len(flat_alone) < len(full)  # alone, the flat row would have stopped
    for b in range(2):
        kept_full, kept_early = rerank(full.row(b), 5), rerank(early.row(b), 5)
        assert torch.equal(full.row(b).tokens[kept_full], early.row(b).tokens[kept_early])
