"""EAGLE-2 dynamic draft trees (Li et al., 2024, "EAGLE-2: Faster Inference of Language Models with
Dynamic Draft Trees").

The tree grows where the draft is confident instead of along a fixed shape. A candidate's *value* is its
cumulative draft log-probability, the sum of log q over the path root..candidate: an estimate of the
log chance that the target accepts the whole path.

    expand   depth 1: the root's top_k tokens; every one of them is expanded. Each later depth: each
             expanded node proposes its top_k children (top_k² candidates), and the top_k of those by
             value are expanded next. `depth` counts tree levels (the root's children are depth 1), so
             there are depth - 1 expansions after the first top-k; EAGLE's own `depth` parameter counts
             those expansions, i.e. its depth d is depth d + 1 here.
    rerank   keep the total_tokens - 1 candidates of highest value (the root makes total_tokens nodes,
             as in EAGLE, where `total_token` is what the target verifies). A child's value never
             exceeds its parent's (log q <= 0) and a parent is created before its children, so ordering
             by (value descending, creation order) puts every parent ahead of its children: the kept set
             is a tree.
    tree     the root, then the kept candidates in creation order (parents before children).
    stop     (`keep`, exact) growth ends early once no node of the frontier could be kept: a descendant's
             value never exceeds its ancestor's and it is created after every candidate so far, so when
             each row's best frontier value is at most the value of its keep-th best candidate (a tie goes
             to the earlier), nothing grown below the frontier can enter the kept set. The kept set, and
             so the tree, is the one full growth gives; only the expansions that could not change it are
             skipped (each one a draft forward: on the CPU a small tree's deep levels cost more than the
             nodes they never contribute).

The expansion step, a forward of the draft over the nodes to expand, is the caller's (`expand`); this
module only decides which nodes to expand and keep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specheads.decode.trees import DraftTree


@dataclass
class Candidates:
    """Every node proposed while growing dynamic trees, in creation order: one tree's (M,) tables, or B
    rows' (B, M) (`grow_rows`; `row(b)` is row b's).

    tokens:  (..., M) int64 draft-vocabulary ids.
    parents: (..., M) int64 index of the parent candidate; -1 for the root's children.
    scores:  (..., M) float cumulative log-probability of the path root..candidate.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    scores: torch.Tensor

    def add(self, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """Append candidates (..., m); returns their ids (m,)."""
        start = len(self)
        self.tokens = torch.cat([self.tokens, tokens], dim=-1)
        self.parents = torch.cat([self.parents, parents], dim=-1)
        self.scores = torch.cat([self.scores, scores], dim=-1)
        return torch.arange(start, len(self), device=self.tokens.device)

    def row(self, b: int) -> Candidates:
        return Candidates(tokens=self.tokens[b], parents=self.parents[b], scores=self.scores[b])

    def __len__(self) -> int:
        return self.tokens.shape[-1]


# expand(candidates, ids (k,)) -> (k, V) the draft's log-probabilities of each node's next token.
Expand = Callable[[Candidates, torch.Tensor], torch.Tensor]
# expand(candidates (B, M), frontier (B, k), depth) -> (B, k, V): the same for B rows, the frontier's
# nodes all at `depth` (>= 1).
ExpandRows = Callable[[Candidates, torch.Tensor, int], torch.Tensor]


def grow_rows(
    root_logprobs: torch.Tensor,
    expand: ExpandRows,
    *,
    top_k: int,
    depth: int,
    keep: int | None = None,
) -> Candidates:
    """EAGLE-2's expansion (module docstring) for B rows at once: top_k + (depth - 1) · top_k² candidates
    per row, each row expanding its own top_k nodes per level.

    Args:
        root_logprobs: (B, V) the draft's log-probabilities of the token after each root.
        expand: runs the draft over each row's frontier (nodes of one depth, whose parents were expanded).
        top_k: children per expanded node, and nodes expanded per depth.
        depth: tree levels below the root (>= 1).
        keep: how many candidates the rerank will keep (total_tokens - 1): growth stops once no row's
            frontier can reach them (module docstring, "stop"). None grows every level.

    Returns:
        (B, M) candidates; with `keep`, possibly fewer levels of them, the `keep` most valuable unchanged.
    """
    if top_k < 1 or depth < 1:
        raise ValueError(f"dynamic trees need top_k >= 1 and depth >= 1, got top_k={top_k}, depth={depth}")
    b, k, device = root_logprobs.shape[0], min(top_k, root_logprobs.shape[-1]), root_logprobs.device
    best = root_logprobs.float().topk(k, dim=-1)
    parents = torch.full((b, k), -1, dtype=torch.long, device=device)
    candidates = Candidates(tokens=best.indices, parents=parents, scores=best.values)
    frontier = torch.arange(k, device=device).expand(b, k)
    for level in range(1, depth):  # the frontier's depth
        if keep is not None and cannot_be_kept(candidates, frontier, keep):
            break
        children = expand(candidates, frontier, level).float().topk(k, dim=-1)  # (B, k, k) per frontier node
        scores = (candidates.scores.gather(1, frontier)[:, :, None] + children.values).reshape(b, -1)
        ids = candidates.add(
            children.indices.reshape(b, -1), frontier[:, :, None].expand(b, k, k).reshape(b, -1), scores
        )  # (k²,)
        frontier = ids[scores.topk(k, dim=-1).indices].sort(-1).values
    return candidates


def cannot_be_kept(candidates: Candidates, frontier: torch.Tensor, keep: int) -> bool:
    """Whether, in every row, no descendant of the frontier (B, k) can be among the `keep` most valuable
    candidates: the row's best frontier value is at most its keep-th best candidate's (module docstring)."""
    if keep < 1:
        return True  # nothing is kept
    if len(candidates) < keep:
        return False
    kth = candidates.scores.topk(keep, dim=-1).values[:, -1]  # (B,)
    best = candidates.scores.gather(1, frontier).max(-1).values  # (B,)
    return bool((best <= kth).all())


def grow_candidates(
    root_logprobs: torch.Tensor, expand: Expand, *, top_k: int, depth: int, keep: int | None = None
) -> Candidates:
    """`grow_rows` for one tree: (V,) root log-probabilities, `expand` over (k,) ids; (M,) candidates."""

    def expand_row(candidates: Candidates, frontier: torch.Tensor, depth: int) -> torch.Tensor:
        return expand(candidates.row(0), frontier[0])[None]

    return grow_rows(root_logprobs[None], expand_row, top_k=top_k, depth=depth, keep=keep).row(0)


def rerank(candidates: Candidates, num_kept: int) -> torch.Tensor:
    """Ids of the `num_kept` most valuable candidates, ascending (creation order); ancestor-closed."""
    order = torch.sort(-candidates.scores, stable=True).indices  # value descending, ties by creation
    return order[: min(num_kept, len(candidates))].sort().values


def candidates_to_tree(
    root: torch.Tensor,
    candidates: Candidates,
    kept: torch.Tensor,
    to_target: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> DraftTree:
    """The root (a target id) and the kept candidates (ascending ids) -> a one-row DraftTree.

    `to_target` maps draft-vocabulary ids to target ids (EAGLE-3's d2t); None when they are the same.
    """
    node_of = torch.full((len(candidates),), -1, dtype=torch.long, device=kept.device)
    node_of[kept] = torch.arange(1, kept.numel() + 1, device=kept.device)
    parent_ids = candidates.parents[kept]
    parents = torch.where(parent_ids < 0, 0, node_of[parent_ids.clamp(min=0)])
    if (parents < 0).any():
        raise ValueError("kept candidates are not a tree: a parent was dropped")
    drafted = candidates.tokens[kept] if to_target is None else to_target(candidates.tokens[kept])
    tokens = torch.cat([root.reshape(1).to(drafted), drafted])
    parents = torch.cat([torch.tensor([-1], device=kept.device), parents])
    return DraftTree(tokens=tokens[None], parents=parents[None])


def dynamic_tree(
    root: torch.Tensor,
    root_logprobs: torch.Tensor,
    expand: Expand,
    *,
    top_k: int,
    depth: int,
    total_tokens: int,
    to_target: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> DraftTree:
    """Grow, rerank to `total_tokens` nodes (the root included) and lay out an EAGLE-2 tree.

    Args:
        root: the root's token (a target id).
        root_logprobs: (V,) the draft's log-probabilities of the token after the root.
        expand: see `grow_candidates`.
        to_target: draft ids -> target ids, for a draft with its own vocabulary.
    """
    if total_tokens < 1:
        raise ValueError(f"total_tokens counts the root and must be >= 1, got {total_tokens}")
    candidates = grow_candidates(root_logprobs, expand, top_k=top_k, depth=depth, keep=total_tokens - 1)
    return candidates_to_tree(root, candidates, rerank(candidates, total_tokens - 1), to_target)
