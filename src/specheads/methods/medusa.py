"""Medusa-1: K offset heads on the target's last hidden state; head k guesses the token k + 2 ahead.

Static trees of the heads' top-k guesses decode them; `--tree auto` sizes a tree from the heads' rank
accuracies along greedy continuations.
"""

from __future__ import annotations

from dataclasses import dataclass

from specheads.decode.calibrate import calibrate_medusa
from specheads.decode.drafter_factory import medusa_drafter_for, static_tree_only
from specheads.heads import MedusaConfig, MedusaHeads
from specheads.heads.method import Method, at_least
from specheads.train.config import recipe_key
from specheads.train.losses import HeadMetrics, medusa_loss

LABELS = ("data", "target", "target-top1")  # the text's tokens, the target's distribution, its top token


@dataclass
class MedusaSettings:
    """Medusa's recipe keys: the recipe's `medusa:` section (train/config.py)."""

    num_heads: int = recipe_key(4, "heads; head k guesses the token k + 2 ahead")
    num_layers: int = recipe_key(1, "residual blocks a head")
    share_lm_head: bool = recipe_key(False, "the heads share the target's lm_head instead of a copy each")
    labels: str = recipe_key(
        "data",
        '"data": the text\'s tokens; "target": the target\'s distribution; "target-top1": its top token',
    )
    decay: float = recipe_key(0.8, "the loss weight of head k is decay**k")


def build_heads(cfg, target, label_counts=None) -> tuple[MedusaHeads, dict]:
    """`num_heads` heads of `num_layers` residual blocks each (the recipe's section), their lm_heads copied
    from the target's (or one lm_head shared with it)."""
    settings = cfg.settings
    heads = MedusaHeads(
        MedusaConfig(
            hidden_size=target.hidden_size,
            vocab_size=target.vocab_size,
            num_heads=settings.num_heads,
            num_layers=settings.num_layers,
            share_lm_head=settings.share_lm_head,
        )
    )
    if not settings.share_lm_head:
        heads.init_lm_heads_from(target.lm_head)
    return heads.to(target.device), {}


def loss(objective, batch: dict, out, target):
    """The heads' weighted cross-entropy on the last hidden state (train/losses.py)."""
    heads, settings = objective.heads, objective.settings
    hidden = out.hidden[target.num_layers]  # (B, T, H), after the final norm
    value, metrics = medusa_loss(
        heads,
        hidden,
        batch["input_ids"],
        batch["loss_mask"],
        batch["position_ids"],
        decay=settings.decay,
        topk=objective.topk,
        target_logits=out.logits if settings.labels != "data" else None,
        target_top1=settings.labels == "target-top1",
        lm_head=target.lm_head,
    )
    # Heads whose offset passes the batch's length get no loss; DDP needs every parameter in the graph,
    # so run them on no positions (a zero with zero gradients).
    for k in range(max(0, hidden.shape[1] - 2), heads.num_heads):
        value = value + heads.head(k, hidden[:0, 0], target.lm_head).sum()
    return value, metrics


def check_recipe(cfg) -> list[tuple[bool, str]]:
    """The section's values (medusa2's too: its section holds Medusa's keys)."""
    s, m = cfg.settings, cfg.method
    return [
        (s.labels in LABELS, f"{m}.labels must be one of {', '.join(LABELS)}, got {s.labels!r}"),
        at_least(m, s, "num_heads", 1),
        at_least(m, s, "num_layers", 1),
    ]


def last_layer(num_layers: int, chosen=()) -> tuple[int, ...]:
    """The target's last hidden state, after the final norm (its lm_head gives the logits)."""
    return (num_layers,)


MEDUSA = Method(
    name="medusa",
    head_class=MedusaHeads,
    build_heads=build_heads,
    target_layers=last_layer,
    loss=loss,
    needs_logits=lambda cfg: cfg.settings.labels != "data",
    metric_shape=lambda cfg: (4, cfg.settings.num_heads),
    summarise=lambda cfg, sums: HeadMetrics.summarise(sums, cfg.settings.decay, cfg.topk),
    metric_unit="head",
    settings_class=MedusaSettings,
    check_recipe=check_recipe,
    drafter=medusa_drafter_for,
    draft_vocab="",
    calibrate=calibrate_medusa,
    max_tree_depth=lambda heads, settings: heads.num_heads,
    check_tree=static_tree_only,
    export_formats=("medusa", "vllm-medusa"),
)

__all__ = ["MEDUSA", "MedusaSettings", "build_heads", "check_recipe", "last_layer", "loss"]
