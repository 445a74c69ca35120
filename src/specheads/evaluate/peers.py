"""Every method `specheads compare` times, behind one call: `generate(prompt_ids, max_new_tokens)`.

    generate        the target's own greedy `generate()`: the baseline, one token per forward
    prompt-lookup   transformers' prompt lookup decoding, `generate(prompt_lookup_num_tokens=N)`: the
                    draft is the N tokens that followed the latest earlier match of the last n-gram
    assisted        transformers' assisted generation, `generate(assistant_model=draft)`: a small causal
                    LM of the same tokenizer drafts a chain of tokens
    heads           our tree decoder with trained heads (`SpeculativeDecoder` + a drafter)

Each returns a `Decoded`: the new tokens and, per step (one target forward that verified a draft),
the tokens it emitted, how many draft tokens the target verified and how deep they reached. Those three
lists are all the draft figures in evaluate/report.py are computed from.

Where the first token comes from differs, and is recorded: our decoder and `generate()` take it from
the prefill forward, which verifies no draft and is no step; transformers' assisted loop verifies its
first draft in the same forward as the prompt, so its first step already emits it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from specheads.core.target import FrozenTarget, choose_attention, vocab_hash
from specheads.decode.baseline import generate_rows
from specheads.decode.calibrate import CalibrationSettings
from specheads.decode.decoder import SpeculativeDecoder
from specheads.decode.drafter_factory import draft_vocab_mask
from specheads.decode.drafters import DraftContext, Drafter
from specheads.decode.trees import DraftTree
from specheads.evaluate.calibrate import calibrated_once
from specheads.evaluate.evaluate import baseline_generate
from specheads.evaluate.progress import Progress
from specheads.heads.checkpoint import heads_adapter, target_for_heads
from specheads.heads.method import Method as MethodEntry

BASELINE = "generate"
PEERS = ("generate", "prompt-lookup", "assisted")


@dataclass
class Decoded:
    """One decoded prompt, any method.

    tokens: the new tokens (prompt not included), ending at EOS or max_new_tokens.
    accept_lengths: per step, the tokens it emitted (accepted draft tokens + the bonus token, cut where
        the output stopped).
    draft_sizes: per step, the draft tokens the target verified (a tree's nodes below the root; a
        chain's length; 0 when there was no draft).
    draft_depths: per step, the deepest of those draft tokens (a chain's length; a tree's depth).
    prefill_token: whether the first new token came from a prefill forward that is not a step, so
        len(tokens) == prefill_token + sum(accept_lengths).
    phase_seconds: the speculative decoder's seconds per phase (step.PHASES and "total"); empty for the
        methods transformers runs.
    """

    tokens: list[int]
    accept_lengths: list[int] = field(default_factory=list)
    draft_sizes: list[int] = field(default_factory=list)
    draft_depths: list[int] = field(default_factory=list)
    prefill_token: bool = True
    phase_seconds: dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        steps = len(self.accept_lengths)
        if len(self.draft_sizes) != steps or len(self.draft_depths) != steps:
            raise ValueError(
                f"{steps} accept lengths but {len(self.draft_sizes)} draft sizes and "
                f"{len(self.draft_depths)} draft depths: one of each per step"
            )
        emitted = int(self.prefill_token and bool(self.tokens)) + sum(self.accept_lengths)
        if emitted != len(self.tokens):
            raise ValueError(
                f"the steps emitted {emitted} tokens (prefill token: {self.prefill_token}) but the output "
                f"has {len(self.tokens)}"
            )


class Method(Protocol):
    """What `compare` times: one greedy decode of one prompt."""

    max_depth: int  # the deepest a draft can reach (accept_rate_per_depth has that many entries)

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> Decoded: ...

    def settings(self) -> dict[str, Any]: ...


# -- the baseline and transformers' own speculative paths ---------------------------------------------


class GeneratePeer:
    """The target's own `generate(do_sample=False)` (decode.baseline.generate_rows)."""

    max_depth = 0

    def __init__(self, target: FrozenTarget):
        self.target = target

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> Decoded:
        tokens = baseline_generate(self.target, prompt_ids, max_new_tokens)
        steps = max(0, len(tokens) - 1)  # the first token is the prefill's; then one forward a token
        return Decoded(tokens, [1] * steps, [0] * steps, [0] * steps, prefill_token=True)

    def settings(self) -> dict[str, Any]:
        return {"call": "generate(do_sample=False)"}


@contextmanager
def recording_steps(model) -> Iterator[list[tuple[int, int]]]:
    """Record (draft tokens verified, draft tokens accepted) per step of transformers' assisted loop.

    `generate` builds one candidate generator per call (`_get_candidate_generator`) and, after each
    target forward, calls its `update_candidate_strategy(input_ids, scores, num_matches)` with the
    target's scores for the candidates plus the bonus position, (1, candidates + 1, V), and the
    matches already cut at EOS and max length. The wrapper reads both and changes nothing.
    """
    steps: list[tuple[int, int]] = []
    make = model._get_candidate_generator

    def make_recording(*args, **kwargs):
        generator = make(*args, **kwargs)
        update = generator.update_candidate_strategy

        def record(input_ids, scores, num_matches):
            steps.append((scores.shape[1] - 1, int(num_matches)))
            return update(input_ids, scores, num_matches)

        generator.update_candidate_strategy = record
        return generator

    model._get_candidate_generator = make_recording  # an instance attribute shadows the method
    try:
        yield steps
    finally:
        del model._get_candidate_generator


class _AssistedLoop:
    """A transformers assisted-decoding path of `generate`, with its steps recorded."""

    def __init__(self, target: FrozenTarget, **generate_kwargs):
        self.target, self.generate_kwargs = target, generate_kwargs

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> Decoded:
        with recording_steps(self.target.model) as steps:
            tokens = generate_rows(self.target, prompt_ids, max_new_tokens, **self.generate_kwargs)[0]
        return Decoded(
            tokens,
            accept_lengths=[accepted + 1 for _, accepted in steps],
            draft_sizes=[size for size, _ in steps],
            draft_depths=[size for size, _ in steps],  # a chain: as deep as it is long
            prefill_token=False,
        )


class PromptLookupPeer(_AssistedLoop):
    """transformers' prompt lookup decoding: `generate(prompt_lookup_num_tokens=N)`."""

    def __init__(self, target: FrozenTarget, num_tokens: int, max_ngram: int | None = None):
        kwargs: dict[str, Any] = {"prompt_lookup_num_tokens": num_tokens}
        if max_ngram is not None:
            kwargs["max_matching_ngram_size"] = max_ngram
        super().__init__(target, **kwargs)
        self.num_tokens, self.max_ngram = num_tokens, max_ngram
        self.max_depth = num_tokens

    def settings(self) -> dict[str, Any]:
        # transformers' default n-gram size is 2 when none is given.
        return {"prompt_lookup_num_tokens": self.num_tokens, "max_matching_ngram_size": self.max_ngram or 2}


class AssistedPeer(_AssistedLoop):
    """transformers' assisted generation: `generate(assistant_model=draft)`, a constant draft length.

    The draft length is fixed ("constant" schedule) so that the figures do not depend on the order in
    which prompts were decoded (the "heuristic" schedule carries its length from call to call).
    transformers also stops a draft early when the draft's top probability falls below
    `confidence`; 0 turns that off.
    """

    def __init__(
        self,
        target: FrozenTarget,
        draft,
        draft_tokenizer,
        num_tokens: int,
        confidence: float,
        draft_path: str,
    ):
        check_same_vocabulary(target, draft, draft_tokenizer, draft_path)
        draft.generation_config.num_assistant_tokens = num_tokens
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = confidence
        super().__init__(target, assistant_model=draft)
        self.draft, self.num_tokens, self.confidence, self.draft_path = (
            draft,
            num_tokens,
            confidence,
            draft_path,
        )
        self.max_depth = num_tokens

    def settings(self) -> dict[str, Any]:
        config = self.draft.config
        return {
            "draft_model": self.draft_path,
            "draft_parameters": sum(p.numel() for p in self.draft.parameters()),
            "draft_layers": getattr(config, "num_hidden_layers", None),
            "draft_hidden_size": getattr(config, "hidden_size", None),
            "num_assistant_tokens": self.num_tokens,
            "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": self.confidence,
        }


def check_same_vocabulary(target: FrozenTarget, draft, draft_tokenizer, draft_path: str) -> None:
    """Raise unless the draft's logits index the target's vocabulary (same size, same token -> id map)."""

    draft_vocab = draft.get_output_embeddings().weight.shape[0]
    if draft_vocab != target.vocab_size:
        raise ValueError(
            f"--draft-model {draft_path} has {draft_vocab} output rows, the target {target.vocab_size}: "
            f"assisted generation needs a draft in the target's vocabulary (`specheads tiny-draft` builds one)"
        )
    if draft_tokenizer is not None and target.tokenizer is not None:
        if vocab_hash(draft_tokenizer) != vocab_hash(target.tokenizer):
            raise ValueError(
                f"--draft-model {draft_path} has a tokenizer other than the target's (vocabulary hashes "
                f"differ): the same ids would mean different tokens"
            )


def load_draft_model(path: str, dtype: torch.dtype, device: torch.device, attn: str):
    """(the assistant model at `path` in the target's dtype and device, its tokenizer or None)."""

    from transformers import (  # lazy: transformers adds seconds to every command's start
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
    )

    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(
            f"--draft-model {path}: no config.json there (expected an HF model directory)"
        )
    attn, _ = choose_attention(AutoConfig.from_pretrained(path), attn)  # "auto": sdpa, or eager where refused
    draft = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    draft.to(device).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tokenizer = None  # a bare model: only its vocabulary size can be checked
    return draft, tokenizer


# -- our heads --------------------------------------------------------------------------------------


class RecordingDrafter:
    """A drafter that notes the size and depth of every tree it hands the decoder."""

    def __init__(self, drafter: Drafter):
        self.drafter = drafter
        self.capture_layers = drafter.capture_layers
        self.sizes: list[int] = []
        self.depths: list[int] = []

    def propose(self, context: DraftContext) -> DraftTree:
        tree = self.drafter.propose(context)
        self.sizes.append(tree.num_nodes - 1)  # the root is the last accepted token, not a draft
        self.depths.append(int(tree.depths.max()))
        return tree


class HeadsMethod:
    """Our tree decoder with one set of heads (the drafter from decode.drafter_factory.drafter_for)."""

    def __init__(
        self,
        target: FrozenTarget,
        drafter: Drafter,
        tree: dict[str, Any],
        heads: dict[str, Any],
        calibration: dict[str, Any] | None = None,
    ):
        self.recorder = RecordingDrafter(drafter)
        self.decoder = SpeculativeDecoder(target, self.recorder)
        self.tree, self.heads, self.calibration = tree, heads, calibration
        self.max_depth = tree["depth"]
        self.draft_vocab = draft_vocab_mask(drafter, target.vocab_size)  # what it can draft; None: all

    def generate(self, prompt_ids: torch.Tensor, max_new_tokens: int) -> Decoded:
        self.recorder.sizes, self.recorder.depths = [], []
        out = self.decoder.generate(prompt_ids, max_new_tokens)
        return Decoded(
            out.tokens[0].tolist(),
            accept_lengths=list(out.accept_lengths),
            draft_sizes=self.recorder.sizes,
            draft_depths=self.recorder.depths,
            prefill_token=True,
            phase_seconds=dict(out.timings),
        )

    def settings(self) -> dict[str, Any]:
        calibration = {"calibration": self.calibration} if self.calibration is not None else {}
        return {"tree": self.tree, "heads": self.heads, **calibration}


@dataclass
class CalibratedHeads:
    """Heads whose tree `--tree auto` chooses (evaluate/calibrate.py) once the run's progress file is open,
    so that a resumed run takes the tree kept there; `heads_method` then gives the HeadsMethod."""

    target: FrozenTarget
    heads: torch.nn.Module
    config: dict[str, Any]
    record: dict[str, Any]  # HeadsMethod's `heads`
    max_depth: int  # the deepest tree the calibration may choose
    methods: Mapping[str, MethodEntry]  # the method table (the heads' entry calibrates and drafts)
    vocab: torch.Tensor | None = None  # the draft vocabulary its candidates draft over (`--draft-vocab`)
    reuse: bool = True  # take an earlier run's calibration on this machine (False: `--recalibrate`)

    def settings(self) -> dict[str, Any]:
        return {"tree": "auto", "heads": self.record}

    def heads_method(
        self, progress: Progress, key: str, prompts: list, settings: CalibrationSettings
    ) -> HeadsMethod:
        """Calibrate on `prompts` (or take the tree `progress` kept under `key`): our decoder with it."""
        drafter, tree, calibration = calibrated_once(
            progress,
            key,
            self.heads,
            self.config,
            self.target,
            prompts,
            settings,
            self.vocab,
            self.reuse,
            methods=self.methods,
        )
        return HeadsMethod(self.target, drafter, tree, self.record, calibration)


def calibrate_heads(
    methods: dict[str, tuple[str, Method]], progress: Progress, prompts: list, settings: CalibrationSettings
) -> None:
    """Replace each CalibratedHeads of `methods` (name -> (kind, method)) with our decoder over its calibrated
    tree, kept in `progress` under "calibration:<name>" so that a resumed run decodes with the same tree."""
    for name, (kind, method) in methods.items():
        if isinstance(method, CalibratedHeads):
            methods[name] = (kind, method.heads_method(progress, f"calibration:{name}", prompts, settings))


def head_names(configs: list[dict[str, Any]], dirs: list[str]) -> list[str]:
    """Each heads directory's name in the results: its method, or method:folder when methods repeat."""
    methods = [c["method"] for c in configs]
    names = [m if methods.count(m) == 1 else f"{m}:{Path(d).name}" for m, d in zip(methods, dirs)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(
            f"--heads: two directories would both be called {repeated}; give them distinct folder names"
        )
    return names


def adapted_target(target: FrozenTarget, heads_dirs: list[str]) -> FrozenTarget:
    """`target`, or with the Medusa-2 adapter of the one heads directory that carries one merged in.

    Every method and peer of a comparison decodes one model; an adapted target is another model,
    so heads that carry an adapter are compared on their own.
    """
    if len(heads_dirs) == 1:
        return target_for_heads(target, heads_dirs[0])
    adapted = [path for path in heads_dirs if heads_adapter(path) is not None]
    if adapted:
        raise ValueError(
            f"heads {adapted[0]} carry a Medusa-2 adapter, which makes the target another model: "
            "compare them on their own (one --heads), not beside heads of the plain target"
        )
    return target
