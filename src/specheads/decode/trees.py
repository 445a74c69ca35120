"""Draft trees: tokens and parent pointers, static Medusa trees, and a tree builder.

A draft tree over N nodes is kept in topological order (a parent comes before its children):

    node 0        the root: the last accepted token. It is not in the KV cache yet; the target's logits
                  at the root predict the token right after it.
    node i >= 1   a candidate for the token depth(i) steps after the root, with parents[i] < i.

The target reads the whole tree in one forward: each node sees the past and its own ancestors, at
position past_len + depth (see `tree_inputs.py`).

Static trees are written as Medusa's *tree choices*: a list of paths, each a tuple of per-depth ranks.
Path (r_1, ..., r_d) is the node at depth d whose token is Medusa head (d-1)'s rank-r_d guess, below
the node (r_1, ..., r_{d-1}). `[(0,), (1,), (0, 0)]` is the root with two children (head 0's top-1 and
top-2) and a grandchild under the first (head 1's top-1).
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

TreeChoices = Sequence[Sequence[int]]

# Medusa's published tree for Vicuna-7B (FasterDecoding/Medusa, medusa/model/medusa_choices.py:
# mc_sim_7b_63), chosen there from head accuracies measured on that model. Its paths are listed so that
# every prefix of the list is itself a tree (tested): the smaller defaults below are its first 15 and
# 31 paths.
MC_SIM_7B_63: tuple[tuple[int, ...], ...] = (
    (0,), (0, 0), (1,), (0, 1), (2,), (0, 0, 0), (1, 0), (0, 2), (3,), (0, 3), (4,), (0, 4), (2, 0),
    (0, 5), (0, 0, 1), (5,), (0, 6), (6,), (0, 7), (0, 1, 0), (1, 1), (7,), (0, 8), (0, 0, 2), (3, 0),
    (0, 9), (8,), (9,), (1, 0, 0), (0, 2, 0), (1, 2), (0, 0, 3), (4, 0), (2, 1), (0, 0, 4), (0, 0, 5),
    (0, 0, 0, 0), (0, 1, 1), (0, 0, 6), (0, 3, 0), (5, 0), (1, 3), (0, 0, 7), (0, 0, 8), (0, 0, 9),
    (6, 0), (0, 4, 0), (1, 4), (7, 0), (0, 1, 2), (2, 0, 0), (3, 1), (2, 2), (8, 0), (0, 5, 0), (1, 5),
    (1, 0, 1), (0, 2, 1), (9, 0), (0, 6, 0), (0, 0, 0, 1), (1, 6), (0, 7, 0),
)  # fmt: skip

# Default trees by name; the number is the count of candidate nodes (the root not included).
DEFAULT_TREES: dict[str, tuple[tuple[int, ...], ...]] = {
    "chain-4": ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)),
    "medusa-15": MC_SIM_7B_63[:15],
    "medusa-31": MC_SIM_7B_63[:31],
    "medusa-63": MC_SIM_7B_63,
}


# -- draft trees (what a drafter proposes) ---------------------------------------------------------


@dataclass
class DraftTree:
    """A proposed tree of tokens, one per batch row.

    tokens:  (B, N) int64; tokens[:, 0] is the root (the last accepted token).
    parents: (B, N) int64; parents[:, 0] == -1 and 0 <= parents[:, i] < i for i >= 1.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    # the static tree these are laid on (`on_shape`), whose attention block is cached with it; None for a
    # tree grown per step (EAGLE-2) or built directly
    static_shape: TreeShape | None = field(default=None, kw_only=True, repr=False, compare=False)

    def __post_init__(self):
        if self.tokens.ndim != 2 or self.tokens.shape != self.parents.shape:
            raise ValueError(
                f"a draft tree needs tokens and parents of the same shape (B, N), got "
                f"{tuple(self.tokens.shape)} and {tuple(self.parents.shape)}"
            )
        n = self.parents.shape[1]
        index = torch.arange(n, device=self.parents.device)
        if (
            (self.parents[:, 0] != -1).any()
            or (self.parents[:, 1:] < 0).any()
            or (self.parents[:, 1:] >= index[1:]).any()
        ):
            raise ValueError(
                f"draft tree parents must be -1 at the root and point to an earlier node elsewhere, got "
                f"{self.parents.tolist()}"
            )

    @classmethod
    def on_shape(cls, tokens: torch.Tensor, shape: TreeShape, **fields) -> DraftTree:
        """B trees of one known shape: `tokens` (B, N) laid on `shape` (a checked StaticTree's), whose
        ancestors and depths are computed once per tree rather than once per step; `fields` fill a
        subclass's own (SampledTree's draft_probs, children)."""
        b = tokens.shape[0]
        tree = cls.__new__(cls)  # the shape was checked when it was built: no per-step validation
        tree.tokens, tree.parents, tree.static_shape = tokens, shape.parents.expand(b, -1), shape
        for name, value in fields.items():
            setattr(tree, name, value)
        tree.__dict__["ancestors"] = shape.ancestors.expand(b, -1, -1)  # the cached properties
        tree.__dict__["depths"] = shape.depths.expand(b, -1)
        return tree

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """(B, N, N) bool: [b, i, j] is True when node j is node i or one of its ancestors."""
        return ancestor_mask(self.parents)

    @cached_property
    def depths(self) -> torch.Tensor:
        """(B, N) int64: 0 at the root, 1 for its children, ..."""
        return self.ancestors.sum(-1) - 1

    def row_children(self, b: int) -> list[list[int]]:
        """Row b's children of each node, in tree order (a static shape's, listed once per shape)."""
        if self.static_shape is not None:
            return self.static_shape.children
        return tree_children(self.parents[b].tolist())


def tree_children(parents: list[int] | tuple[int, ...]) -> list[list[int]]:
    """Each node's children, in tree order, from parent pointers (root first)."""
    children: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents[1:], start=1):
        children[parent].append(node)
    return children


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(B, N) parent pointers -> (B, N, N) bool, [b, i, j] = node j is node i or an ancestor of it."""
    b, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n)
    # step[b, i, j] = j is the parent of i. Walking it from every node reaches one level up per hop.
    step = torch.zeros(b, n, n, dtype=torch.float32, device=parents.device)
    step[:, 1:].scatter_(-1, parents[:, 1:, None], 1.0)
    ancestors, reach = eye.clone(), step
    while reach.any():
        ancestors |= reach.bool()
        reach = reach @ step  # one more level up
    return ancestors


@dataclass(frozen=True)
class TreeShape:
    """One tree's parents (1, N), ancestors (1, N, N) and depths (1, N), on one device, and each node's
    children (lists, in tree order): what every step of a static tree shares (`DraftTree.on_shape`)."""

    parents: torch.Tensor
    ancestors: torch.Tensor
    depths: torch.Tensor
    masks: dict = field(default_factory=dict, compare=False)  # dtype -> (1, 1, N, N) additive mask

    @cached_property
    def children(self) -> list[list[int]]:
        return tree_children(self.parents[0].tolist())

    @classmethod
    def of(cls, parents: Sequence[int], device: torch.device | str | None = None) -> TreeShape:
        tree = DraftTree(
            tokens=torch.zeros(1, len(parents), dtype=torch.long), parents=torch.tensor([parents])
        )
        return cls(tree.parents.to(device), tree.ancestors.to(device), tree.depths.to(device))


# -- static trees from tree choices -----------------------------------------------------------------


@dataclass(frozen=True)
class StaticTree:
    """A tree shape fixed in advance, from Medusa tree choices (see module docstring).

    choices: the paths in canonical order (by depth, then ranks), node i+1 is choices[i].
    parents, depths, ranks: per node (root first); the root has parent -1, depth 0 and rank 0.
    """

    choices: tuple[tuple[int, ...], ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def from_choices(
        cls, choices: TreeChoices, num_heads: int | None = None, topk: int | None = None
    ) -> StaticTree:
        """Validate Medusa tree choices and lay them out as a tree.

        Args:
            choices: paths of per-depth ranks, e.g. `[(0,), (1,), (0, 0)]`; every prefix of a path must
                be a path too. An empty list is the root alone (plain autoregressive decoding).
            num_heads: when given, no path may be deeper than this (depth d reads head d-1).
            topk: when given, every rank must be below it.

        Raises:
            ValueError: naming the first bad path (malformed, duplicated, too deep, rank past top-k,
                or missing its prefix).
        """
        paths = [_as_path(path) for path in choices]
        seen = set()
        for path in paths:
            if path in seen:
                raise ValueError(f"tree choice {path} appears more than once")
            seen.add(path)
            if num_heads is not None and len(path) > num_heads:
                raise ValueError(
                    f"tree choice {path} has depth {len(path)} but there are only {num_heads} heads "
                    f"(depth d reads head d-1)"
                )
            if topk is not None and max(path) >= topk:
                depth = next(d for d, r in enumerate(path, 1) if r >= topk)
                raise ValueError(
                    f"tree choice {path}: rank {path[depth - 1]} at depth {depth} is past top-k={topk}"
                )
        for path in paths:
            if len(path) > 1 and path[:-1] not in seen:
                raise ValueError(f"tree choice {path} needs its prefix {path[:-1]} in the tree")
        ordered = tuple(sorted(paths, key=lambda p: (len(p), p)))
        index = {path: i + 1 for i, path in enumerate(ordered)}
        return cls(
            choices=ordered,
            parents=(-1, *(index.get(p[:-1], 0) for p in ordered)),
            depths=(0, *(len(p) for p in ordered)),
            ranks=(0, *(p[-1] for p in ordered)),
        )

    def shape(self, device: torch.device | str | None = None) -> TreeShape:
        """Its parents, ancestors and depths as tensors on `device`, built once per device."""
        key = str(torch.device(device or "cpu"))
        shapes = self.__dict__.setdefault("_shapes", {})  # a cache beside the frozen fields
        if key not in shapes:
            shapes[key] = TreeShape.of(self.parents, key)
        return shapes[key]

    @property
    def num_nodes(self) -> int:
        """Nodes including the root."""
        return len(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    @property
    def topk(self) -> int:
        """How many guesses per head the tree reads (1 for the root alone)."""
        return max(self.ranks) + 1


def _as_path(path) -> tuple[int, ...]:
    if isinstance(path, (str, bytes)) or not isinstance(path, Sequence) or len(path) == 0:
        raise ValueError(f"tree choice {path!r} must be a non-empty sequence of ranks")
    if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
        raise ValueError(f"tree choice {path!r} must hold ranks that are ints >= 0")
    return tuple(path)


def named_tree_paths(name: str) -> tuple[tuple[int, ...], ...]:
    """The paths of a named static tree: one of DEFAULT_TREES, or `chain-K` (K >= 1: the top guess at each of
    K depths, one node a depth: the cheapest tree to draft K deep)."""
    if name in DEFAULT_TREES:
        return DEFAULT_TREES[name]
    chain = re.fullmatch(r"chain-([1-9][0-9]*)", name)
    if chain is None:
        raise ValueError(
            f"unknown tree {name!r}; expected one of {sorted(DEFAULT_TREES)}, or chain-K with K >= 1"
        )
    return tuple((0,) * depth for depth in range(1, int(chain.group(1)) + 1))


def default_tree(name: str, num_heads: int | None = None) -> StaticTree:
    """A named static tree (`named_tree_paths`), keeping only the paths that `num_heads` heads can fill.

    Dropping every path deeper than the number of heads keeps the tree prefix-closed.
    """
    choices = [p for p in named_tree_paths(name) if num_heads is None or len(p) <= num_heads]
    return StaticTree.from_choices(choices, num_heads=num_heads)


# -- choosing a tree from measured accuracies --------------------------------------------------------


def build_tree(accuracies: Sequence[Sequence[float]] | torch.Tensor, num_nodes: int) -> list[tuple[int, ...]]:
    """The tree of `num_nodes` candidates with the largest expected acceptance (Medusa paper, §2.3.3).

    Each path's value is the product of its per-depth accuracies, acc[d-1][r_d]: the chance that every
    token on it is right if the heads err independently. The expected number of accepted candidates of
    a tree is the sum of its paths' values, and a child's value never exceeds its parent's, so adding
    the most valuable child of the tree so far, `num_nodes` times, gives the best tree of that size.

    Args:
        accuracies: (K heads, R ranks), acc[k][r] = how often head k's rank-r guess is the right token.
        num_nodes: candidate nodes wanted (the root not counted).

    Returns:
        Tree choices in the order they were added (so every prefix is a tree too); ties go to the
        smaller path.
    """
    acc = torch.as_tensor(accuracies, dtype=torch.float64)
    if acc.ndim != 2 or acc.numel() == 0:
        raise ValueError(f"accuracies must be (heads, ranks), got shape {tuple(acc.shape)}")
    if ((acc < 0) | (acc > 1)).any():
        raise ValueError("accuracies must lie in [0, 1]")
    num_heads, num_ranks = acc.shape
    available = sum(num_ranks**d for d in range(1, num_heads + 1))
    if not 0 <= num_nodes <= available:
        raise ValueError(
            f"asked for {num_nodes} nodes; {num_heads} heads with top-{num_ranks} give at most {available}"
        )
    frontier = [(-acc[0, r].item(), (r,)) for r in range(num_ranks)]  # (-value, path): a max-heap
    heapq.heapify(frontier)
    choices = []
    while len(choices) < num_nodes:
        neg_value, path = heapq.heappop(frontier)
        choices.append(path)
        if len(path) < num_heads:
            for r in range(num_ranks):
                heapq.heappush(frontier, (neg_value * acc[len(path), r].item(), (*path, r)))
    return choices


def expected_accept_length(
    choices: TreeChoices, accuracies: Sequence[Sequence[float]] | torch.Tensor
) -> float:
    """τ a tree should reach under independent head errors: 1 (bonus) + Σ over paths of Π accuracies."""
    acc = torch.as_tensor(accuracies, dtype=torch.float64)
    total = 1.0
    for path in choices:
        total += torch.prod(torch.stack([acc[d, r] for d, r in enumerate(path)])).item()
    return total
