"""EAGLE-2 calibration for `--tree auto` (decode/calibrate.py's docstring says what is replayed and why): the tree of
every candidate, drafted along greedy decoding at the roots some candidate's walk reaches and verified where
some candidate keeps nodes; each candidate's τ replayed from it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.calibrate import CalibrationSettings, Candidate, replay
from specheads.decode.decoder import SpeculativeDecoder, eos_ids
from specheads.decode.drafter_factory import dynamic_drafter
from specheads.decode.drafters import DraftContext
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.decode.kv_cache import new_cache
from specheads.decode.trees import DraftTree
from specheads.decode.verify import Acceptance, verify_greedy

# -- EAGLE-2: node values and accepted paths of the largest trees, at the roots the candidates reach ---------


@dataclass
class DynamicStep:
    """The tree of every candidate at one root, and what the target accepts of it.

    values: (N,) each node's cumulative draft log-probability (0 at the root).
    depths: (N,) each node's depth; nodes are in creation order, as `dynamic_tree` lays them out.
    path:   (n,) the accepted path's node ids, root first (as far as the verified nodes reach).
    """

    values: torch.Tensor
    depths: torch.Tensor
    path: torch.Tensor


class _ValueRecorder:
    """Proposes an EagleDrafter's tree of every candidate and keeps its node values (the drafter's own
    scores, which its rerank orders by) and depths."""

    def __init__(self, drafter: EagleDrafter):
        self.drafter, self.capture_layers = drafter, drafter.capture_layers
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None

    def propose(self, context: DraftContext) -> DraftTree:
        tree = self.drafter.propose(context)
        scores = self.drafter.grown.scores[0].float().cpu()  # (M,) every candidate, in creation order
        if tree.num_nodes != scores.numel() + 1:
            raise ValueError(
                f"the replay reads the tree of every candidate ({scores.numel() + 1} nodes); the drafter "
                f"kept {tree.num_nodes}"
            )
        self.last = (torch.cat([scores.new_zeros(1), scores]), node_depths(tree.parents[0].cpu()))
        return tree


def node_depths(parents: torch.Tensor) -> torch.Tensor:
    """(N,) parents (parents first, -1 at the root) -> (N,) depths, a level a pass (`DraftTree.depths` builds
    the (N, N) ancestor mask, which the tree of every candidate need not pay for at each root)."""
    depths = torch.zeros_like(parents)
    for _ in range(parents.numel()):
        deeper = torch.where(parents >= 0, depths[parents.clamp(min=0)] + 1, 0)
        if torch.equal(deeper, depths):
            return depths
        depths = deeper
    return depths


class _Verified:
    """`recorder`'s tree cut to the nodes some candidate keeps: the root and, for each depth D, the N - 1
    most valuable nodes no deeper than D, N the largest size tried at D (`largest`; a smaller tree of that
    depth keeps a subset). A node left out is in no candidate's tree, so each candidate accepts as much as
    with the whole tree verified (greedy acceptance at a node depends only on its ancestors)."""

    def __init__(self, recorder: _ValueRecorder, largest: dict[int, int]):
        self.recorder, self.largest, self.capture_layers = recorder, largest, recorder.capture_layers
        self.ids: torch.Tensor | None = None  # (n,) the verified nodes' ids in the whole tree, ascending

    def propose(self, context: DraftContext) -> DraftTree:
        whole = self.recorder.propose(context)
        step = DynamicStep(*self.recorder.last, path=torch.zeros(1, dtype=torch.long))
        kept = torch.stack([kept_nodes(step, d, n) for d, n in self.largest.items()]).any(0)
        self.ids = kept.nonzero().squeeze(1)  # ascending: parents before children
        return subtree(whole, self.ids)


def subtree(tree: DraftTree, ids: torch.Tensor) -> DraftTree:
    """The one-row tree of nodes `ids` (ascending, the root first, every parent among them), renumbered."""
    renumber = torch.full((tree.num_nodes,), -1, dtype=torch.long)
    renumber[ids] = torch.arange(ids.numel())
    parents = tree.parents[0, ids].cpu()
    parents = torch.where(parents >= 0, renumber[parents.clamp(min=0)], -1)
    device = tree.tokens.device
    return DraftTree(tokens=tree.tokens[:, ids.to(device)], parents=parents[None].to(device))


def dynamic_shapes(settings: CalibrationSettings, top_k: int) -> list[tuple[int, int]]:
    """(depth, nodes) of every EAGLE-2 candidate: depths 1..max_depth, each with the sizes it can fill."""
    return [
        (depth, n)
        for depth in range(1, settings.max_depth + 1)
        for n in settings.sizes
        if 2 <= n <= top_k + (depth - 1) * top_k**2 + 1
    ]


@torch.no_grad()
def record_dynamic_steps(
    target: FrozenTarget,
    head: torch.nn.Module,
    prompts: Sequence[torch.Tensor],
    shapes: Sequence[tuple[int, int]] | None = None,
    *,
    top_k: int,
    depth: int,
    max_new_tokens: int,
    vocab: torch.Tensor | None = None,
) -> tuple[list[list[DynamicStep | None]], list[tuple[torch.Tensor, int]]]:
    """Greedy decoding of each prompt (1, T), recording the trees of every candidate shape (depth, nodes) at
    each root some candidate's walk reaches (module docstring).

    Each shape walks as the decoder would with its tree: from root i to root i + a + 1, a what it accepts at
    i. Decoding goes from a root straight to the nearest root a walk reaches, accepting the tokens up to it
    (they are on the verified path: a walk moved at this root accepts a subpath of it), so a root no walk
    reaches is neither drafted nor verified.

    `shapes` None: every shape of depth <= `depth` at the default sizes (`dynamic_shapes`). `vocab`: the
    draft vocabulary the head drafts over (`EagleDrafter`'s), None for its own.

    Returns per prompt its steps (one per root, n - 1 for n new tokens; None at a root no walk reaches), and
    each (prompt + continuation (1, T + n), T) for the timings.
    """
    if shapes is None:
        shapes = dynamic_shapes(CalibrationSettings(top_k=top_k, max_depth=depth), top_k)
    everything = top_k + (depth - 1) * top_k**2 + 1  # every candidate, and the root
    recorder = _ValueRecorder(
        EagleDrafter(head, target, top_k=top_k, depth=depth, total_tokens=everything, vocab=vocab)
    )
    largest: dict[int, int] = {}
    for d, n in shapes:
        largest[d] = max(largest.get(d, 1), n)
    verified = _Verified(recorder, largest)
    decoder, eos = SpeculativeDecoder(target, verified), eos_ids(target)
    taken: list[DynamicStep | None] = []
    walks: list[int] = []  # each shape's next root

    def to_next_walk(tree: DraftTree, logits: torch.Tensor, context: DraftContext) -> list[Acceptance]:
        """Verify greedily, record the step, move the walks at this root on; accept up to the nearest."""
        accepted = verify_greedy(tree, logits)[0]
        step = DynamicStep(*recorder.last, path=verified.ids[accepted.path.cpu()])
        root = len(taken)
        for shape, a in enumerate(accepted_lengths(step, shapes)):
            if walks[shape] == root:
                walks[shape] = root + a + 1
        m = min(min(walks) - root, max_new_tokens - (root + 1))  # root + 1 tokens are out already
        ends = [j for j, token in enumerate(accepted.tokens[:m].tolist()) if token in eos]
        m = ends[0] + 1 if ends else m
        taken.extend([step] + [None] * (m - 1))
        return [Acceptance(path=accepted.path[:m], tokens=accepted.tokens[:m])]

    steps, sequences = [], []
    for prompt_ids in prompts:
        ids, cache, taken, walks = prompt_ids.to(target.device), new_cache(), [], [0] * len(shapes)
        context = decoder.first_context(ids, decoder.prefill(ids, cache))
        while len(taken) + 1 < max_new_tokens and int(context.tokens[0, -1]) not in eos:
            _, context = decoder.step(context, cache, verify=to_next_walk)
        steps.append(taken)
        sequences.append((context.tokens, ids.shape[1]))
    return steps, sequences


def kept_nodes(step: DynamicStep, depth: int, nodes: int) -> torch.Tensor:
    """(N,) bool: the root and the nodes - 1 most valuable nodes at depths 1..`depth`, as `rerank` keeps them."""
    eligible = ((step.depths >= 1) & (step.depths <= depth)).nonzero().squeeze(1)  # in creation order
    best = eligible[torch.sort(-step.values[eligible], stable=True).indices[: nodes - 1]]
    kept = torch.zeros(step.values.numel(), dtype=torch.bool)
    kept[best] = True
    kept[0] = True
    return kept


def accepted_lengths(step: DynamicStep, shapes: Sequence[tuple[int, int]]) -> list[int]:
    """Per (depth, nodes): the candidates its tree accepts at this root, i.e. how far the accepted path stays
    in `kept_nodes(step, depth, nodes)`: a node is kept while its rank by value among the nodes no deeper
    than `depth` is below nodes - 1 (one ranking per depth, shared by its sizes)."""
    path, count = step.path[1:], step.values.numel()
    ranks = {}
    for depth in sorted({d for d, _ in shapes}):
        eligible = ((step.depths >= 1) & (step.depths <= depth)).nonzero().squeeze(1)
        order = eligible[torch.sort(-step.values[eligible], stable=True).indices]
        rank = torch.full((count,), count, dtype=torch.long)  # deeper nodes: never kept
        rank[order] = torch.arange(order.numel())
        ranks[depth] = rank[path].tolist()
    return [next((i for i, r in enumerate(ranks[d]) if r >= n - 1), len(ranks[d])) for d, n in shapes]


def dynamic_accept_lengths(
    steps: Sequence[Sequence[DynamicStep | None]], shapes: Sequence[tuple[int, int]]
) -> list[float]:
    """τ of greedy decoding with the EAGLE-2 tree of each (depth, nodes) shape (nodes: root included),
    replayed on each prompt's steps (`record_dynamic_steps`)."""
    lengths: dict[tuple[int, int], list[int]] = {}  # (prompt, root) -> accepted per shape

    def at(s: int, i: int) -> list[int]:
        if (s, i) not in lengths:
            lengths[s, i] = accepted_lengths(steps[s][i], shapes)
        return lengths[s, i]

    roots = [len(taken) for taken in steps]
    return [replay(roots, lambda s, i, k=k: at(s, i)[k]) for k in range(len(shapes))]


def dynamic_accept_length(steps: Sequence[Sequence[DynamicStep | None]], depth: int, nodes: int) -> float:
    """τ of greedy decoding with the EAGLE-2 tree of `depth` levels and `nodes` nodes (root included),
    replayed on each prompt's steps (`record_dynamic_steps`)."""
    return dynamic_accept_lengths(steps, [(depth, nodes)])[0]


def dynamic_candidates(
    head: torch.nn.Module,
    target: FrozenTarget,
    steps: Sequence[Sequence[DynamicStep | None]],
    shapes: Sequence[tuple[int, int]],
    top_k: int,
    vocab: torch.Tensor | None = None,
) -> list[Candidate]:
    """One candidate per (depth, nodes) shape, τ replayed on `steps`; drafting over `vocab` when given."""
    candidates = []
    for (depth, n), tau in zip(shapes, dynamic_accept_lengths(steps, shapes)):
        name = f"auto-dynamic-{n}-d{depth}"
        drafter, record = dynamic_drafter(
            head, target, top_k=top_k, depth=depth, total_tokens=n, name=name, vocab=vocab
        )
        candidates.append(Candidate(record, tau, drafter))
    return candidates


def calibrate_eagle(
    head, target: FrozenTarget, ids, settings: CalibrationSettings, vocab: torch.Tensor | None = None
) -> tuple:
    """EAGLE's (and EAGLE-3's) `Method.calibrate`: the full top-k tree recorded along greedy decoding at the
    roots the candidates reach, and the EAGLE-2 dynamic trees of each shape cut from it; drafting over `vocab`
    (`--draft-vocab`) when given. Returns as `calibrate_medusa`."""
    size = head.draft_vocab_size if vocab is None else vocab.numel()
    top_k, depth = min(settings.top_k, size), settings.max_depth
    shapes = dynamic_shapes(settings, top_k)
    if not shapes:
        raise ValueError(f"the calibration tried no tree: no size in {settings.sizes} fits an EAGLE-2 tree")
    steps, sequences = record_dynamic_steps(
        target,
        head,
        ids,
        shapes,
        top_k=top_k,
        depth=depth,
        max_new_tokens=settings.max_new_tokens,
        vocab=vocab,
    )
    candidates = dynamic_candidates(head, target, steps, shapes, top_k, vocab)
    acceptance = {
        "roots": sum(len(s) for s in steps),
        "verified_roots": sum(step is not None for s in steps for step in s),
        "full_tree_nodes": top_k + (depth - 1) * top_k**2 + 1,
        "definition": "the full tree (every candidate of depth max_depth) is drafted and, cut to the nodes "
        "some candidate keeps, verified at the verified_roots of the roots that some candidate's walk reaches",
    }
    return candidates, acceptance, tuple(head.capture_layers), sequences
