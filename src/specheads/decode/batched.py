"""Batched speculative decoding: B prompts at once, greedy or sampled (the verification of decoder.py, per
row), Medusa or EAGLE draft trees.

Every row runs the one step (`speculative_step`, step.py) in lockstep, on one shared KV cache:

    tree   = drafter.propose(context)                       # (B, N): one tree per row, the same N
    inputs = batched_tree_inputs(tree, layout, S)           # mask (B, 1, N, S + N), positions per row
    out    = target(tree, cache)                            # logits (B, N, V); cache now S + N long
    acc    = verify_greedy(tree, out.logits)                # per row: path root..a*_b, n_b nodes + bonus
    compact_rows(cache, S, paths, n, layout.length)         # row b's path to [length_b, length_b + n_b)
    layout.length += n                                      # cache now max_b length_b long

Cache layout (the verbs are in batched_inputs.py). One DynamicCache for the B live rows, keys and
values (B, H_kv, S, D) per layer with S = max_b length_b. Prompts are left-padded; row b's real tokens
fill slots [pad_b, length_b) and slot j holds position j - pad_b, so positions count real tokens only
(as HF `generate` does with left padding). For example B = 3, S = 9 after some steps (p: padding,
x: a real token, .: stale):

    row 0   p p x x x x x x .      pad 2, length 8
    row 1   x x x x x x x x x      pad 0, length 9
    row 2   p p p p x x x . .      pad 4, length 7

A step appends every row's N tree nodes at slots [S, S + N): attention_mask (B, 1, N, S + N) additive
(row b's query sees its slots [pad_b, length_b) and its node's ancestors), position_ids (B, N) =
length_b - pad_b + depth. Rows accept different numbers of tokens: row b's n_b path nodes are copied
to [length_b, length_b + n_b), over its stale slots or into the tree's, and the cache is cropped to
max_b (length_b + n_b). Stale slots are masked in every later mask and overwritten when the row accepts
more, so they never pile up (row b has S - length_b of them). A row that reaches EOS or max_new_tokens
leaves the batch (its cache rows are dropped, the cache cropped to the longest live row), so the others
go on at B - 1.

Each row's output equals the row decoded alone and the target's own `generate(do_sample=False)`, in
fp32, token for token (tests/decode/test_batched.py): greedy verification is exact per row, and every
row's forward sees exactly its own tokens at its own positions.

Drafters see a `BatchDraftContext` and keep their own state per row (`BatchedDrafter`): Medusa heads
wrap the batch-1 `MedusaDrafter`; an `EagleDrafter` drafts for B rows itself (static or per-row EAGLE-2
dynamic trees), from a cache of its own. `as_batched` turns a batch-1 drafter into its batched form.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.batched_inputs import pad_rows, prefill_inputs, select_cache_rows
from specheads.decode.decoder import DecodeOutput
from specheads.decode.drafters import BatchDraftContext
from specheads.decode.kv_cache import new_cache
from specheads.decode.sampling import SamplingParams
from specheads.decode.step import (
    PHASES,
    PhaseClock,
    SamplingOptions,
    TreeDecoder,
    extend,
    first_tokens,
    speculative_step,
    stop_ids,
    with_decoding_attention,
)
from specheads.decode.trees import DraftTree
from specheads.decode.verify import Acceptance, TypicalAcceptance


class BatchedDrafter(Protocol):
    """Proposes one draft tree per live row; keeps whatever per-row state it has in step with the rows."""

    capture_layers: tuple[int, ...]

    def propose(self, context: BatchDraftContext) -> DraftTree:
        """(B, N) trees, tokens[:, 0] = context.roots; every row has the same N."""
        ...

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only live rows `rows` (indices into the current rows, in order): the others finished."""
        ...


def as_batched(drafter) -> BatchedDrafter:
    """The batched form of a drafter: its own `batched()` (a MedusaDrafter wrapped, an EagleDrafter afresh
    with a cache of its own), or the drafter itself when it already drafts for rows."""
    if hasattr(drafter, "batched"):
        return drafter.batched()
    if hasattr(drafter, "propose") and hasattr(drafter, "select_rows"):
        return drafter
    raise TypeError(
        f"no batched form of {type(drafter).__name__}: expected a drafter with batched(), or one with "
        f"propose(BatchDraftContext) and select_rows(rows)"
    )


@dataclass
class BatchedDecodeOutput:
    """One batched `generate` call.

    rows: one DecodeOutput per prompt, in the order given: tokens (1, n_b), the new tokens ending at
        EOS or max_new_tokens, and the row's accept lengths (n_b == 1 + their sum); no timings.
    steps: batched speculative steps (target forwards after prefill).
    timings: seconds per phase (PHASES) plus "total", for the whole batch.
    """

    rows: list[DecodeOutput]
    steps: int
    timings: dict[str, float]

    @property
    def new_tokens(self) -> int:
        return sum(r.tokens.shape[1] for r in self.rows)

    @property
    def mean_accept_length(self) -> float:
        """τ over every row's steps, bonus included (1.0 = autoregressive)."""
        lengths = [n for r in self.rows for n in r.accept_lengths]
        return sum(lengths) / len(lengths) if lengths else 1.0


class BatchedSpeculativeDecoder(TreeDecoder):
    """Tree-attention speculative decoding of B left-padded prompts at once, greedy or sampled."""

    def __init__(self, target: FrozenTarget, drafter):
        """
        Args:
            target: the frozen target, loaded with sdpa or eager attention.
            drafter: a `BatchedDrafter`, or a batch-1 MedusaDrafter / EagleDrafter (see `as_batched`).
        """
        super().__init__(target, as_batched(drafter))

    @with_decoding_attention  # on CUDA, SDPA without cuDNN's per-shape plans (step.py)
    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_new_tokens: int = 128,
        eos_token_id: int | Sequence[int] | None = None,
        profile: bool = False,
        **sampling,
    ) -> BatchedDecodeOutput:
        """Speculative decoding of B prompts, greedy or sampled.

        Args:
            input_ids: (B, T) token ids, left-padded (`left_pad`).
            attention_mask: (B, T) 1 on tokens, 0 on the left padding; None when nothing is padded.
            max_new_tokens: each row stops after this many new tokens.
            eos_token_id: id(s) that end a row (kept, as `generate` keeps them); None takes the target's
                generation config, [] never stops early.
            profile: synchronise the accelerator around each timed phase.
            **sampling: `SamplingOptions`' keywords, as `SpeculativeDecoder.generate` takes them; every row
                draws from the one generator, rows in order at each draw (the first tokens, then each
                step's verification).
        """
        if input_ids.ndim != 2 or input_ids.shape[0] == 0:
            raise ValueError(f"generate takes prompts (B, T), got shape {tuple(input_ids.shape)}")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}"
            )
        eos = stop_ids(self.target, eos_token_id)
        settings = SamplingOptions.from_keywords(sampling).context_fields()
        clock = PhaseClock(sync=profile and self.target.device.type == "cuda")
        begin = time.perf_counter()
        device = self.target.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        new: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
        accept_lengths: list[list[int]] = [[] for _ in new]
        steps = 0
        if max_new_tokens > 0:
            cache = new_cache()
            with clock("prefill"):
                context = self.prefill(input_ids, attention_mask, cache, **settings)
            done = [extend(new[b], [int(t)], eos, max_new_tokens) for b, t in enumerate(context.roots)]
            context = self._drop_finished(context, done, cache)
            while context is not None:
                acceptances, context = self.step(context, cache, clock)
                steps += 1
                done = []
                for row, acceptance in zip(context.rows.tolist(), acceptances):
                    before = len(new[row])
                    done.append(extend(new[row], acceptance.tokens.tolist(), eos, max_new_tokens))
                    accept_lengths[row].append(len(new[row]) - before)
                with clock("compact"):
                    context = self._drop_finished(context, done, cache)
        timings = {phase: clock.totals.get(phase, 0.0) for phase in PHASES}
        timings["total"] = time.perf_counter() - begin
        rows = [
            DecodeOutput(
                tokens=torch.tensor([tokens], dtype=torch.long, device=device), accept_lengths=lengths
            )
            for tokens, lengths in zip(new, accept_lengths)
        ]
        return BatchedDecodeOutput(rows=rows, steps=steps, timings=timings)

    def prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        acceptance: str | TypicalAcceptance = "exact",
    ) -> BatchDraftContext:
        """Run the target over the left-padded prompts (B, T), filling `cache`; the first context (the
        sampling arguments are those `SamplingOptions.context_fields` returns; none: greedy)."""
        layout, mask, positions = prefill_inputs(attention_mask, self.mask_dtype, self.window)
        out = self.target(
            input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            capture=self.drafter.capture_layers,
        )
        # (B,) every row's last column is real (left padding)
        roots = first_tokens(out.logits[:, -1], sampling, generator)
        b = input_ids.shape[0]
        return BatchDraftContext(
            rows=torch.arange(b, device=input_ids.device),
            roots=roots,
            layout=layout,
            hidden=self.features(out.hidden, None),
            next_tokens=torch.cat([input_ids[:, 1:], roots[:, None]], dim=1),  # (B, T)
            start=torch.zeros(b, dtype=torch.long, device=input_ids.device),
            step=0,
            sampling=sampling,
            generator=generator,
            acceptance=acceptance,
        )

    def step(
        self, context: BatchDraftContext, cache, clock: PhaseClock | None = None
    ) -> tuple[list[Acceptance], BatchDraftContext]:
        """One speculative step for every live row: propose → tree inputs → verify → accept → compact.

        Returns one Acceptance per live row and the next context (each row's bonus token its next root).
        """
        clock = clock or PhaseClock(sync=False)
        done = speculative_step(self, context, cache, context.layout, clock)
        with clock("compact"):
            next_tokens, _ = pad_rows([a.tokens for a in done.acceptances])  # (B, M): x after each path node
            roots = next_tokens.gather(1, (done.counts - 1)[:, None])[:, 0]  # the bonus tokens
            context = replace(
                context,
                roots=roots,
                layout=done.layout,
                hidden=done.hidden,
                next_tokens=next_tokens,
                start=context.layout.length,
                step=context.step + 1,
            )
        return done.acceptances, context

    def _drop_finished(self, context: BatchDraftContext, done: list[bool], cache) -> BatchDraftContext | None:
        """Drop the rows that finished from the cache, the drafter and the context; None when none is left."""
        if not any(done):
            return context
        if all(done):
            return None
        live = torch.tensor([not d for d in done], device=context.rows.device).nonzero().flatten()
        layout = context.layout.select(live)
        select_cache_rows(cache, live, layout.total)
        self.drafter.select_rows(live)
        return context.select(live, layout)
