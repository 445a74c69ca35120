"""Medusa-1: K offset heads on the target's last hidden state; head k guesses the token k + 2 ahead.

Static trees of the heads' top-k guesses decode them; `--tree auto` sizes a tree from the heads' rank
accuracies along greedy continuations.
"""

from __future__ import annotations

from specheads.decode.calibrate import calibrate_medusa
from specheads.decode.drafter_factory import medusa_drafter_for, static_tree_only
from specheads.heads import MedusaConfig, MedusaHeads
from specheads.heads.method import Method
from specheads.train.losses import HeadMetrics, medusa_loss


def build_heads(cfg, target, label_counts=None) -> tuple[MedusaHeads, dict]:
    """`cfg.num_heads` heads of `cfg.num_layers` residual blocks each, their lm_heads copied from the
    target's (or one lm_head shared with it)."""
    heads = MedusaHeads(
        MedusaConfig(
            hidden_size=target.hidden_size,
            vocab_size=target.vocab_size,
            num_heads=cfg.num_heads,
            num_layers=cfg.num_layers,
            share_lm_head=cfg.share_lm_head,
        )
    )
    if not cfg.share_lm_head:
        heads.init_lm_heads_from(target.lm_head)
    return heads.to(target.device), {}


def loss(objective, batch: dict, out, target):
    """The heads' weighted cross-entropy on the last hidden state (train/losses.py)."""
    heads = objective.heads
    hidden = out.hidden[target.num_layers]  # (B, T, H), after the final norm
    value, metrics = medusa_loss(
        heads,
        hidden,
        batch["input_ids"],
        batch["loss_mask"],
        batch["position_ids"],
        decay=objective.decay,
        topk=objective.topk,
        target_logits=out.logits if objective.labels != "data" else None,
        target_top1=objective.labels == "target-top1",
        lm_head=target.lm_head,
    )
    # Heads whose offset passes the batch's length get no loss; DDP needs every parameter in the graph,
    # so run them on no positions (a zero with zero gradients).
    for k in range(max(0, hidden.shape[1] - 2), heads.num_heads):
        value = value + heads.head(k, hidden[:0, 0], target.lm_head).sum()
    return value, metrics


RECIPE_KEYS = ("num_heads", "num_layers", "share_lm_head", "labels", "decay")
LABELS = ("data", "target", "target-top1")  # the text's tokens, the target's distribution, its top token


def check_recipe(cfg) -> list[tuple[bool, str]]:
    return [
        (cfg.labels in LABELS, f"labels must be one of {', '.join(LABELS)}, got {cfg.labels!r}"),
        (cfg.num_heads >= 1, f"num_heads must be >= 1, got {cfg.num_heads}"),
        (cfg.num_layers >= 1, f"num_layers must be >= 1, got {cfg.num_layers}"),
    ]


def last_layer(num_layers: int, chosen=()) -> tuple[int, ...]:
    """The target's last hidden state, after the final norm (its lm_head gives the logits)."""
    return (num_layers,)


MEDUSA = Method(
    name="medusa",
    head_class=MedusaHeads,
    config_class=MedusaConfig,
    build_heads=build_heads,
    target_layers=last_layer,
    capture=lambda heads: (-1,),
    loss=loss,
    needs_logits=lambda cfg: cfg.labels != "data",
    metric_shape=lambda cfg: (4, cfg.num_heads),
    summarise=lambda cfg, sums: HeadMetrics.summarise(sums, cfg.decay, cfg.topk),
    metric_unit="head",
    recipe_keys=RECIPE_KEYS,
    check_recipe=check_recipe,
    drafter=medusa_drafter_for,
    draft_vocab="",
    calibrate=calibrate_medusa,
    max_tree_depth=lambda heads, settings: heads.num_heads,
    check_tree=static_tree_only,
    export_formats=("medusa", "vllm-medusa"),
)

__all__ = ["MEDUSA", "RECIPE_KEYS", "build_heads", "check_recipe", "last_layer", "loss"]
