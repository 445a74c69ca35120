"""Step and draft timings on this machine, for `--tree auto` (evaluate/calibrate.py).

A target step (the decoder's own step: tree inputs, the tree forward, greedy verification, compaction) is
timed per tree size on a binary tree of that many nodes, and a drafter's `propose` once per kind of work
(`same_work`: EAGLE-2 drafters of depth 1 draft the same candidates), both on a cache of realistic length,
interleaved over the repeats after an untimed round; each keeps its fastest run. Where the target's weights
are packed per row count (decode/packed_linear.py, fp32 on the CPU), the step sizes are timed one after
another instead, each packed for its own rounds, so the packing's cap on row counts never leaves a larger
size timed unpacked.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.decoder import SpeculativeDecoder
from specheads.decode.drafters import DraftContext, Drafter
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.decode.kv_cache import new_cache
from specheads.decode.step import timed
from specheads.decode.trees import DraftTree


class Timer(Protocol):
    def measure(self, nodes: Sequence[int], drafters: Sequence[Drafter]) -> tuple[list[float], list[float]]:
        """Seconds of one target step over nodes[i] nodes and of one drafters[i].propose, for every i."""
        ...


class MeasuredTimer:
    """Times target steps and drafter proposals on this machine, along one calibration sequence.

    Both run on a cache of `start` positions (realistic: a prompt and half its continuation), interleaved
    over `repeats` rounds after an untimed one; the fastest is kept.
    """

    def __init__(
        self,
        target: FrozenTarget,
        capture_layers: tuple[int, ...],
        sequence: torch.Tensor,
        start: int,
        repeats: int,
    ):
        """
        Args:
            capture_layers: the drafters' (features handed to them, and captured on every tree forward).
            sequence: (1, L) a prompt and its greedy continuation, L >= start + repeats + 2.
        """
        if not 1 <= start <= sequence.shape[1] - repeats - 2:
            raise ValueError(
                f"timing needs a sequence of at least start + repeats + 2 = {start + repeats + 2} tokens with "
                f"start >= 1, got {sequence.shape[1]} tokens and start {start}"
            )
        self.target, self.start, self.repeats = target, start, repeats
        self.sequence = sequence.to(target.device)
        self.decoder = SpeculativeDecoder(target, _Fixed(tuple(capture_layers)))
        with torch.no_grad():
            out = target(self.sequence, capture=capture_layers, logits=False)
        self.hidden = {layer: out.hidden[target.layer_id(layer)] for layer in capture_layers}  # (1, L, H)

    @torch.no_grad()
    def measure(self, nodes: Sequence[int], drafters: Sequence[Drafter]) -> tuple[list[float], list[float]]:
        steps = self.target_steps(sorted(set(nodes)))
        return [steps[n] for n in nodes], self.drafts(drafters)

    def _seconds(self, run: Callable[[], Any]) -> float:
        return timed(run, self.target.device)[1]

    def target_steps(self, sizes: Sequence[int]) -> dict[int, float]:
        """Per size N: one decoder step (tree inputs, forward, greedy verification and compaction) over a
        binary tree of N nodes, proposed as it stands."""
        cache, past = new_cache(), self.start
        context = self.decoder.first_context(
            self.sequence[:, :past], self.decoder.prefill(self.sequence[:, :past], cache)
        )
        trees = {}
        for n in sizes:
            index = torch.arange(n, device=self.sequence.device)
            tokens = self.sequence[:, (past + index) % self.sequence.shape[1]]
            trees[n] = DraftTree(tokens=tokens, parents=((index - 1) // 2)[None])  # node i under (i - 1) // 2

        def step(tree: DraftTree) -> None:
            self.decoder.drafter.tree = tree
            self.decoder.step(context, cache)

        def run(n: int) -> float:
            took = self._seconds(lambda: step(trees[n]))
            if cache.get_seq_length() > past:  # back to `past` for the next run
                cache.crop(-(cache.get_seq_length() - past))
            return took

        seconds: dict[int, list[float]] = {n: [] for n in sizes}
        packed = self.decoder.packed
        if packed is None:  # the sizes interleaved over the rounds: each sees the load of the others
            for _ in range(self.repeats + 1):
                for n in sizes:
                    seconds[n].append(run(n))
        else:
            # weights packed per row count (decode/packed_linear.py): one size at a time, packed for its rounds
            # (the first, untimed, packs) and released after unless a decoder already uses it, so every size
            # is timed as its decoder would run it and the sweep leaves no copies behind
            for n in sizes:
                kept = n in packed.packed
                seconds[n] = [run(n) for _ in range(self.repeats + 1)]
                if not kept:
                    packed.release(n)
        return {n: min(s[1:]) for n, s in seconds.items()}

    def drafts(self, drafters: Sequence[Drafter]) -> list[float]:
        """Per drafter: `propose`, advancing one token a call from `start` cached positions (a call at step 0,
        untimed, fills a stateful drafter's cache). Drafters that do the same work (`same_work`) are timed
        once, by the first of them."""

        def context(i: int) -> DraftContext:  # i = 0: `start` positions new; then one more per call
            cached = self.start + i
            rows = slice(0, cached) if i == 0 else slice(cached - 1, cached)
            features = {layer: h[:, rows] for layer, h in self.hidden.items()}
            return DraftContext(self.sequence[:, : cached + 1], features, step=i)

        timed: dict[Hashable, Drafter] = {}
        for drafter in drafters:
            timed.setdefault(same_work(drafter), drafter)
        for drafter in timed.values():
            drafter.propose(context(0))
        seconds: dict[Hashable, list[float]] = {key: [] for key in timed}
        for i in range(1, self.repeats + 2):
            calls = context(i)
            for key, drafter in timed.items():
                seconds[key].append(
                    self._seconds(lambda drafter=drafter, calls=calls: drafter.propose(calls))
                )
        return [min(seconds[same_work(drafter)][1:]) for drafter in drafters]


def same_work(drafter: Drafter) -> Hashable:
    """What decides the work of a drafter's `propose`: EAGLE-2 drafters of one head, top_k and depth 1 draft
    the same root top-k whatever number they keep; deeper ones stop growing once nothing below can be kept
    (`dynamic_tree`, "stop"), so the number kept matters. Any other drafter is its own."""
    if isinstance(drafter, EagleDrafter) and drafter.tree is None:
        kept = None if drafter.depth == 1 else drafter.total_tokens
        return ("dynamic", id(drafter.head), drafter.top_k, drafter.depth, kept)
    return id(drafter)


class _Fixed:
    """A drafter that proposes the tree it is given (`tree`), whatever the context."""

    def __init__(self, capture_layers: tuple[int, ...]):
        self.capture_layers, self.tree = capture_layers, None

    def propose(self, context: DraftContext) -> DraftTree:
        return self.tree


def measured_timer(
    target: FrozenTarget,
    capture_layers: tuple[int, ...],
    sequences: Sequence[tuple[torch.Tensor, int]],
    repeats: int,
) -> MeasuredTimer:
    """A MeasuredTimer along the longest calibration sequence, its cache halfway through the continuation."""
    sequence, prompt_len = max(sequences, key=lambda s: s[0].shape[1])
    length = sequence.shape[1]
    start = min(prompt_len + (length - prompt_len) // 2, length - repeats - 2)
    return MeasuredTimer(target, capture_layers, sequence, start, repeats)
