"""Medusa-2: Medusa heads trained together with LoRA adapters on the target (train/medusa2.py).

The adapted target runs inside the objective (`Medusa2WithLoss`), so its states cannot come from a
cache and ZeRO-3 shards it with the heads; the heads' loss weight λ0 follows its warm-up; the adapter is
written beside the heads (`adapter/`). Its checkpoints hold Medusa heads and decode as Medusa's, on the
target with the adapter merged in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specheads.heads.checkpoint import ADAPTER_DIR
from specheads.heads.method import at_least, one_of
from specheads.methods.medusa import MEDUSA, MedusaSettings
from specheads.methods.medusa import check_recipe as check_medusa_recipe
from specheads.train.config import recipe_key
from specheads.train.medusa2 import (
    LAMBDA0_SCHEDULES,
    LORA_TARGET_MODULES,
    Medusa2WithLoss,
    gathered_adapter,
    lambda0,
    param_groups,
    register_adapter_state_hooks,
    save_adapter,
    wrap_target_with_lora,
)


@dataclass
class Medusa2Settings(MedusaSettings):
    """Medusa-2's recipe keys, the recipe's `medusa2:` section: Medusa's heads, the LoRA adapters and the
    heads' loss weight λ0."""

    lora_r: int = recipe_key(32, "the adapters' rank")
    lora_alpha: float = recipe_key(
        16.0, "the adapters' scale: their update is multiplied by lora_alpha / lora_r"
    )
    lora_dropout: float = recipe_key(0.0, "dropout on the adapters' input")
    lora_target_modules: list[str] = recipe_key(
        factory=lambda: list(LORA_TARGET_MODULES),
        help="the last component of the adapted linear layers' names",
    )
    lr_adapter: float = recipe_key(1e-4, "the adapters' learning rate (the heads take lr)")
    lambda0: float = recipe_key(
        0.2, "the heads' loss weight at the end of its warm-up (L = KL + λ0 · L_heads)"
    )
    lambda0_schedule: str = recipe_key("sine", 'the λ0 warm-up: "sine", "linear" or "constant"')
    lambda0_warmup: float = recipe_key(1.0, "fraction of max_steps the λ0 warm-up lasts")


def objective(cfg, target, heads) -> tuple[Medusa2WithLoss, torch.optim.Optimizer, object]:
    """LoRA adapters on the target, trained with the heads inside Medusa2WithLoss at their own rate."""
    s = cfg.settings
    target = wrap_target_with_lora(
        target, r=s.lora_r, alpha=s.lora_alpha, dropout=s.lora_dropout, target_modules=s.lora_target_modules
    )
    model = Medusa2WithLoss(heads, target, decay=s.decay, topk=cfg.topk, labels=s.labels)
    groups = param_groups(heads, target, cfg.lr, s.lr_adapter, cfg.weight_decay)
    return model, torch.optim.AdamW(groups, betas=cfg.adam_betas), target


def heads_weight(cfg, step: int) -> float:
    """λ0 at optimizer step `step` (1-based)."""
    s = cfg.settings
    return lambda0(
        step - 1, cfg.max_steps, peak=s.lambda0, schedule=s.lambda0_schedule, warmup=s.lambda0_warmup
    )


def after_prepare(accelerator, target) -> dict:
    """Step checkpoints carry the adapter; the heads' record names it."""
    register_adapter_state_hooks(accelerator, target)
    return {"adapter": ADAPTER_DIR}  # a peft adapter beside the heads: the target they were trained on


def save_extra(accelerator, target, out_dir) -> None:
    """The adapter beside the final heads (before them: their config.json is written last)."""
    with gathered_adapter(target):
        if accelerator.is_main_process:
            save_adapter(target, out_dir)


def check_recipe(cfg) -> list[tuple[bool, str]]:
    """Medusa's heads' keys, then the adapter's and λ0's."""
    s = cfg.settings
    return [
        *check_medusa_recipe(cfg),
        one_of("medusa2", s, "lambda0_schedule", LAMBDA0_SCHEDULES),
        (0 < s.lambda0_warmup <= 1, f"medusa2.lambda0_warmup must be in (0, 1], got {s.lambda0_warmup}"),
        (0 <= s.lora_dropout < 1, f"medusa2.lora_dropout must be in [0, 1), got {s.lora_dropout}"),
        (bool(s.lora_target_modules), "medusa2.lora_target_modules must name at least one linear layer"),
        at_least("medusa2", s, "lora_r", 1),
        (s.lr_adapter > 0, f"medusa2.lr_adapter must be > 0, got {s.lr_adapter}"),
    ]


MEDUSA2 = replace(
    MEDUSA,
    name="medusa2",
    loss=None,  # Medusa2WithLoss computes it, target forward included
    metric_shape=lambda cfg: (4, cfg.settings.num_heads + 1),  # one more column: the target's KL
    summarise=lambda cfg, sums: Medusa2WithLoss.summarise(sums, cfg.settings.decay, cfg.topk),
    settings_class=Medusa2Settings,
    check_recipe=check_recipe,
    online_only="trains LoRA adapters that change the target's hidden states",
    objective=objective,
    runs_target=True,
    heads_weight=heads_weight,
    log_extras=lambda cfg, step, lrs: {"lr_adapter": lrs[-1], "lambda0": heads_weight(cfg, step)},
    after_prepare=after_prepare,
    save_extra=save_extra,
    drafter=None,  # its heads are MedusaHeads, saved as "medusa": they decode through Medusa's entry
    calibrate=None,
    export_formats=(),
)
