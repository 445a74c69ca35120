"""Memory known before the work: what one training process will hold at its peak, from the recipe and the
target's config alone (no weights read, no data loaded), printed before training and checked against what
the device has free.

What a step holds (bytes a process):
    target weights      its parameters x target_dtype's bytes; offline only its embedding, final norm and
                        lm_head; under ZeRO-3 (the target sharded) / the processes
    heads' parameters   counted on heads built on the `meta` device by the method's own build (fp32)
    gradients           one fp32 value a trainable parameter (/ the processes under ZeRO-2 and 3)
    optimizer state     AdamW: 2 fp32 values a parameter; Muon: 1 on the hidden matrices, AdamW's 2 on the
                        rest (/ the processes under ZeRO)
    activations         the step's largest live set of logits and activations: the target's logits
                        (batch_size x max_length x vocabulary), and for every head or draft step its
                        logits in fp32 (the vocabulary, EAGLE-3's draft_vocab_size) with what the loss
                        keeps for backward; EAGLE heads' unrolled layers (keys, values and masks of every
                        training-time-test step)
The peak adds the weights and the optimizer state to the larger of the activations (with the gradients
backward has written by then) and the gradients with the optimizer step's temporaries. Every row is a
full batch_size x max_length with every position a label: an estimate of the worst batch, not the mean.
tests/train/test_memory_estimate.py checks it against the allocator's peak over real training steps.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.heads.method import Method
from specheads.train.config import TrainConfig
from specheads.train.distributed import zero_stage
from specheads.train.optimizers import is_hidden_matrix

FP32 = 4


def human(n: float) -> str:
    """Bytes as GB (from 1 GB) or MB."""
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


class MemoryEstimateError(ValueError):
    """A run whose estimated peak exceeds what its device has available (`--force` trains anyway)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one process holds at its step's peak (module docstring), and what they come from."""

    target_weights: int
    head_parameters: int
    gradients: int
    optimizer_state: int
    activations: int  # the largest live set of logits and activations, gradients written by then aside
    peak: int  # what must fit: weights, optimizer state, and the larger of the two phases of a step
    target_parameters: int = 0
    trainable_parameters: int = 0
    target_dtype: str = "float32"
    optimizer: str = "adamw"
    what: str = ""  # the activations' main term, in words

    def rows(self) -> list[tuple[str, int, str]]:
        return [
            ("target weights", self.target_weights, f"{self.target_parameters:,} x {self.target_dtype}"),
            ("heads' parameters", self.head_parameters, f"{self.trainable_parameters:,} trainable, fp32"),
            ("gradients", self.gradients, "fp32"),
            ("optimizer state", self.optimizer_state, self.optimizer),
            ("activations and logits", self.activations, self.what),
        ]

    def table(self, device: str = "", available: int | None = None) -> str:
        """A short table of the estimate, with the device's available memory when known."""
        where = f" on {device}" if device else ""
        lines = [f"memory estimate a process{where} (from the recipe and the target's config):"]
        lines += [f"  {name:<24}{human(n):>12}   {note}" for name, n, note in self.rows()]
        lines.append(f"  {'peak':<24}{human(self.peak):>12}")
        if available is not None:
            lines.append(f"  {'available':<24}{human(available):>12}")
        return "\n".join(lines)


# -- the target and the heads, on the meta device ------------------------------------------------------


def read_target_config(path: str, trust_remote_code: bool = False):
    """The target's HF config (config.json only)."""
    from transformers import AutoConfig  # lazy: transformers adds seconds to every command's start

    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


def meta_target(config, trust_remote_code: bool = False):
    """A FrozenTarget whose model is built on the `meta` device: its structure and sizes, no memory."""
    from transformers import AutoModelForCausalLM  # lazy: transformers adds seconds to every command's start

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return FrozenTarget(model)


def meta_heads(cfg: TrainConfig, method: Method, target) -> nn.Module:
    """The heads `method` builds for `cfg`, their parameters on the meta device (small buffers, such as
    EAGLE-3's vocabulary maps, on the CPU). A start copied from the target is left out: the weights are
    what is counted."""
    from accelerate import init_empty_weights  # lazy: accelerate is only needed once a run starts

    settings = cfg.settings
    if getattr(settings, "draft_head_init", "random") != "random":
        cfg = dataclasses.replace(cfg, settings=dataclasses.replace(settings, draft_head_init="random"))
    label_counts = torch.zeros(target.vocab_size, dtype=torch.long)
    with init_empty_weights(include_buffers=False):
        heads, _ = method.build_heads(cfg, target, label_counts)
    return heads


def target_bytes(cfg: TrainConfig, target, dtype_bytes: int) -> tuple[int, int]:
    """(parameters, bytes) of the target's weights on one process (before any ZeRO-3 split): offline its
    embedding, final norm and lm_head alone."""
    if cfg.mode == "offline":
        parts = nn.ModuleDict({"e": target.embed_tokens, "n": target.norm, "l": target.lm_head})
        count = sum(p.numel() for p in parts.parameters())  # tied ones once
    else:
        count = sum(p.numel() for p in target.model.parameters())
    return count, count * dtype_bytes


def dtype_bytes_of(name: str, config) -> tuple[int, str]:
    """(bytes an element, name) of target_dtype: "auto" is the checkpoint's (fp32 when it names none)."""
    if name == "auto":
        found = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        dtype = getattr(torch, found) if isinstance(found, str) else found
    else:
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            dtype = torch.float32
    return dtype.itemsize, str(dtype).removeprefix("torch.")


def lora_parameters(settings, target) -> int:
    """Medusa-2's adapters: lora_r x (in + out) for each linear layer its names select."""
    names = tuple(getattr(settings, "lora_target_modules", ()))
    r = getattr(settings, "lora_r", 0)
    return sum(
        r * (m.in_features + m.out_features)
        for name, m in target.model.named_modules()
        if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in names
    )


# -- activations ---------------------------------------------------------------------------------------


@dataclass
class Shapes:
    """What the activation terms read."""

    batch: int  # rows a process, a micro-step
    length: int  # max_length
    hidden: int  # the target's hidden size
    vocab: int  # the target's vocabulary
    target_act: int  # bytes of the target's outputs (its dtype; 2 under mixed precision)
    head_act: int  # bytes of the heads' activations (4; 2 under mixed precision)

    def positions(self, offset: int) -> int:
        """Labelled positions of a full batch whose label lies `offset` ahead."""
        return self.batch * max(self.length - offset, 0)

    def states(self, width: int, nbytes: int) -> int:
        return self.batch * self.length * width * nbytes


def layer_activations(layer_config: dict, s: Shapes, step: int, steps: int = 1) -> int:
    """What unrolled draft-layer step `step` (0-based, of `steps`) keeps for backward: its norms, projections
    and MLP, its attention's queries, output, and keys and values over every step so far (copied per
    attention head where the key heads are fewer, as transformers' sdpa path does with a mask; the
    cache itself, which the next step replaces, once), and its fp32 additive mask over them."""
    hidden = layer_config["hidden_size"]
    heads = layer_config.get("num_attention_heads") or 1
    kv = layer_config.get("num_key_value_heads") or heads
    head_dim = layer_config.get("head_dim") or hidden // heads
    inter = layer_config.get("intermediate_size") or 4 * hidden
    keys = (step + 1) * 2 * heads * head_dim
    if kv != heads and step == steps - 1:
        keys += steps * 2 * kv * head_dim
    per_position = 9 * hidden + 3 * heads * head_dim + 4 * inter + 2 * head_dim + keys
    mask = s.batch * s.length * (step + 1) * s.length * FP32
    return s.states(per_position, s.head_act) + mask


def medusa_activations(cfg, heads, s: Shapes, grads: list[int]) -> tuple[int, str]:
    """Medusa's step: head k's fp32 logits over the vocabulary on every labelled position, kept (as its
    log-softmax, and the target's distribution with labels "target") until backward reaches it; backward
    goes from the last head to the first, writing each head's gradients as it frees that head's logits.
    `grads`: each head's gradient bytes."""
    settings, config = cfg.settings, heads.config
    vocab, hidden, k_heads = config.vocab_size, config.hidden_size, config.num_heads
    soft = settings.labels == "target"
    saved = []
    for k in range(k_heads):
        n = s.positions(2 + k)
        saved.append(
            n * vocab * FP32 * (2 if soft else 1) + n * hidden * s.head_act * (3 * config.num_layers + 1)
        )
    n = s.positions(2)
    target_logits = s.states(vocab, s.target_act) if settings.labels != "data" else 0
    # the last head's logits; with soft labels also the target's rows and the product summed into the loss
    forward = target_logits + s.states(hidden, s.target_act) + sum(saved) + n * vocab * FP32
    if s.head_act != FP32:  # under mixed precision the projection's half-precision output, cast to fp32
        forward += n * vocab * s.head_act
    if soft:
        forward += n * vocab * (s.target_act + FP32)
    backward = max(sum(saved[: j + 1]) + 2 * n * vocab * FP32 + sum(grads[j + 1 :]) for j in range(k_heads))
    what = f"{k_heads} heads x {s.batch} rows x {s.length} tokens x {vocab:,} fp32 logits"
    return max(forward, backward), what


def eagle3_activations(cfg, head, s: Shapes, grads: int) -> tuple[int, str]:
    """EAGLE-3's step: the target's logits and its draft-vocabulary columns, the three captured layers,
    and for each of ttt_steps unrolled steps the draft layer's activations and its fp32 logits over the
    draft vocabulary (with the target's distribution over it unless teacher_temperature is 0); the whole
    layer's gradients are written by the last step's backward."""
    settings, config = cfg.settings, head.config
    steps, draft_vocab, hidden = settings.ttt_steps, config.draft_vocab_size, config.hidden_size
    kept = 1 if settings.teacher_temperature == 0 else 2
    layer = [layer_activations(config.layer_config, s, i, steps) for i in range(steps)]
    loss = [s.positions(2 + i) * (draft_vocab * FP32 * kept + 3 * hidden * FP32) for i in range(steps)]
    captured = s.states(3 * hidden, s.target_act + (FP32 if s.target_act != FP32 else 0))
    fused_input = s.states(3 * hidden, s.head_act)
    n = s.positions(2)
    target_side = s.states(s.vocab + draft_vocab, s.target_act)
    # the last step's logits, the target's rows over the draft vocabulary, and the product summed into the loss
    last = n * draft_vocab * (2 * FP32 + s.target_act)
    forward = target_side + captured + fused_input + sum(layer) + sum(loss) + last
    backward = fused_input + sum(layer) + sum(loss[:-1]) + grads + 2 * n * draft_vocab * FP32
    what = f"{steps} steps x {s.batch} rows x {s.length} tokens x {draft_vocab:,} fp32 logits"
    return max(forward, backward), what


def eagle_activations(cfg, head, s: Shapes, grads: int) -> tuple[int, str]:
    """EAGLE-1/2's step: the target's logits, the draft layer's activations, and fp32 logits over the whole
    vocabulary through the target's lm_head, with the target's distribution."""
    config = head.config
    vocab, hidden = config.vocab_size, config.hidden_size
    n = s.positions(2)
    layer = layer_activations(config.layer_config, s, 0) + s.states(3 * hidden, s.head_act)
    loss = n * vocab * (2 * FP32 + s.target_act)
    forward = s.states(vocab + 2 * hidden, s.target_act) + layer + loss + 2 * n * vocab * FP32
    backward = layer + loss + grads + 2 * n * vocab * FP32
    return max(forward, backward), f"1 step x {s.batch} rows x {s.length} tokens x {vocab:,} fp32 logits"


def target_activations(target, s: Shapes) -> int:
    """Medusa-2's target runs with gradients (its adapters train): every decoder layer's activations."""
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    layer_config = {
        "hidden_size": config.hidden_size,
        "num_attention_heads": getattr(config, "num_attention_heads", 1),
        "num_key_value_heads": getattr(config, "num_key_value_heads", None),
        "head_dim": getattr(config, "head_dim", None),
        "intermediate_size": getattr(config, "intermediate_size", None),
    }
    per_layer = layer_activations(layer_config, dataclasses.replace(s, head_act=s.target_act), 0)
    per_layer -= s.batch * s.length * s.length * FP32  # its causal mask is built once, not a layer
    return target.num_layers * per_layer + s.states(s.vocab, s.target_act + 2 * FP32)


# -- the estimate --------------------------------------------------------------------------------------


def estimate_memory(
    cfg: TrainConfig,
    method: Method,
    target_config,
    *,
    processes: int = 1,
    zero_stage: int = 0,
    device_type: str = "cpu",
    trust_remote_code: bool = False,
    target=None,
) -> MemoryEstimate:
    """The peak one process of a run of `cfg` holds, from the recipe and the target's HF config alone
    (module docstring). `processes` and `zero_stage` (0: no DeepSpeed) say how ZeRO splits what it splits;
    `device_type` picks the optimizer step's temporaries (a CUDA AdamW step works on all tensors at once).
    `target`: `meta_target(target_config)`, when built already."""
    target = target if target is not None else meta_target(target_config, trust_remote_code)
    heads = meta_heads(cfg, method, target)
    nbytes, dtype_name = dtype_bytes_of(cfg.target_dtype, target_config)
    target_count, weights = target_bytes(cfg, target, nbytes)
    if zero_stage == 3:
        weights //= processes
    params = [(n, p) for n, p in heads.named_parameters() if p.requires_grad]
    lora = lora_parameters(cfg.settings, target) if method.runs_target else 0
    trainable = sum(p.numel() for _, p in params) + lora
    param_bytes = trainable * FP32
    if cfg.optimizer == "muon":
        state_values = sum(p.numel() * (1 if is_hidden_matrix(n, p) else 2) for n, p in params) + 2 * lora
    else:
        state_values = 2 * trainable
    state = state_values * FP32
    grads = param_bytes
    if zero_stage >= 1:
        state //= processes
    if zero_stage >= 2:
        grads //= processes
    if zero_stage >= 3:
        param_bytes //= processes
    largest = max((p.numel() for _, p in params), default=0) * FP32
    # AdamW on CUDA runs foreach: a temporary the size of all its state's square roots; on the CPU one
    # tensor at a time (its square root and the step divided by it)
    step_temp = grads if device_type == "cuda" else 2 * largest

    mixed = cfg.mixed_precision != "no"
    shapes = Shapes(
        batch=cfg.batch_size,
        length=cfg.max_length,
        hidden=target.hidden_size,
        vocab=target.vocab_size,
        target_act=2 if mixed else nbytes,
        head_act=2 if mixed else FP32,
    )
    kind = getattr(heads, "method", "")
    if kind == "medusa":
        per_head = [
            sum(p.numel() for n, p in params if n.startswith((f"blocks.{k}.", f"lm_heads.{k}."))) * FP32
            for k in range(heads.config.num_heads)
        ]
        activations, what = medusa_activations(cfg, heads, shapes, per_head)
    elif kind == "eagle3":
        activations, what = eagle3_activations(cfg, heads, shapes, grads)
    elif kind == "eagle":
        activations, what = eagle_activations(cfg, heads, shapes, grads)
    else:  # a method this estimate does not know: one fp32 loss over the vocabulary, kept for backward
        n = shapes.positions(1)
        activations = shapes.states(shapes.vocab, shapes.target_act) + 3 * n * shapes.vocab * FP32 + grads
        what = f"a guess for method {method.name!r}: one loss over {shapes.vocab:,} logits"
    if method.runs_target:
        activations += target_activations(target, shapes)
        what += ", the target's layers with gradients"
    if mixed:  # autocast keeps a half-precision copy of each weight it casts until the step's forward ends
        activations += trainable * 2
    accumulated = grads if cfg.grad_accum > 1 else 0  # earlier micro-steps' gradients stay
    dynamic = max(activations + accumulated, grads + step_temp)
    return MemoryEstimate(
        target_weights=weights,
        head_parameters=param_bytes,
        gradients=grads,
        optimizer_state=state,
        activations=activations,
        peak=weights + param_bytes + state + dynamic,
        target_parameters=target_count,
        trainable_parameters=trainable,
        target_dtype=dtype_name,
        optimizer=f"{cfg.optimizer}, {state_values / max(trainable, 1):.2g} fp32 values a parameter",
        what=what,
    )


# -- what shrinks it -----------------------------------------------------------------------------------


def shrinking_keys(cfg: TrainConfig, method: Method, estimate: MemoryEstimate, estimate_with) -> list[str]:
    """The recipe keys that shrink the estimate, each with the change and what it saves, largest first.
    `estimate_with(cfg)` estimates another recipe."""
    section = cfg.settings
    changes: list[tuple[str, dict, dict]] = []  # (key=value as typed, common keys, section keys)
    if getattr(section, "share_lm_head", True) is False:
        changes.append((f"{cfg.method}.share_lm_head=true", {}, {"share_lm_head": True}))
    for key in ("num_heads", "draft_vocab_size", "ttt_steps"):
        value = getattr(section, key, None)
        if isinstance(value, int) and value > 1:
            changes.append((f"{cfg.method}.{key}={value // 2}", {}, {key: value // 2}))
    if cfg.batch_size > 1:
        changes.append(
            (
                f"batch_size={cfg.batch_size // 2} grad_accum={cfg.grad_accum * 2}",
                {"batch_size": cfg.batch_size // 2, "grad_accum": cfg.grad_accum * 2},
                {},
            )
        )
    if cfg.max_length > 1:
        changes.append((f"max_length={cfg.max_length // 2}", {"max_length": cfg.max_length // 2}, {}))
    if (
        estimate.target_weights
        and dtype_bytes_of(cfg.target_dtype, None)[0] == FP32
        and cfg.target_dtype != "auto"
    ):
        changes.append(
            (
                "target_dtype=bfloat16 mixed_precision=bf16",
                {"target_dtype": "bfloat16", "mixed_precision": "bf16"},
                {},
            )
        )
    if cfg.mode == "online" and not method.runs_target and not method.online_only:
        changes.append(
            (
                "mode=offline with a cache_dir written by `specheads cache`",
                {"mode": "offline", "cache_dir": "x"},
                {},
            )
        )
    found = []
    for text, common, own in changes:
        try:
            other = dataclasses.replace(cfg, **common)
            if own:
                other.settings = dataclasses.replace(section, **own)
            saved = estimate.peak - estimate_with(other).peak
        except (ValueError, TypeError):
            continue
        if saved > 0:
            found.append((saved, f"{text} (saves {human(saved)})"))
    return [text for _, text in sorted(found, key=lambda item: -item[0])]


# -- the check before a run ----------------------------------------------------------------------------


def available_memory(device: torch.device) -> int | None:
    """Bytes free for this process on `device`: a CUDA device's free memory, on the CPU the machine's
    MemAvailable (Linux); None where it cannot tell."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
        except (OSError, ValueError, IndexError):
            return None
    return None


def check_memory(
    cfg: TrainConfig,
    method: Method,
    target_path: str,
    accelerator,
    force: bool = False,
    announce: bool = True,
) -> MemoryEstimate | None:
    """Estimate the run's peak a process, print it (the main process), and refuse a run that cannot fit:
    MemoryEstimateError naming the keys that shrink it, unless `force`. None where the target's config
    cannot be read here (loading the target then says why)."""
    trust = cfg.trust_remote_code
    device = torch.device(accelerator.device)
    processes, stage = accelerator.num_processes, zero_stage(accelerator)
    try:
        config = read_target_config(target_path, trust)
    except (OSError, ValueError):
        return None  # loading the target names what is wrong with it
    try:
        target = meta_target(config, trust)

        def estimate_with(recipe: TrainConfig) -> MemoryEstimate:
            return estimate_memory(
                recipe,
                method,
                config,
                processes=processes,
                zero_stage=stage,
                device_type=device.type,
                trust_remote_code=trust,
                target=target,
            )

        estimate = estimate_with(cfg)
    except Exception as e:  # noqa: BLE001 - an estimate that fails must not stop a run that may fit
        if accelerator.is_main_process:
            print(
                f"no memory estimate for this run ({type(e).__name__}: {e}); training without one",
                file=sys.stderr,
            )
        return None
    available = available_memory(device)
    # processes on one machine share its memory on the CPU
    sharing = int(os.environ.get("LOCAL_WORLD_SIZE", processes)) if device.type == "cpu" else 1
    if announce and accelerator.is_main_process:
        print(estimate.table(str(device), available), flush=True)
    if available is None or estimate.peak * sharing <= available or force:
        return estimate
    keys = shrinking_keys(cfg, method, estimate, estimate_with)
    who = f"{sharing} processes x " if sharing > 1 else ""
    raise MemoryEstimateError(
        f"this run needs about {who}{human(estimate.peak)} at its peak (estimated from the recipe and "
        f"the target's config) and {device} has {human(available)} available; shrink it with "
        + "; ".join(keys or ["batch_size", "max_length"])
        + "; or pass --force to try anyway"
    )
