"""Medusa-2: Medusa heads trained together with LoRA adapters on the target (train/medusa2.py).

The adapted target runs inside the objective (`Medusa2WithLoss`), so its states cannot come from a
cache and ZeRO-3 shards it with the heads; the heads' loss weight λ0 follows its warm-up; the adapter is
written beside the heads (`adapter/`). Its checkpoints hold Medusa heads and decode as Medusa's, on the
target with the adapter merged in.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from specheads.heads.checkpoint import ADAPTER_DIR
from specheads.methods.medusa import MEDUSA, RECIPE_KEYS
from specheads.train.medusa2 import (
    LAMBDA0_SCHEDULES,
    Medusa2WithLoss,
    gathered_adapter,
    lambda0,
    param_groups,
    register_adapter_state_hooks,
    save_adapter,
    wrap_target_with_lora,
)


def objective(cfg, target, heads) -> tuple[Medusa2WithLoss, torch.optim.Optimizer, object]:
    """LoRA adapters on the target, trained with the heads inside Medusa2WithLoss at their own rate."""
    target = wrap_target_with_lora(
        target,
        r=cfg.lora_r,
        alpha=cfg.lora_alpha,
        dropout=cfg.lora_dropout,
        target_modules=cfg.lora_target_modules,
    )
    model = Medusa2WithLoss(heads, target, decay=cfg.decay, topk=cfg.topk, labels=cfg.labels)
    groups = param_groups(heads, target, cfg.lr, cfg.lr_adapter, cfg.weight_decay)
    return model, torch.optim.AdamW(groups, betas=cfg.adam_betas), target


def heads_weight(cfg, step: int) -> float:
    """λ0 at optimizer step `step` (1-based)."""
    return lambda0(
        step - 1, cfg.max_steps, peak=cfg.lambda0, schedule=cfg.lambda0_schedule, warmup=cfg.lambda0_warmup
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
    """The adapter's and λ0's keys (the heads' are Medusa's)."""
    return [
        (
            cfg.lambda0_schedule in LAMBDA0_SCHEDULES,
            f"lambda0_schedule must be one of {LAMBDA0_SCHEDULES}, got {cfg.lambda0_schedule!r}",
        ),
        (0 < cfg.lambda0_warmup <= 1, f"lambda0_warmup must be in (0, 1], got {cfg.lambda0_warmup}"),
        (0 <= cfg.lora_dropout < 1, f"lora_dropout must be in [0, 1), got {cfg.lora_dropout}"),
        (bool(cfg.lora_target_modules), "lora_target_modules must name at least one linear layer"),
        (cfg.lora_r >= 1, f"lora_r must be >= 1, got {cfg.lora_r}"),
    ]


MEDUSA2 = replace(
    MEDUSA,
    name="medusa2",
    loss=None,  # Medusa2WithLoss computes it, target forward included
    metric_shape=lambda cfg: (4, cfg.num_heads + 1),  # one more column: the target's KL
    summarise=lambda cfg, sums: Medusa2WithLoss.summarise(sums, cfg.decay, cfg.topk),
    recipe_keys=(
        *RECIPE_KEYS,
        "lora_r",
        "lora_alpha",
        "lora_dropout",
        "lora_target_modules",
        "lr_adapter",
        "lambda0",
        "lambda0_schedule",
        "lambda0_warmup",
    ),
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
