"""The speculative decoder of one prompt: prefill, then propose → tree inputs → verify → accept → compact.

One step (`speculative_step`, step.py, with one row), S tokens in the cache and the root (the last
emitted token) outside it:

    tree   = drafter.propose(context)                      # (B, N) tokens + parents, tokens[:, 0] = root
    inputs = tree_inputs(tree, S)                          # mask (B, 1, N, S + N), positions S + depth
    out    = target(tree, cache)                           # logits (B, N, V); cache now S + N long
    acc    = verify(tree, out.logits)                      # path root..a*, tokens x.. + bonus
    compact_cache(cache, S, acc.path)                      # cache now S + len(path) long
    context = tokens + acc.tokens, features at acc.path    # the bonus is the next root

Greedy output equals the target's own `generate(do_sample=False)` token for token. Sampled output has
the law of the target's `generate(do_sample=True, temperature, top_k, top_p)`: every token, the first
(from prefill) and each step's, is drawn from p or verified by a lossless rule (verify.py), with one
seeded CPU generator, so a seed reproduces a run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from specheads.core.target import TargetOutput
from specheads.decode.batched_inputs import Layout
from specheads.decode.drafters import DraftContext, Drafter
from specheads.decode.kv_cache import new_cache
from specheads.decode.sampling import SamplingParams
from specheads.decode.step import (
    PHASES,
    PhaseClock,
    SamplingOptions,
    TreeDecoder,
    Verify,
    eos_ids,
    extend,
    first_tokens,
    speculative_step,
    stop_ids,
    timed,
    with_decoding_attention,
)
from specheads.decode.trees import DraftTree
from specheads.decode.verify import Acceptance, TypicalAcceptance

__all__ = [
    "PHASES",
    "DecodeOutput",
    "PhaseClock",
    "SamplingOptions",
    "SpeculativeDecoder",
    "eos_ids",
    "timed",
]


@dataclass
class DecodeOutput:
    """One `generate` call.

    tokens: (1, n) the new tokens (prompt not included), ending at EOS or max_new_tokens.
    accept_lengths: per speculative step, the tokens it emitted (bonus included; the last step's
        count is cut where the output stopped). The first token comes from prefill, so
        n == 1 + sum(accept_lengths).
    timings: seconds per phase (PHASES) plus "total".
    """

    tokens: torch.Tensor
    accept_lengths: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.accept_lengths)

    @property
    def mean_accept_length(self) -> float:
        """τ: mean tokens per speculative step, bonus included (1.0 = autoregressive)."""
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 1.0


class SpeculativeDecoder(TreeDecoder):
    """Tree-attention speculative decoding of one prompt over a frozen target with lossless verification,
    greedy or sampled: the batch-1 case of `speculative_step` (step.py).

    `SpeculativeDecoder(target, drafter)`: the target loaded with sdpa or eager attention, a `Drafter`
    (e.g. `MedusaDrafter`) proposing the trees.
    """

    drafter: Drafter

    @with_decoding_attention  # on CUDA, SDPA without cuDNN's per-shape plans (step.py)
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        profile: bool = False,
        **sampling,
    ) -> DecodeOutput:
        """Speculative decoding of one prompt, greedy or sampled.

        Args:
            prompt_ids: (1, T) token ids.
            max_new_tokens: stop after this many new tokens.
            eos_token_id: id(s) that end the output (kept, as `generate` keeps them); None takes the
                target's generation config, [] never stops early.
            profile: synchronise the accelerator around each timed phase (accurate timings on GPU).
            **sampling: `SamplingOptions`' keywords (do_sample, temperature, top_k, top_p, generator,
                acceptance), as `model.generate` takes them; none: greedy.

        Returns:
            DecodeOutput: the new tokens, per-step accept lengths and timings.
        """
        if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1:
            raise ValueError(f"generate takes one prompt (1, T), got shape {tuple(prompt_ids.shape)}")
        eos = stop_ids(self.target, eos_token_id)
        settings = SamplingOptions.from_keywords(sampling).context_fields()
        clock = PhaseClock(sync=profile and self.target.device.type == "cuda")
        start = time.perf_counter()
        prompt_ids = prompt_ids.to(self.target.device)
        new: list[int] = []
        accept_lengths: list[int] = []
        if max_new_tokens > 0:
            cache = new_cache()
            with clock("prefill"):
                out = self.prefill(prompt_ids, cache)
                context = self.first_context(prompt_ids, out, **settings)
            stopped = extend(new, context.tokens[0, -1:].tolist(), eos, max_new_tokens)
            while not stopped:
                accepted, context = self.step(context, cache, clock)
                before = len(new)
                stopped = extend(new, accepted.tokens.tolist(), eos, max_new_tokens)
                accept_lengths.append(len(new) - before)
        timings = {phase: clock.totals.get(phase, 0.0) for phase in PHASES}
        timings["total"] = time.perf_counter() - start
        tokens = torch.tensor([new], dtype=torch.long, device=prompt_ids.device)
        return DecodeOutput(tokens=tokens, accept_lengths=accept_lengths, timings=timings)

    def prefill(self, prompt_ids: torch.Tensor, cache) -> TargetOutput:
        """Run the target over the prompt (1, T), filling `cache`; logits (1, T, V)."""
        return self.target(prompt_ids, past_key_values=cache, capture=tuple(self.drafter.capture_layers))

    def first_context(
        self,
        prompt_ids: torch.Tensor,
        out: TargetOutput,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        acceptance: str | TypicalAcceptance = "exact",
    ) -> DraftContext:
        """The first new token (argmax, or a draw from p, after the prompt) and the first step's context.

        The sampling arguments are those `SamplingOptions.context_fields` returns (none: greedy).
        """
        root = first_tokens(out.logits[:, -1], sampling, generator)[:, None]  # (1, 1) after the prompt
        tokens = torch.cat([prompt_ids, root.to(prompt_ids.device)], 1)
        hidden = self.features(out.hidden, None)
        return DraftContext(
            tokens, hidden, step=0, sampling=sampling, generator=generator, acceptance=acceptance
        )

    def step(
        self, context: DraftContext, cache, clock: PhaseClock | None = None, verify: Verify | None = None
    ) -> tuple[Acceptance, DraftContext]:
        """One speculative step (`speculative_step` with one row): propose → tree inputs → verify → accept →
        compact.

        Returns the acceptance and the next context (the bonus token appended as the next root). `verify`
        replaces the verification (it returns what is accepted and compacted; one Acceptance per row).
        """
        layout = Layout.contiguous(cache.get_seq_length(), device=context.tokens.device)
        done = speculative_step(self, context, cache, layout, clock, verify)
        return done.acceptances[0], _advanced(context, done.acceptances[0], done.hidden)

    def verify(self, tree: DraftTree, logits: torch.Tensor, context: DraftContext) -> Acceptance:
        """The one row's Acceptance (`verify_rows`)."""
        return self.verify_rows(tree, logits, context)[0]

    def next_context(self, context: DraftContext, acceptance: Acceptance, out: TargetOutput) -> DraftContext:
        """The context after a step: its tokens appended (the bonus is the next root), features at the path."""
        return _advanced(context, acceptance, self.features(out.hidden, acceptance.path[None]))


def _advanced(context: DraftContext, acceptance: Acceptance, hidden: dict[int, torch.Tensor]) -> DraftContext:
    """`context` after a step that accepted `acceptance`; `hidden`: the features at its path (1, n, H)."""
    tokens = torch.cat([context.tokens, acceptance.tokens[None].to(context.tokens.device)], 1)
    return replace(context, tokens=tokens, hidden=hidden, step=context.step + 1)
