"""One speculative step for every decoding path: B rows on one KV cache, one prompt being B = 1.

Single decoding (decoder.py), batched decoding (batched.py), the calibration's recording of EAGLE-2 trees
(calibrate.py) and the timing of target steps (step_timing.py) all run `speculative_step`:

    tree   = drafter.propose(context)                    # (B, N) trees, tokens[:, 0] = the roots
    inputs = batched_tree_inputs(tree, layout, S)        # mask (B, 1, N, S + N), positions per row
    out    = target(inputs, cache)                       # logits (B, N, V); cache now S + N long
    acc    = verify(tree, out.logits, context)           # per row: path root..a*_b (n_b nodes) + bonus
    compact_rows(cache, S, paths, n, layout.length)      # row b's path to [length_b, length_b + n_b)

The layout (batched_inputs.py) says where each row's tokens sit in the cache: one prompt is the layout
with no padding and length S (`Layout.contiguous`), for which every verb reduces to the batch-1 one
(tree_inputs.tree_inputs, kv_cache.compact_cache). What a decoder does with the step's output, the next
context its drafter sees, is the decoder's own: the context types differ (DraftContext holds the whole
sequence, BatchDraftContext each row's new columns).
"""

from __future__ import annotations

import functools
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specheads.core.target import FrozenTarget, TargetOutput
from specheads.decode.batched_inputs import Layout, batched_tree_inputs, compact_rows, pad_rows
from specheads.decode.drafters import SampledTree
from specheads.decode.grouped_attention import forced_grouped_attention, grouped_attention_for
from specheads.decode.packed_linear import PackedLinears
from specheads.decode.sampling import SamplingParams, check_generator, sample, sampling_probs
from specheads.decode.tree_inputs import (
    TreeInputs,
    attention_window,
    check_attention_implementation,
    mask_key_lengths,
)
from specheads.decode.trees import DraftTree
from specheads.decode.verify import (
    Acceptance,
    TypicalAcceptance,
    verify_greedy,
    verify_sampling,
    verify_typical,
)

# Phases timed by the decoders (seconds, summed over a generate call).
PHASES = ("prefill", "draft", "tree_inputs", "tree_forward", "verify", "compact")

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
    """Sums wall time per phase; with `sync`, waits for the accelerator around each phase.

    `with clock("draft"): ...` times the block. The clock is its own context manager (a generator-based
    one costs a few microseconds a phase, five phases a step), so phases do not nest.
    """

    def __init__(self, sync: bool):
        self.sync = sync
        self.totals: dict[str, float] = defaultdict(float)
        self._phase: str | None = None
        self._start = 0.0

    def __call__(self, phase: str) -> PhaseClock:
        if self._phase is not None:
            raise RuntimeError(f"phase {phase!r} started inside phase {self._phase!r}: phases do not nest")
        self._phase = phase
        return self

    def __enter__(self) -> None:
        if self.sync:
            torch.cuda.synchronize()
        self._start = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self.sync:
            torch.cuda.synchronize()
        self.totals[self._phase] += time.perf_counter() - self._start
        self._phase = None


def eos_ids(target: FrozenTarget) -> set[int]:
    """The target's end-of-sequence ids from its generation config (an int, a list, or none)."""
    config = getattr(target.model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return set()
    return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}


def stop_ids(target: FrozenTarget, eos_token_id: int | Sequence[int] | None) -> set[int]:
    """The ids that end a row: `eos_token_id` as given (an id or ids; [] never stops early), or the target's
    generation config's when None."""
    if isinstance(eos_token_id, int):
        eos_token_id = [eos_token_id]
    return eos_ids(target) if eos_token_id is None else {int(e) for e in eos_token_id}


@dataclass(frozen=True)
class SamplingOptions:
    """How a `generate` call picks its tokens: the HF-style sampling keywords both decoders take, checked.

    do_sample: sample from the target's distribution p instead of taking its argmax.
    temperature, top_k, top_p: p as `generate(do_sample=True, ...)` builds it (`SamplingParams`); top_k=0
        keeps every token, whereas `generate` left without top_k applies its config's (50 by default):
        give both the same top_k.
    generator: a CPU torch.Generator for every draw; None seeds one from torch's global RNG per call.
    acceptance: "exact" (lossless, the rule that matches how the drafter picked children), or "typical" /
        a `TypicalAcceptance`: Medusa's typical acceptance, which is LOSSY.

    Raises:
        ValueError: for an unknown acceptance, typical acceptance without sampling, and when sampling, bad
            temperature / top-k / top-p or a generator that is not on the CPU.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    acceptance: str | TypicalAcceptance = "exact"

    def __post_init__(self):
        if isinstance(self.acceptance, str) and self.acceptance not in ("exact", "typical"):
            raise ValueError(
                f"acceptance={self.acceptance!r}: expected 'exact', 'typical' or a TypicalAcceptance"
            )
        if not self.do_sample and self.acceptance != "exact":
            raise ValueError("typical acceptance is a sampling rule: pass do_sample=True")
        if self.do_sample:
            SamplingParams(self.temperature, self.top_k, self.top_p)  # checks them
            if self.generator is not None:
                check_generator(self.generator)

    @classmethod
    def from_keywords(cls, keywords: dict[str, Any]) -> SamplingOptions:
        """The options a `generate(..., **keywords)` call gives.

        Raises:
            TypeError: for a keyword that is not one of the options, naming those that are.
        """
        names = [f.name for f in fields(cls)]
        unknown = [key for key in keywords if key not in names]
        if unknown:
            raise TypeError(
                f"generate() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; its sampling "
                f"keywords are {', '.join(names)}"
            )
        return cls(**keywords)

    def context_fields(self) -> dict[str, Any]:
        """The DraftContext fields these options set for one call (none when greedy): the sampling
        parameters, the generator (seeded here when none was given) and the acceptance rule."""
        if not self.do_sample:
            return {}
        return {
            "sampling": SamplingParams(self.temperature, self.top_k, self.top_p),
            "generator": check_generator(self.generator),
            "acceptance": TypicalAcceptance() if self.acceptance == "typical" else self.acceptance,
        }


def extend(new: list[int], tokens: list[int], eos: set[int], max_new_tokens: int) -> bool:
    """Append `tokens` to a row's `new` up to the first EOS (kept) or max_new_tokens; True when it is done."""
    for token in tokens:
        if len(new) == max_new_tokens:
            return True
        new.append(token)
        if token in eos:
            return True
    return len(new) == max_new_tokens


# -- the verbs a step needs of the target -------------------------------------------------------------


# -- attention backends ------------------------------------------------------------------------------------

# SDPA backends a decoder runs with on CUDA: all but cuDNN's. Decoding calls SDPA with an explicit mask at a
# new key length nearly every step (a tree over a cache that grows), and cuDNN's backend, which torch 2.11
# tries first for masked bf16 attention on Hopper and later chips, builds an execution plan for each new
# shape (hundreds of milliseconds, reports say: modelscope/FunASR#3704, sgl-project/sglang#4650). Flash and
# memory-efficient attention take any length as it comes.
DECODING_SDPA = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
KEEP_CUDNN_SDPA = "SPECHEADS_CUDNN_SDPA"  # "1": leave torch's SDPA backends as they are (an A/B switch)


@contextmanager
def decoding_attention(device: torch.device) -> Iterator[None]:
    """Run the block with SDPA's cuDNN backend off on a CUDA device (DECODING_SDPA); elsewhere, or with
    $SPECHEADS_CUDNN_SDPA=1, as it is. The backends are restored after."""
    if device.type != "cuda" or os.environ.get(KEEP_CUDNN_SDPA) == "1":
        yield
        return
    with sdpa_kernel([getattr(SDPBackend, name) for name in DECODING_SDPA]):
        yield


def with_decoding_attention(generate: Callable[..., T]) -> Callable[..., T]:
    """A decoder's `generate`, run under `decoding_attention` on its target's device."""

    @functools.wraps(generate)
    def wrapper(self, *args, **kwargs):
        with decoding_attention(self.target.device):
            return generate(self, *args, **kwargs)

    return wrapper


class TreeDecoder:
    """The target as a step reads it: tree forwards with the drafter's layers captured, verification.

    Both decoders (SpeculativeDecoder, BatchedSpeculativeDecoder) are one of these plus their own
    `generate`: how they prefill, what context their drafter sees, and when rows stop.
    """

    def __init__(self, target: FrozenTarget, drafter):
        """
        Args:
            target: the frozen target, loaded with sdpa or eager attention.
            drafter: proposes the draft trees; its `capture_layers` are captured on every forward.

        Raises:
            ValueError: for an attention implementation that ignores custom masks (flash attention)
                or layers other than full and sliding-window attention.
        """
        check_attention_implementation(target.config)
        self.target, self.drafter = target, drafter
        # the lm_head, for the device every step checks: `target.device` looks it up through transformers (10
        # µs a step on the CPU); the module stays itself when the model moves (its weight may not)
        self._lm_head = target.lm_head
        self.window = attention_window(target.config)  # one per layer type for a target mixing them
        # sdpa wants a float mask in the dtype of the queries, i.e. of the hidden states.
        self.mask_dtype = target.embed_tokens.weight.dtype
        self.packed = PackedLinears.for_target(target)  # fp32 on the CPU: weights packed per tree size
        # on the CPU: grouped heads attended without copying the cache to every head (grouped_attention.py)
        self.grouped = grouped_attention_for(target)

    @property
    def device(self) -> torch.device:
        """The target's device (its lm_head's)."""
        return self._lm_head.weight.device

    def tree_forward(self, tree: DraftTree, inputs: TreeInputs, cache) -> TargetOutput:
        """One target forward over the trees on top of the cache; logits (B, N, V)."""
        kv_length = cache.get_seq_length() + tree.num_nodes
        covered = mask_key_lengths(inputs.attention_mask)
        if covered != {kv_length}:
            raise ValueError(
                f"tree mask covers {' or '.join(map(str, sorted(covered)))} keys but the cache will hold {kv_length} "
                f"({cache.get_seq_length()} cached + {tree.num_nodes} nodes): the last mask dimension must be "
                f"the real KV length"
            )
        packed = self.packed.rows(inputs.input_ids.numel()) if self.packed else nullcontext()
        with packed, forced_grouped_attention() if self.grouped else nullcontext():
            return self.target(
                inputs.input_ids,
                attention_mask=inputs.attention_mask,
                position_ids=inputs.position_ids,
                past_key_values=cache,
                capture=tuple(self.drafter.capture_layers),
            )

    def features(
        self, hidden: dict[int, torch.Tensor], paths: torch.Tensor | None
    ) -> dict[int, torch.Tensor]:
        """The drafter's layers, keyed as it asked for them, at `paths` (B, M) (all columns when None)."""
        features = {}
        for layer in self.drafter.capture_layers:
            h = hidden[self.target.layer_id(layer)]  # (B, Q, H)
            if paths is not None and paths.shape[0] == 1:  # one row: one call, not four
                h = h.index_select(1, paths[0].to(h.device))  # (1, M, H)
            elif paths is not None:
                h = h.gather(1, paths.to(h.device)[:, :, None].expand(-1, -1, h.shape[-1]))  # (B, M, H)
            features[layer] = h
        return features

    def verify_rows(self, tree: DraftTree, logits: torch.Tensor, context) -> list[Acceptance]:
        """One Acceptance per row: greedy; or sampling with the exact rule for how the tree's children were
        picked; or typical (context.sampling / generator / acceptance say which)."""
        if context.sampling is None:
            return verify_greedy(tree, logits)
        probs = sampling_probs(logits, context.sampling)  # (B, N, V) p at each node
        if isinstance(context.acceptance, TypicalAcceptance):
            return verify_typical(tree, probs, context.generator, context.acceptance)
        if isinstance(tree, SampledTree):
            return verify_sampling(tree, probs, context.generator, tree.children, tree.draft_probs)
        return verify_sampling(tree, probs, context.generator, "top-k")


def first_tokens(
    logits: torch.Tensor, sampling=None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """(B, V) logits after each prompt -> (B,) the first new tokens: the argmax, or a draw from p per row."""
    if sampling is None:
        return logits.argmax(-1)
    drawn = [sample(sampling_probs(row, sampling), generator) for row in logits]
    return torch.tensor(drawn, dtype=torch.long, device=logits.device)


# -- the step -----------------------------------------------------------------------------------------


@dataclass
class StepOutput:
    """What one step did, for B rows.

    tree:        the proposed trees (B, N).
    acceptances: one per row: its accepted path (n_b nodes, root first) and tokens (n_b, the bonus last).
    paths:       (B, M) each row's accepted path, right-padded with 0; M = max_b n_b.
    counts:      (B,) n_b.
    layout:      the layout after compaction: length_b + n_b.
    hidden:      the drafter's layers at the paths, (B, M, H) each (columns past n_b are padding).
    out:         the tree forward's output (logits (B, N, V) and the captured layers over the tree).
    """

    tree: DraftTree
    acceptances: list[Acceptance]
    paths: torch.Tensor
    counts: torch.Tensor
    layout: Layout
    hidden: dict[int, torch.Tensor]
    out: TargetOutput


# verify(tree, logits (B, N, V), context) -> one Acceptance per row
Verify = Callable[[DraftTree, torch.Tensor, Any], list[Acceptance]]


def speculative_step(
    decoder: TreeDecoder,
    context,
    cache,
    layout: Layout,
    clock: PhaseClock | None = None,
    verify: Verify | None = None,
) -> StepOutput:
    """One speculative step for every row: propose → tree inputs → tree forward → verify → compact.

    Args:
        decoder: the target's verbs and the drafter (`decoder.drafter.propose(context)`).
        context: what the drafter sees (DraftContext or BatchDraftContext); verification reads its
            sampling, generator and acceptance.
        cache: the target's cache, `layout.total` slots long.
        layout: where each row's tokens sit in the cache.
        clock: sums the time of each phase.
        verify: the verification; None takes `decoder.verify_rows`. What it returns is what is compacted
            (calibration keeps only the root of each verified tree).
    """
    with decoding_attention(decoder.device):
        return _step(decoder, context, cache, layout, clock or PhaseClock(sync=False), verify)


def _step(decoder, context, cache, layout: Layout, clock: PhaseClock, verify: Verify | None) -> StepOutput:
    verify = verify or decoder.verify_rows
    past = cache.get_seq_length()
    if past != layout.total:
        raise RuntimeError(f"the cache holds {past} slots but the layout's longest row is {layout.total}")
    with clock("draft"):
        tree = decoder.drafter.propose(context)
    if tree.tokens.shape[0] != layout.length.numel():
        raise ValueError(
            f"the drafter proposed {tree.tokens.shape[0]} trees for {layout.length.numel()} rows"
        )
    with clock("tree_inputs"):
        inputs = batched_tree_inputs(tree, layout, past, decoder.mask_dtype, decoder.window)
    with clock("tree_forward"):
        out = decoder.tree_forward(tree, inputs, cache)
    with clock("verify"):
        acceptances = verify(tree, out.logits, context)
    with clock("compact"):
        paths, counts = pad_rows([a.path for a in acceptances])  # (B, M), (B,)
        compact_rows(cache, past, paths, counts, layout.length)
        after = Layout(pad=layout.pad, length=layout.length + counts.to(layout.length.device))
        hidden = decoder.features(out.hidden, paths)
    return StepOutput(tree, acceptances, paths, counts, after, hidden, out)
