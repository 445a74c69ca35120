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
each prompt greedily and, at a root, drafts the tree of *every* candidate at the largest depth
(top_k + (D - 1)·top_k² nodes) with its node values (each node's cumulative draft log-probability: the
drafter's own scores, which `dynamic_tree.rerank` orders by); any smaller (D', N) keeps the N - 1 most
valuable nodes no deeper than D', and accepts as far as the accepted path stays inside them. The target
verifies only the nodes some candidate keeps (a node outside them changes no candidate's acceptance, since
greedy acceptance at a node depends on its ancestors alone), and only at the roots that some candidate's
walk reaches: decoding moves from a root straight to the nearest next root of any walk, accepting the
tokens up to it (they lie on the verified path). The τ is the same as verifying the whole tree at every
root (calibrate_dynamic.py).

The timings, and the choice of the fastest, are measured by `specheads eval` and `compare`
(evaluate/calibrate.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.baseline import generate_rows
from specheads.decode.drafter_factory import EAGLE_DEPTH, EAGLE_TOP_K, medusa_drafter
from specheads.decode.drafters import Drafter
from specheads.decode.trees import StaticTree, build_tree, expected_accept_length

# -- calibration: settings, candidates, the choice ------------------------------------------------------

MEDUSA_RANKS = 10  # guesses per head a calibrated Medusa tree may read (Medusa's own trees read 10)


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
    vocab: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Per sequence, (n - 1, K) ranks of the true tokens among each head's top `num_ranks` guesses.

    Args:
        sequences: (ids (1, T + n), prompt length T): a prompt and its n greedy new tokens.
        vocab: the draft vocabulary the heads guess from (`MedusaDrafter`'s), None for the whole one.

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
                if vocab is not None:
                    logits = logits[..., vocab.to(logits.device)]
                guesses = logits.topk(num_ranks, dim=-1).indices
                if vocab is not None:
                    guesses = vocab.to(guesses.device)[guesses]
                hit = guesses == ids[0, t[there] + 2 + k, None].to(weight.device)
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
    vocab: torch.Tensor | None = None,
) -> list[Candidate]:
    """One candidate per size N: `build_tree`'s N - 1 best paths, τ replayed on `ranks` (`medusa_ranks`);
    drafting over `vocab` when given."""
    acc = rank_accuracies(torch.cat(list(ranks)), num_ranks)
    available = sum(num_ranks**d for d in range(1, heads.num_heads + 1))
    sizes = [n for n in sizes if 1 <= n <= available + 1]
    order = build_tree(acc, max(sizes, default=1) - 1)  # every prefix is build_tree's tree of its size
    candidates = []
    for n in sizes:
        tree = StaticTree.from_choices(order[: n - 1], num_heads=heads.num_heads)
        drafter, record = medusa_drafter(heads, target, tree, f"auto-medusa-{n - 1}", vocab)
        independent = expected_accept_length(tree.choices, acc)  # build_tree's own estimate
        tau = static_accept_length(tree.choices, ranks)
        candidates.append(
            Candidate(record, tau, drafter, extra={"independent_heads_accept_length": independent})
        )
    return candidates


def calibrate_medusa(
    heads, target: FrozenTarget, ids, settings: CalibrationSettings, vocab: torch.Tensor | None = None
) -> tuple:
    """Medusa's `Method.calibrate`: per-head rank accuracies along greedy continuations, and a static tree
    of each size built from them; the heads guess from `vocab` (`--draft-vocab`) when given. Returns
    (candidates, acceptance record, capture layers, sequences)."""
    num_ranks = min(settings.medusa_ranks, heads.config.vocab_size if vocab is None else vocab.numel())
    sequences = [(greedy_sequence(target, p, settings.max_new_tokens), p.shape[1]) for p in ids]
    ranks = medusa_ranks(target, heads, sequences, num_ranks, vocab)
    candidates = medusa_candidates(heads, target, ranks, num_ranks, settings.sizes, vocab)
    acceptance = {
        "roots": sum(len(r) for r in ranks),
        "per_head_rank": rank_accuracies(torch.cat(ranks), num_ranks).tolist(),
        "definition": "per_head_rank[k][r] = P(head k's rank-r guess is the target's greedy token | the "
        f"true tokens of heads 0..k-1 are among their top {num_ranks})",
    }
    return candidates, acceptance, (-1,), sequences
