"""Calibrated trees for `specheads eval --tree auto`: the tree size that decodes fastest on this machine.

A tree is worth what it buys per second on the machine that runs it:

    tokens/s(tree) = τ(tree) / (step(N) + draft(tree))

    τ(tree)    expected tokens per step, bonus included, on calibration prompts kept out of the evaluation.
    step(N)    one target step over a tree of N nodes (root included) on a cache of realistic length: tree
               inputs + tree forward + greedy verification + compaction. Flat in N while the forward is
               bound by reading the weights (a GPU at batch 1, up to some N), then growing.
    draft(.)   one `propose` of the drafter that makes the tree.

`--tree auto` measures the three for candidate trees of several sizes and keeps the best.

τ is replayed exactly: greedy decoding is deterministic, so what a tree accepts with its root at each
generated token of a calibration prompt is a fixed number, measured below; the decoder's walk over a prompt
(root at the first generated token, accept a, next root a + 1 tokens on) gives the τ that decoding the
calibration prompts with that tree would give. (Averaging over every root instead is biased wherever the
text is periodic, as a small model's greedy continuations often are: the walk lands on some phases only.)

Medusa (static trees). Each calibration prompt's greedy continuation goes through the target once; with
the root at generated token t+1, rank_k(t) is the rank of the true token t+2+k among head k's top R
guesses (R when it is not among them). A tree accepts the longest of its paths that is a prefix of
(rank_0(t), rank_1(t), ...). The candidate trees come from `build_tree(acc, N - 1)` (each a prefix of the
next), with the per-head, per-rank acceptance

    acc[k][r] = P(rank_k = r | rank_j < R for every j < k)

the chance that head k's rank-r guess is right given that the path above it can be accepted, which is what
`build_tree` multiplies along a path.

EAGLE-2 (dynamic trees). The tree of depth D and N nodes keeps the N - 1 most valuable candidates grown to
depth D, and growing does not depend on N, nor a level on the levels below it. So the calibration decodes
each prompt one token at a time and, at every root, verifies the tree of *every* candidate at the largest
depth (top_k + (D - 1)·top_k² nodes): the accepted path and each node's value then give what any smaller
(D', N) accepts there: keep the N - 1 most valuable nodes no deeper than D' (as `dynamic_tree.rerank` does)
and count how far the accepted path stays inside them. A node's value is its cumulative draft
log-probability; the drafter hands out q at every expanded node when asked to sample, so the calibration
asks at temperature 1, where log q is the draft's log-probability, and sums it along each path.

Timings interleave the candidates (round robin over the repeats), so a change in the machine's speed while
they run touches every candidate alike, and each keeps the fastest of its repeats after an untimed one: other
processes only ever slow a run down, so the fastest is the least disturbed (`timeit`'s advice; on a shared
machine the median of a few runs drifts by tens of percent between candidates of equal cost).
Candidates of one depth share the fastest draft among them: a draft costs what its depth costs, not what
it keeps (`timed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from specheads.decode.decoder import SpeculativeDecoder, eos_ids
from specheads.decode.drafters import DraftContext, Drafter
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.decode.kv_cache import new_cache
from specheads.decode.trees import DraftTree, StaticTree, build_tree, expected_accept_length
from specheads.decode.verify import Acceptance, verify_greedy
from specheads.evaluate.baseline import generate_rows
from specheads.evaluate.eval_drafters import (
    EAGLE_DEPTH,
    EAGLE_TOP_K,
    drafter_for,
    dynamic_drafter,
    medusa_drafter,
)
from specheads.evaluate.progress import Progress
from specheads.evaluate.step_timing import Timer, measured_timer
from specheads.heads.methods import method_named
from specheads.heads.target import FrozenTarget

# -- calibration: settings, candidates, the choice ------------------------------------------------------

MEDUSA_RANKS = 10  # guesses per head a calibrated Medusa tree may read (Medusa's own trees read 10)
CALIBRATION_PROMPTS = 4  # prompts held out for calibration unless told otherwise


@dataclass
class CalibrationSettings:
    """How `--tree auto` calibrates; recorded in results.json.

    max_new_tokens: greedy tokens decoded per calibration prompt.
    sizes: tree sizes N tried (nodes, root included).
    repeats: timed runs per measurement, after one untimed; the fastest is kept.
    medusa_ranks: Medusa: guesses per head a tree may read.
    top_k, max_depth: EAGLE-2: children per expanded node (fixed), and the deepest tree tried (every depth
        from 1 up to it is tried).
    """

    max_new_tokens: int = 128
    sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    repeats: int = 10
    medusa_ranks: int = MEDUSA_RANKS
    top_k: int = EAGLE_TOP_K
    max_depth: int = EAGLE_DEPTH


@dataclass
class Candidate:
    """One tree the calibration tried.

    tree: as results.json records a tree ("name", "nodes", "depth", and "choices" or "top_k").
    accept_length: expected τ; step_seconds: the target's step over its nodes; draft_seconds: its drafter's
        propose. extra: further figures for results.json.
    """

    tree: dict[str, Any]
    accept_length: float
    drafter: Drafter | None = field(default=None, repr=False)
    step_seconds: float = 0.0
    draft_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        """Expected tokens per second: τ / (step + draft)."""
        seconds = self.step_seconds + self.draft_seconds
        return self.accept_length / seconds if seconds > 0 else float("inf")

    def row(self) -> dict[str, Any]:
        """results.json's row: the tree's name, nodes and depth, then the figures."""
        return {
            **{key: self.tree[key] for key in ("name", "nodes", "depth")},
            "accept_length": self.accept_length,
            "step_seconds": self.step_seconds,
            "draft_seconds": self.draft_seconds,
            "tokens_per_second": self.tokens_per_second,
            **self.extra,
        }


def choose(candidates: Sequence[Candidate]) -> Candidate:
    """The candidate with the most expected tokens per second; ties go to the smaller, then shallower tree."""
    if not candidates:
        raise ValueError("the calibration tried no tree: every size in `sizes` is too large or below 1")
    return max(candidates, key=lambda c: (c.tokens_per_second, -c.tree["nodes"], -c.tree["depth"]))


def timed(candidates: list[Candidate], timer: Timer) -> list[Candidate]:
    """The candidates with their step and draft seconds, measured together by `timer`.

    A draft costs what its depth costs, not what it keeps (EAGLE-2 expands top_k nodes a level whatever N;
    Medusa runs every head), so candidates of one depth share the fastest draft measured among them.
    """
    steps, drafts = timer.measure([c.tree["nodes"] for c in candidates], [c.drafter for c in candidates])
    fastest: dict[int, float] = {}
    for candidate, draft in zip(candidates, drafts):
        depth = candidate.tree["depth"]
        fastest[depth] = min(fastest.get(depth, draft), draft)
    for candidate, step in zip(candidates, steps):
        candidate.step_seconds, candidate.draft_seconds = step, fastest[candidate.tree["depth"]]
    return candidates


def hold_out(prompts: list, count: int | None = None) -> tuple[list, list]:
    """(calibration prompts, evaluation prompts): the last `count` prompts (CALIBRATION_PROMPTS when None)
    are kept for calibration."""
    count = CALIBRATION_PROMPTS if count is None else count
    if not 1 <= count < len(prompts):
        raise ValueError(
            f"--calibration-prompts {count} keeps the last {count} prompts out of the evaluation, but --prompts "
            f"gives {len(prompts)}: at least one must be calibrated and one evaluated"
        )
    return prompts[-count:], prompts[:-count]


def holds_out(prompts: int, count: int | None, wanted: int | None) -> bool:
    """Whether `hold_out` of `count` prompts (CALIBRATION_PROMPTS when None) out of `prompts` leaves `wanted`
    (--num-prompts; None: one) to evaluate: a default `--tree auto` needs it, or the fixed default stands."""
    return prompts - (CALIBRATION_PROMPTS if count is None else count) >= (wanted or 1)


def replay(roots: Sequence[int], accepted: Callable[[int, int], int]) -> float:
    """τ of greedy decoding replayed on sequences of roots[s] roots, accepted(s, i) candidates accepted with
    the root at generated token i of sequence s (i = 0 .. n - 2 of its n new tokens). Its first step roots at
    i = 0 and emits min(a + 1, the tokens left), the next roots at i + a + 1 (module docstring)."""
    total = steps = 0
    for s, n in enumerate(roots):
        i = 0
        while i < n:
            a = accepted(s, i)
            total += min(a + 1, n - i)
            steps, i = steps + 1, i + a + 1
    if steps == 0:
        raise ValueError(
            "calibration: no calibration prompt was continued past its first token; no step to replay"
        )
    return total / steps


def decode_accept_length(accepted: Sequence[Sequence[int]]) -> float:
    """`replay` of accepted[s][i]: the candidates accepted with the root at generated token i of sequence s."""
    return replay([len(sequence) for sequence in accepted], lambda s, i: accepted[s][i])


# -- Medusa: per-head, per-rank acceptance ----------------------------------------------------------------


@torch.no_grad()
def greedy_sequence(target: FrozenTarget, prompt_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
    """(1, T + n): the prompt and the target's own greedy continuation (`generate`; it stops at EOS)."""
    ids = prompt_ids.to(target.device)
    new = generate_rows(target, ids, max_new_tokens)[0]
    return torch.cat([ids, torch.tensor([new], dtype=ids.dtype, device=ids.device)], 1)


@torch.no_grad()
def medusa_ranks(
    target: FrozenTarget,
    heads: torch.nn.Module,
    sequences: Sequence[tuple[torch.Tensor, int]],
    num_ranks: int,
) -> list[torch.Tensor]:
    """Per sequence, (n - 1, K) ranks of the true tokens among each head's top `num_ranks` guesses.

    Args:
        sequences: (ids (1, T + n), prompt length T): a prompt and its n greedy new tokens.

    Row i has the root at generated token i (position T + i): the heads read position t = T - 1 + i and head
    k guesses token t + 2 + k. Its rank there, `num_ranks` when it is not among the guesses, -1 past the end.
    """
    num_heads = heads.num_heads
    lm_head = target.lm_head if heads.config.share_lm_head else None
    weight = next(heads.parameters())
    tables = []
    for ids, prompt_len in sequences:
        ids = ids.to(target.device)
        t = torch.arange(prompt_len - 1, ids.shape[1] - 2, device=ids.device)  # (n - 1,)
        ranks = torch.full((t.numel(), num_heads), -1, dtype=torch.long)
        hidden = target(ids, capture=(-1,), logits=False).hidden[target.layer_id(-1)][0, t]  # (n - 1, H)
        for k in range(num_heads):
            there = t + 2 + k < ids.shape[1]  # the true token is in the sequence
            if there.any():
                logits = heads.head(k, hidden[there].to(weight.device, weight.dtype), lm_head)
                hit = logits.topk(num_ranks, dim=-1).indices == ids[0, t[there] + 2 + k, None].to(
                    weight.device
                )
                ranks[there.cpu(), k] = torch.where(hit.any(-1), hit.float().argmax(-1), num_ranks).cpu()
        tables.append(ranks)
    return tables


def rank_accuracies(ranks: torch.Tensor, num_ranks: int) -> torch.Tensor:
    """(P, K) ranks -> (K, R) acc[k][r] = P(rank_k = r | rank_j < R for every j < k) (module docstring).

    Rows that run past their sequence's end (a -1) are left out.
    """
    ranks = ranks[(ranks >= 0).all(-1)]
    acc = torch.zeros(ranks.shape[1], num_ranks, dtype=torch.float64)
    reached = torch.ones(ranks.shape[0], dtype=torch.bool)  # positions whose path so far can be accepted
    for k in range(ranks.shape[1]):
        n = int(reached.sum())
        if n:
            acc[k] = torch.bincount(ranks[reached, k], minlength=num_ranks + 1)[:num_ranks].double() / n
        reached &= ranks[:, k] < num_ranks
    return acc


def static_accept_length(choices: Sequence[Sequence[int]], ranks: Sequence[torch.Tensor]) -> float:
    """τ of greedy decoding with a static tree, replayed on each sequence's ranks (`medusa_ranks`)."""
    paths = {tuple(p) for p in choices}

    def accepted(row: list[int]) -> int:  # the deepest path of the tree that is a prefix of the row
        depth = 0
        while depth < len(row) and tuple(row[: depth + 1]) in paths:
            depth += 1
        return depth

    return decode_accept_length([[accepted(row) for row in table.tolist()] for table in ranks])


def medusa_candidates(
    heads: torch.nn.Module,
    target: FrozenTarget,
    ranks: Sequence[torch.Tensor],
    num_ranks: int,
    sizes: Sequence[int],
) -> list[Candidate]:
    """One candidate per size N: `build_tree`'s N - 1 best paths, τ replayed on `ranks` (`medusa_ranks`)."""
    acc = rank_accuracies(torch.cat(list(ranks)), num_ranks)
    available = sum(num_ranks**d for d in range(1, heads.num_heads + 1))
    sizes = [n for n in sizes if 1 <= n <= available + 1]
    order = build_tree(acc, max(sizes, default=1) - 1)  # every prefix is build_tree's tree of its size
    candidates = []
    for n in sizes:
        tree = StaticTree.from_choices(order[: n - 1], num_heads=heads.num_heads)
        drafter, record = medusa_drafter(heads, target, tree, f"auto-medusa-{n - 1}")
        independent = expected_accept_length(tree.choices, acc)  # build_tree's own estimate
        tau = static_accept_length(tree.choices, ranks)
        candidates.append(
            Candidate(record, tau, drafter, extra={"independent_heads_accept_length": independent})
        )
    return candidates


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
    shapes: Sequence[tuple[int, int]],
    *,
    top_k: int,
    depth: int,
    max_new_tokens: int,
) -> tuple[list[list[DynamicStep | None]], list[tuple[torch.Tensor, int]]]:
    """Greedy decoding of each prompt (1, T), recording the trees of every candidate shape (depth, nodes) at
    each root some candidate's walk reaches (module docstring).

    Each shape walks as the decoder would with its tree: from root i to root i + a + 1, a what it accepts at
    i. Decoding goes from a root straight to the nearest root a walk reaches, accepting the tokens up to it
    (they are on the verified path: a walk moved at this root accepts a subpath of it), so a root no walk
    reaches is neither drafted nor verified.

    Returns per prompt its steps (one per root, n - 1 for n new tokens; None at a root no walk reaches), and
    each (prompt + continuation (1, T + n), T) for the timings.
    """
    everything = top_k + (depth - 1) * top_k**2 + 1  # every candidate, and the root
    recorder = _ValueRecorder(EagleDrafter(head, target, top_k=top_k, depth=depth, total_tokens=everything))
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
) -> list[Candidate]:
    """One candidate per (depth, nodes) shape, τ replayed on `steps`."""
    candidates = []
    for (depth, n), tau in zip(shapes, dynamic_accept_lengths(steps, shapes)):
        name = f"auto-dynamic-{n}-d{depth}"
        drafter, record = dynamic_drafter(head, target, top_k=top_k, depth=depth, total_tokens=n, name=name)
        candidates.append(Candidate(record, tau, drafter))
    return candidates


def calibrate_medusa(heads, target: FrozenTarget, ids, settings: CalibrationSettings) -> tuple:
    """Medusa's `Method.calibrate`: per-head rank accuracies along greedy continuations, and a static tree
    of each size built from them. Returns (candidates, acceptance record, capture layers, sequences)."""
    num_ranks = min(settings.medusa_ranks, heads.config.vocab_size)
    sequences = [(greedy_sequence(target, p, settings.max_new_tokens), p.shape[1]) for p in ids]
    ranks = medusa_ranks(target, heads, sequences, num_ranks)
    candidates = medusa_candidates(heads, target, ranks, num_ranks, settings.sizes)
    acceptance = {
        "roots": sum(len(r) for r in ranks),
        "per_head_rank": rank_accuracies(torch.cat(ranks), num_ranks).tolist(),
        "definition": "per_head_rank[k][r] = P(head k's rank-r guess is the target's greedy token | the "
        f"true tokens of heads 0..k-1 are among their top {num_ranks})",
    }
    return candidates, acceptance, (-1,), sequences


def calibrate_eagle(head, target: FrozenTarget, ids, settings: CalibrationSettings) -> tuple:
    """EAGLE's (and EAGLE-3's) `Method.calibrate`: the full top-k tree recorded along greedy decoding at the
    roots the candidates reach, and the EAGLE-2 dynamic trees of each shape cut from it. Returns as
    `calibrate_medusa`."""
    top_k, depth = min(settings.top_k, head.draft_vocab_size), settings.max_depth
    shapes = dynamic_shapes(settings, top_k)
    if not shapes:
        raise ValueError(f"the calibration tried no tree: no size in {settings.sizes} fits an EAGLE-2 tree")
    steps, sequences = record_dynamic_steps(
        target, head, ids, shapes, top_k=top_k, depth=depth, max_new_tokens=settings.max_new_tokens
    )
    candidates = dynamic_candidates(head, target, steps, shapes, top_k)
    acceptance = {
        "roots": sum(len(s) for s in steps),
        "verified_roots": sum(step is not None for s in steps for step in s),
        "full_tree_nodes": top_k + (depth - 1) * top_k**2 + 1,
        "definition": "the full tree (every candidate of depth max_depth) is drafted and, cut to the nodes "
        "some candidate keeps, verified at the verified_roots of the roots that some candidate's walk reaches",
    }
    return candidates, acceptance, tuple(head.capture_layers), sequences


# -- `--tree auto` -------------------------------------------------------------------------------------


def max_tree_depth(heads: torch.nn.Module, config: dict[str, Any], settings: CalibrationSettings) -> int:
    """The deepest tree the calibration may try or choose (for the prompt-length check)."""
    return method_named(config.get("method")).max_tree_depth(heads, settings)


def calibrated_drafter(
    heads: torch.nn.Module,
    config: dict[str, Any],
    target: FrozenTarget,
    prompts: Sequence[Any],
    settings: CalibrationSettings,
    timer: Timer | None = None,
) -> tuple[Drafter, dict[str, Any], dict[str, Any]]:
    """`--tree auto`: measure candidate trees on the calibration prompts, keep the fastest.

    Args:
        config: the checkpoint's config.json; its method's `calibrate` (the method table) measures.
        prompts: the calibration prompts (`hold_out`), each with an `id` and `input_ids` (1, T).
        timer: the timings; None measures them here (`step_timing.MeasuredTimer`).

    Returns:
        The chosen tree's drafter, its record (as `drafter_for` returns), and results.json's "calibration":
        the prompts, settings, acceptance, every candidate's row (nodes, depth, τ, step and draft seconds,
        tokens/s) and the chosen tree.
    """
    begin = time.perf_counter()
    method = method_named(config.get("method"))
    if method.calibrate is None:
        raise ValueError(f"--tree auto has no calibration for heads of method {method.name!r}")
    ids = [p.input_ids for p in prompts]
    candidates, acceptance, capture_layers, sequences = method.calibrate(heads, target, ids, settings)
    timer = timer or measured_timer(target, capture_layers, sequences, settings.repeats)
    best = choose(timed(candidates, timer))
    record = {
        "prompts": {
            "which": f"the last {len(prompts)} of --prompts, held out of the evaluation",
            "ids": [p.id for p in prompts],
        },
        "settings": {**asdict(settings), "sizes": list(settings.sizes)},
        "timing": {
            "what": "fastest seconds of one target step (tree inputs, forward, greedy verify, compact) and of "
            "one draft, interleaved over the candidates, after an untimed round",
            "cache_length": getattr(timer, "start", None),
        },
        "acceptance": acceptance,
        "candidates": [c.row() for c in candidates],
        "chosen": best.tree,
        "seconds": time.perf_counter() - begin,
    }
    return best.drafter, best.tree, record


def calibrated_once(
    progress: Progress,
    key: str,
    heads: torch.nn.Module,
    config: dict[str, Any],
    target: FrozenTarget,
    prompts: Sequence[Any],
    settings: CalibrationSettings,
) -> tuple[Drafter, dict[str, Any], dict[str, Any]]:
    """`calibrated_drafter`, once per run: the calibration is kept in the run's progress file under `key`,
    and a resumed run rebuilds the tree chosen there instead of calibrating again (timings vary, so a
    second calibration may choose another tree, and the records already done were decoded with the first).
    Returns as `calibrated_drafter`."""
    calibration = progress.kept.get(key)
    if calibration is None:
        drafter, tree, calibration = calibrated_drafter(heads, config, target, prompts, settings)
        progress.keep(key, calibration)
        return drafter, tree, progress.kept[key]  # as it reads back on resume (tuples become lists)
    drafter, tree = drafter_for(heads, config, target, calibration["chosen"])
    return drafter, tree, calibration


def calibration_note(results: dict[str, Any], where: str = "results.json: calibration") -> str:
    """report.md's line on a calibrated tree: `results` holds its "tree" and "calibration", found at `where`."""
    calibration, tree = results["calibration"], results["tree"]
    best = next(row for row in calibration["candidates"] if row["name"] == tree["name"])
    return (
        f"- tree `{tree['name']}` chosen by `--tree auto` out of {len(calibration['candidates'])} candidates, "
        f"calibrated on {len(calibration['prompts']['ids'])} held-out prompts: expected τ "
        f"{best['accept_length']:.2f}, step {best['step_seconds'] * 1e3:.2f} ms + draft "
        f"{best['draft_seconds'] * 1e3:.2f} ms, {best['tokens_per_second']:.1f} tokens/s "
        f"({where}).\n"
    )
