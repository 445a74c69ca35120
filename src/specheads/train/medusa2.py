"""Medusa-2: Medusa heads trained jointly with LoRA adapters on the target (Cai et al., 2024, "Medusa:
Simple LLM Inference Acceleration Framework with Multiple Decoding Heads", §2.2.2 and §2.3.2).

Medusa-1 freezes the target; Medusa-2 lets low-rank adapters move its last hidden state so that the
heads can read the future from it more easily, while a distillation loss keeps the target's own
next-token distribution where it was (the adapted target is what verifies the drafts):

    L = L_target + λ0(step) · L_heads
    L_target = mean_t KL( p_orig(· | x_≤t) || p_adapted(· | x_≤t) )   over t whose next token is a label
    L_heads  = sum_k decay^k · CE_k                                        (train/losses.py, medusa_loss)

p_orig is the same model with its adapters disabled (peft `disable_adapter()`), run under no_grad: the
target's ORIGINAL distribution is the teacher (the paper's self-distillation; the reference's
`medusa_self_distillation`). With labels="target" the heads learn p_orig too.

λ0 warm-up. Fresh heads have a large loss whose gradients would pull the adapters off at the start,
so their weight is warmed up (paper: "heads warmup"; the authors' trainer: `medusa_scheduler` sine /
linear / constant / sine_<w>, peak `medusa_heads_coefficient` 0.2, step / max_steps as progress):

    r = min(1, step / (warmup · max_steps))
    sine: λ0 = peak · sin(π/2 · r)      linear: λ0 = peak · r      constant: λ0 = peak

Separate learning rates (paper: "differential learning rates"; reference `medusa_lr_multiplier`): the
heads learn from scratch and take a larger rate than the adapters. Only heads and adapter weights
are trainable; the base weights stay bit-identical.

Export: `save_adapter` writes a standard peft adapter (adapter_config.json + adapter_model.safetensors)
into `adapter/` beside the heads; `PeftModel.from_pretrained(base, DIR/adapter)` restores the adapted
target, and `FrozenTarget.with_adapter(DIR/adapter)` folds it into the weights for decoding
(`specheads eval` and `compare` do so for heads that carry one: heads.checkpoint.target_for_heads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from specheads.core.atomic import replace_dir
from specheads.core.target import FrozenTarget
from specheads.data.packing import shift_loss_mask
from specheads.heads.checkpoint import ADAPTER_DIR
from specheads.train.losses import HeadMetrics, medusa_loss

# The attention and MLP projections of Llama / Qwen / Mistral style decoders.
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LAMBDA0_SCHEDULES = ("sine", "linear", "constant")


def lambda0(
    step: int, max_steps: int, *, peak: float = 0.2, schedule: str = "sine", warmup: float = 1.0
) -> float:
    """λ0, the heads' loss weight, after `step` optimizer steps of `max_steps` (module docstring).

    Args:
        step: optimizer steps already taken (0 at the first step).
        peak: the weight reached at the end of the warm-up (reference default 0.2).
        schedule: "sine", "linear" or "constant".
        warmup: fraction of max_steps the warm-up lasts (1.0: all of training, as the reference's "sine").
    """
    if schedule not in LAMBDA0_SCHEDULES:
        raise ValueError(f"unknown λ0 schedule {schedule!r}; expected one of {LAMBDA0_SCHEDULES}")
    if max_steps < 1 or not 0 < warmup <= 1:
        raise ValueError(f"need max_steps >= 1 and 0 < warmup <= 1, got {max_steps} and {warmup}")
    ramp = min(1.0, max(0, step) / (warmup * max_steps))
    if schedule == "sine":
        return peak * math.sin(math.pi / 2 * ramp)
    if schedule == "linear":
        return peak * ramp
    return peak


def _peft_model(target):
    """The peft model inside a wrapped FrozenTarget (or the peft model itself)."""
    model = target.model if isinstance(target, FrozenTarget) else target
    if not hasattr(model, "disable_adapter"):
        raise TypeError(
            f"{type(model).__name__} has no LoRA adapters: wrap the target with wrap_target_with_lora"
        )
    return model


def adapter_parameters(target) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of every LoRA weight of a wrapped target."""
    return [(n, p) for n, p in _peft_model(target).named_parameters() if ".lora_" in n]


def wrap_target_with_lora(
    target: FrozenTarget,
    *,
    r: int = 32,
    alpha: float = 16,
    dropout: float = 0.0,
    target_modules: Sequence[str] = LORA_TARGET_MODULES,
) -> FrozenTarget:
    """LoRA adapters on the target's projections; returns a FrozenTarget over the peft model.

    Base weights stay frozen; only the adapters are trainable (`FrozenTarget.forward(..., grad=True)`
    lets gradients reach them). The model is changed in place: use the returned target from here on.
    FrozenTarget keeps the model in eval mode, so `dropout` only matters to code that trains the peft
    model in train mode; the default is 0.

    Args:
        r, alpha: LoRA rank and scale (ΔW = alpha / r · B A, B zero-initialised: the adapted target
            starts equal to the original).
        target_modules: names of the linear layers to adapt (the last component of their name).
    """
    from peft import LoraConfig, get_peft_model  # lazy: peft is only needed for adapters (Medusa-2)

    linears = {n.rsplit(".", 1)[-1] for n, m in target.model.named_modules() if isinstance(m, nn.Linear)}
    missing = [m for m in target_modules if m not in linears]
    if missing or not target_modules:
        raise ValueError(
            f"LoRA target modules {missing or list(target_modules)} are not linear layers of "
            f"{type(target.model).__name__}; it has {sorted(linears)}"
        )
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=list(target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(target.model, config)
    model.peft_config["default"].base_model_name_or_path = str(target.name_or_path)
    wrapped = FrozenTarget(model, target.tokenizer, name_or_path=target.name_or_path)  # freezes everything
    for _, p in adapter_parameters(wrapped):
        p.requires_grad_(True)
    return wrapped


def param_groups(
    heads: nn.Module, target, lr_heads: float, lr_adapter: float, weight_decay: float = 0.0
) -> list[dict]:
    """Optimizer groups: the heads at lr_heads, the target's LoRA weights at lr_adapter; nothing else."""
    adapter = [p for _, p in adapter_parameters(target)]
    if not adapter:
        raise ValueError("the target has no LoRA weights: wrap it with wrap_target_with_lora first")
    return [
        {"name": "heads", "params": list(heads.parameters()), "lr": lr_heads, "weight_decay": weight_decay},
        {"name": "adapter", "params": adapter, "lr": lr_adapter, "weight_decay": weight_decay},
    ]


@torch.no_grad()
def teacher_logits(target: FrozenTarget, batch: dict) -> torch.Tensor:
    """(B, T, V) logits of the ORIGINAL target: the same model with its adapters disabled."""
    with _peft_model(target).disable_adapter():
        return target(
            batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits


def medusa2_loss(
    heads,
    target: FrozenTarget,
    batch: dict,
    *,
    lambda0: float,
    decay: float = 0.8,
    topk: int = 5,
    labels: str = "target",
) -> tuple[torch.Tensor, HeadMetrics, dict[str, float]]:
    """L_target + λ0 · L_heads for one batch (module docstring).

    Args:
        heads: MedusaHeads.
        target: a FrozenTarget wrapped by wrap_target_with_lora.
        batch: from `collate` (input_ids, loss_mask, position_ids, attention_mask).
        lambda0: the heads' weight this step (`lambda0()`).
        labels: "target" (heads learn the original target's distribution), "target-top1" (its top token)
            or "data" (the tokens).

    Returns:
        (loss, the heads' metrics, {"target_kl", "target_kl_positions", "heads_loss", "lambda0"} as floats).
    """
    teacher = teacher_logits(target, batch)  # (B, T, V), no grad
    out = target(
        batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        capture=(target.num_layers,),
        logits=True,
        grad=torch.is_grad_enabled(),  # gradients to the adapters, except under no_grad (evaluation)
    )
    b, t = shift_loss_mask(batch["loss_mask"], batch["position_ids"], 1).nonzero(as_tuple=True)
    kl = F.kl_div(
        out.logits[b, t].float().log_softmax(-1),  # adapted
        teacher[b, t].float().log_softmax(-1),  # original
        log_target=True,
        reduction="none",
    ).sum(-1)  # (N,) KL(p_orig || p_adapted) per position
    target_loss = kl.sum() / max(len(b), 1)
    heads_loss, metrics = medusa_loss(
        heads,
        out.hidden[target.num_layers],  # (B, T, H), the adapted target's, with gradients to the adapters
        batch["input_ids"],
        batch["loss_mask"],
        batch["position_ids"],
        decay=decay,
        topk=topk,
        target_logits=teacher if labels != "data" else None,
        target_top1=labels == "target-top1",
        lm_head=target.lm_head,
    )
    loss = target_loss + lambda0 * heads_loss
    # Heads whose offset passes the batch's length get no loss; DDP needs every trained parameter in
    # the graph, so run them on no positions (a zero with zero gradients).
    hidden = out.hidden[target.num_layers]
    for k in range(max(0, hidden.shape[1] - 2), heads.num_heads):
        loss = loss + heads.head(k, hidden[:0, 0], target.lm_head).sum()
    parts = {
        "target_kl": target_loss.item(),
        "target_kl_positions": float(len(b)),
        "heads_loss": heads_loss.item(),
        "lambda0": lambda0,
    }
    return loss, metrics, parts


class Medusa2WithLoss(nn.Module):
    """Heads and the adapted target as one module, for DDP / DeepSpeed to wrap (train/objective.py).

    Medusa-2 trains weights inside the target, so, unlike Medusa-1's HeadsWithLoss, the target's
    forward runs inside this module's forward, and the peft model is a submodule: its adapters reach
    the gradient all-reduce. Its base weights stay frozen (requires_grad False), so data-parallel
    wrappers and `param_groups` leave them alone, and its state dict holds only what trains (heads and
    adapters): a checkpoint (accelerate / DeepSpeed save_state) never copies the frozen base, and
    loading one does not ask for it.

    forward(batch, lambda0) -> (loss (), metrics (4, K + 1) float64 sums): columns 0..K-1 are the
    heads' (HeadMetrics.as_tensor()); column K holds the target's KL as (sum, 0, 0, positions), so
    batches and processes add up before `summarise` divides.
    """

    def __init__(self, heads: nn.Module, target: FrozenTarget, *, decay=0.8, topk=5, labels="target"):
        super().__init__()
        self.heads = heads
        self.target_model = _peft_model(target)  # registered: its adapters are this module's parameters
        self.target = target
        self.decay, self.topk, self.labels = decay, topk, labels
        self.register_state_dict_post_hook(_drop_frozen_base)
        self.register_load_state_dict_post_hook(_forgive_frozen_base)

    def forward(self, batch: dict, lambda0: float) -> tuple[torch.Tensor, torch.Tensor]:
        loss, metrics, parts = medusa2_loss(
            self.heads,
            self.target,
            batch,
            lambda0=lambda0,
            decay=self.decay,
            topk=self.topk,
            labels=self.labels,
        )
        n = parts["target_kl_positions"]
        heads = metrics.as_tensor()  # on the device, where the loop adds the sums up
        kl = torch.tensor([[parts["target_kl"] * n], [0.0], [0.0], [n]], dtype=torch.float64)
        return loss, torch.cat([heads, kl.to(heads.device)], dim=1)

    @staticmethod
    def summarise(sums: torch.Tensor, decay: float, topk: int) -> dict[str, float]:
        """(4, K + 1) summed metrics -> the heads' (HeadMetrics.summarise) plus the mean target KL."""
        out = HeadMetrics.summarise(sums[:, :-1], decay, topk)
        out["target_kl"] = float(sums[0, -1] / sums[3, -1].clamp_min(1))
        return out


def _is_frozen_base(key: str) -> bool:
    """A state-dict key of the target's own (frozen) weights, not of an adapter or a head."""
    return key.startswith("target_model.") and ".lora_" not in key


def _drop_frozen_base(module, state_dict, prefix, local_metadata) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and _is_frozen_base(k[len(prefix) :])]:
        del state_dict[key]


def _forgive_frozen_base(module, incompatible_keys) -> None:
    """load_state_dict post-hook: the frozen base is never saved, so its absence is expected."""
    missing = incompatible_keys.missing_keys  # full keys (under a wrapper: "module.target_model....")
    missing[:] = [k for k in missing if not ("target_model." in k and ".lora_" not in k)]


def save_adapter(target, heads_dir: str | Path) -> Path:
    """Write the target's adapter as a peft adapter into `heads_dir/adapter/` (replaced whole)."""
    model = _peft_model(target)
    out = Path(heads_dir) / ADAPTER_DIR
    with replace_dir(out) as tmp:
        # adapter_config.json + adapter_model.safetensors; the embeddings are never adapted
        model.save_pretrained(tmp, save_embedding_layers=False)
    return out


def load_adapter_weights(target, adapter_dir: str | Path) -> None:
    """Copy a saved adapter's weights (save_adapter) into the wrapped target's adapters, in place."""
    from peft import set_peft_model_state_dict  # lazy: peft is only needed for adapters (Medusa-2)

    path = Path(adapter_dir) / "adapter_model.safetensors"
    if not path.is_file():
        raise FileNotFoundError(
            f"{adapter_dir} holds no adapter (no {path.name}); was it written by save_adapter?"
        )
    result = set_peft_model_state_dict(_peft_model(target), load_file(str(path)))
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{adapter_dir} does not fit the target's adapters (missing {missing[:3]}, "
            f"unexpected {result.unexpected_keys[:3]}): other lora_r or lora_target_modules?"
        )


def gathered_adapter(target):
    """A context in which the adapter weights are whole, also under ZeRO-3 (every process enters it)."""
    params = [p for _, p in adapter_parameters(target)]
    if not any(hasattr(p, "ds_id") for p in params):
        return nullcontext()
    import deepspeed  # lazy: deepspeed is slow to import and only used under ZeRO

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def register_adapter_state_hooks(accelerator, target) -> None:
    """Step checkpoints carry the adapter as a peft adapter, `step-N/adapter/`, beside the heads, and
    none of the frozen base.

    accelerate's save_state hands its pre-hooks `step-N(tmp)/accelerate`, so the adapter lands inside
    the checkpoint before it is renamed into place (whole or not at all). On resume, DeepSpeed's engine
    restores heads and adapters from its own files; without it, the loop's hooks keep accelerate from
    loading model weights (train/checkpointing.py), and the adapter is read back here. The objective's
    state dict already leaves the base out, and train/checkpointing.py tells a DeepSpeed engine to
    leave out its own copy of the frozen weights and gathers the heads alone under ZeRO-3.
    """
    from accelerate.utils import DistributedType  # lazy: accelerate is only needed once a run starts

    def save(models, weights, output_dir) -> None:
        with gathered_adapter(target):
            if accelerator.is_main_process:
                save_adapter(target, Path(output_dir).parent)

    def load(models, input_dir) -> None:
        if accelerator.distributed_type not in (DistributedType.DEEPSPEED, DistributedType.FSDP):
            load_adapter_weights(target, Path(input_dir).parent / ADAPTER_DIR)

    accelerator.register_save_state_pre_hook(save)
    accelerator.register_load_state_pre_hook(load)
