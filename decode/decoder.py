"""The speculative decoder: prefill, then propose → tree inputs → verify → accept → compact.

One step, with S tokens in the cache and the root (the last emitted token) outside it:

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
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TypeVar

import torch

from specheads.decode.drafters import DraftContext, Drafter, SampledTree
from specheads.decode.kv_cache import compact_cache, new_cache
from specheads.decode.sampling import SamplingParams, check_generator, sample, sampling_probs
from specheads.decode.tree_inputs import (
    TreeInputs,
    attention_window,
    check_attention_implementation,
    tree_inputs,
)
from specheads.decode.trees import DraftTree
from specheads.decode.verify import (
    Acceptance,
    TypicalAcceptance,
    verify_greedy,
    verify_sampling,
    verify_typical,
)
from specheads.heads.target import FrozenTarget, TargetOutput

# Phases timed by the decoder (seconds, summed over a generate call).
PHASES = ("prefill", "draft", "tree_inputs", "tree_forward", "verify", "compact")


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


T = TypeVar("T")


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """(fn(), wall seconds), waiting for the accelerator before and after so the time is the work's."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    result = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


class PhaseClock:
    """Sums wall time per phase; with `sync`, waits for the accelerator around each phase."""

    def __init__(self, sync: bool):
        self.sync = sync
        self.totals: dict[str, float] = defaultdict(float)

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        if self.sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        if self.sync:
            torch.cuda.synchronize()
        self.totals[phase] += time.perf_counter() - start


def eos_ids(target: FrozenTarget) -> set[int]:
    """The target's end-of-sequence ids from its generation config (an int, a list, or none)."""
    config = getattr(target.model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


class SpeculativeDecoder:
    """Tree-attention speculative decoding over a frozen target with lossless verification, greedy or sampled."""

    def __init__(self, target: FrozenTarget, drafter: Drafter):
        """
        Args:
            target: the frozen target, loaded with sdpa or eager attention.
            drafter: proposes the draft trees (e.g. `MedusaDrafter`).

        Raises:
            ValueError: for an attention implementation that ignores custom masks (flash attention)
                or a target mixing full and sliding-window layers.
        """
        check_attention_implementation(target.config)
        self.target, self.drafter = target, drafter
        self.window = attention_window(target.config)
        # sdpa wants a float mask in the dtype of the queries, i.e. of the hidden states.
        self.mask_dtype = target.embed_tokens.weight.dtype

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor,
        max_new_tokens: int,
        eos_token_id: int | Sequence[int] | None = None,
        profile: bool = False,
        *,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        acceptance: str | TypicalAcceptance = "exact",
    ) -> DecodeOutput:
        """Speculative decoding of one prompt, greedy or sampled.

        Args:
            prompt_ids: (1, T) token ids.
            max_new_tokens: stop after this many new tokens.
            eos_token_id: id(s) that end the output (kept, as `generate` keeps them); None takes the
                target's generation config, [] never stops early.
            profile: synchronise the accelerator around each timed phase (accurate timings on GPU).
            do_sample: sample from the target's distribution p instead of taking its argmax.
            temperature, top_k, top_p: p as `generate(do_sample=True, ...)` builds it (sampling.py); top_k=0
                keeps every token, whereas `generate` left without top_k applies its config's (50 by
                default): give both the same top_k.
            generator: a CPU torch.Generator for every draw; None seeds one from torch's global RNG.
            acceptance: "exact" (lossless, the rule that matches how the drafter picked children), or
                "typical" / a `TypicalAcceptance`: Medusa's typical acceptance, which is LOSSY.

        Returns:
            DecodeOutput: the new tokens, per-step accept lengths and timings.
        """
        if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1:
            raise ValueError(f"generate takes one prompt (1, T), got shape {tuple(prompt_ids.shape)}")
        if isinstance(eos_token_id, int):
            eos_token_id = [eos_token_id]
        eos = eos_ids(self.target) if eos_token_id is None else {int(e) for e in eos_token_id}
        settings = sampling_settings(do_sample, temperature, top_k, top_p, generator, acceptance)
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
            stopped = _extend(new, context.tokens[0, -1:].tolist(), eos, max_new_tokens)
            while not stopped:
                accepted, context = self.step(context, cache, clock)
                before = len(new)
                stopped = _extend(new, accepted.tokens.tolist(), eos, max_new_tokens)
                accept_lengths.append(len(new) - before)
        timings = {phase: clock.totals.get(phase, 0.0) for phase in PHASES}
        timings["total"] = time.perf_counter() - start
        tokens = torch.tensor([new], dtype=torch.long, device=prompt_ids.device)
        return DecodeOutput(tokens=tokens, accept_lengths=accept_lengths, timings=timings)

    def prefill(self, prompt_ids: torch.Tensor, cache) -> TargetOutput:
        """Run the target over the prompt (1, T), filling `cache`; logits (1, T, V)."""
        return self.target(prompt_ids, past_key_values=cache, capture=self._capture_ids())

    def first_context(
        self,
        prompt_ids: torch.Tensor,
        out: TargetOutput,
        sampling: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        acceptance: str | TypicalAcceptance = "exact",
    ) -> DraftContext:
        """The first new token (argmax, or a draw from p, after the prompt) and the first step's context.

        The sampling arguments are those `sampling_settings` returns (none: greedy).
        """
        logits = out.logits[:, -1]  # (1, V) after the prompt
        if sampling is None:
            root = logits.argmax(-1, keepdim=True)  # (1, 1)
        else:
            root = torch.tensor([[sample(sampling_probs(logits[0], sampling), generator)]])
        tokens = torch.cat([prompt_ids, root.to(prompt_ids.device)], 1)
        hidden = self._features(out, None)
        return DraftContext(
            tokens, hidden, step=0, sampling=sampling, generator=generator, acceptance=acceptance
        )

    def step(
        self, context: DraftContext, cache, clock: PhaseClock | None = None
    ) -> tuple[Acceptance, DraftContext]:
        """One speculative step: propose → tree inputs → verify → accept → compact.

        Returns the acceptance and the next context (the bonus token appended as the next root).
        """
        clock = clock or PhaseClock(sync=False)
        past_len = cache.get_seq_length()
        with clock("draft"):
            tree = self.drafter.propose(context)
        with clock("tree_inputs"):
            inputs = tree_inputs(tree, past_len, self.mask_dtype, self.window)
        with clock("tree_forward"):
            out = self.tree_forward(tree, inputs, cache)
        with clock("verify"):
            acceptance = self.verify(tree, out.logits, context)
        with clock("compact"):
            compact_cache(cache, past_len, acceptance.path)
        return acceptance, self.next_context(context, acceptance, out)

    def verify(self, tree: DraftTree, logits: torch.Tensor, context: DraftContext) -> Acceptance:
        """Greedy; or sampling with the exact rule for how the tree's children were picked; or typical."""
        if context.sampling is None:
            return verify_greedy(tree, logits)[0]
        probs = sampling_probs(logits, context.sampling)  # (1, N, V) p at each node
        if isinstance(context.acceptance, TypicalAcceptance):
            return verify_typical(tree, probs, context.generator, context.acceptance)[0]
        if isinstance(tree, SampledTree):
            return verify_sampling(tree, probs, context.generator, tree.children, tree.draft_probs)[0]
        return verify_sampling(tree, probs, context.generator, "top-k")[0]

    def next_context(self, context: DraftContext, acceptance: Acceptance, out: TargetOutput) -> DraftContext:
        """The context after a step: its tokens appended (the bonus is the next root), features at the path."""
        tokens = torch.cat([context.tokens, acceptance.tokens[None].to(context.tokens.device)], 1)
        return replace(
            context, tokens=tokens, hidden=self._features(out, acceptance.path), step=context.step + 1
        )

    def tree_forward(self, tree: DraftTree, inputs: TreeInputs, cache) -> TargetOutput:
        """One target forward over the tree on top of the cache; logits (B, N, V)."""
        kv_length = cache.get_seq_length() + tree.num_nodes
        if inputs.attention_mask.shape[-1] != kv_length:
            raise ValueError(
                f"tree mask covers {inputs.attention_mask.shape[-1]} keys but the cache will hold {kv_length} "
                f"({cache.get_seq_length()} cached + {tree.num_nodes} nodes): the last mask dimension must be "
                f"the real KV length"
            )
        return self.target(
            inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            past_key_values=cache,
            capture=self._capture_ids(),
        )

    def _capture_ids(self) -> tuple[int, ...]:
        return tuple(self.drafter.capture_layers)

    def _features(self, out: TargetOutput, path: torch.Tensor | None) -> dict[int, torch.Tensor]:
        """The drafter's layers, keyed as it asked for them, at `path` (all positions when None)."""
        features = {}
        for layer in self.drafter.capture_layers:
            hidden = out.hidden[self.target.layer_id(layer)]  # (1, T, H)
            features[layer] = hidden if path is None else hidden[:, path]
        return features


def sampling_settings(
    do_sample: bool,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    acceptance: str | TypicalAcceptance = "exact",
) -> dict:
    """Check a generate call's sampling arguments; the DraftContext fields they set (none when greedy).

    Raises:
        ValueError: for bad temperature / top-k / top-p, an unknown acceptance, typical acceptance
            without sampling, or a generator that is not on the CPU.
    """
    if isinstance(acceptance, str):
        if acceptance not in ("exact", "typical"):
            raise ValueError(f"acceptance={acceptance!r}: expected 'exact', 'typical' or a TypicalAcceptance")
        acceptance = TypicalAcceptance() if acceptance == "typical" else acceptance
    if not do_sample:
        if acceptance != "exact":
            raise ValueError("typical acceptance is a sampling rule: pass do_sample=True")
        return {}
    return {
        "sampling": SamplingParams(temperature, top_k, top_p),
        "generator": check_generator(generator),
        "acceptance": acceptance,
    }


def _extend(new: list[int], tokens: list[int], eos: set[int], max_new_tokens: int) -> bool:
    """Append `tokens` to `new` up to the first EOS (kept) or max_new_tokens; True when done."""
    for token in tokens:
        if len(new) == max_new_tokens:
            return True
        new.append(token)
        if token in eos:
            return True
    return len(new) == max_new_tokens
