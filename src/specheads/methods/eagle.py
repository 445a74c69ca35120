"""EAGLE-1/2: one decoder layer that predicts the target's next feature from (feature, next token).

Decoded over EAGLE-1 static trees of its own top-k ranks, or EAGLE-2 dynamic trees grown by its scores;
`--tree auto` sizes the dynamic tree from the full top-k tree recorded along greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

from specheads.decode.calibrate_dynamic import calibrate_eagle
from specheads.decode.drafter_factory import eagle_drafter_for
from specheads.heads import DRAFT_ARCHS, EagleConfig, EagleHead, draft_layer_config
from specheads.heads.method import Method, at_least, one_of
from specheads.methods.medusa import last_layer
from specheads.train.config import recipe_key
from specheads.train.eagle_losses import DraftMetrics, eagle_loss


@dataclass
class EagleSettings:
    """EAGLE-1/2's recipe keys, the recipe's `eagle:` section (its labels are always the target's features
    and distributions)."""

    w_feat: float = recipe_key(1.0, "weight of the feature loss, SmoothL1(f̂_{t+1}, f_{t+1})")
    w_tok: float = recipe_key(0.1, "weight of the token loss, soft cross-entropy against the target")
    noise: float = recipe_key(0.1, "training adds U(-noise, noise) to the input features")
    fc_bias: bool = recipe_key(True, "the layer's input projection has a bias")
    draft_arch: str = recipe_key(
        "llama", "the draft layer: llama (the engines', sized from any target) or target (its own family)"
    )


def build_heads(cfg, target, label_counts=None) -> tuple[EagleHead, dict]:
    """One EAGLE layer shaped like the target's decoder layers: a Llama layer, or one of the target's own
    family (eagle.draft_arch)."""
    settings = cfg.settings
    layer_config = draft_layer_config(target.config, settings.draft_arch)
    head = EagleHead(EagleConfig(layer_config, draft_arch=settings.draft_arch, fc_bias=settings.fc_bias))
    return head.to(target.device), {}


def loss(objective, batch: dict, out, target):
    """Feature regression plus the token loss against the target's distribution (train/eagle_losses.py)."""
    return eagle_loss(
        objective.heads,
        out.hidden[target.num_layers],  # f_t, after the final norm
        batch["input_ids"],
        batch["loss_mask"],
        batch["position_ids"],
        out.logits,
        target.embed_tokens,
        target.lm_head,
        attention_mask=batch["attention_mask"],
        w_feat=objective.settings.w_feat,
        w_tok=objective.settings.w_tok,
        noise=objective.settings.noise,
        topk=objective.topk,
    )


EAGLE = Method(
    name="eagle",
    head_class=EagleHead,
    build_heads=build_heads,
    target_layers=last_layer,
    loss=loss,
    metric_shape=lambda cfg: (DraftMetrics.ROWS, 1),
    summarise=lambda cfg, sums: DraftMetrics.summarise(
        sums, [cfg.settings.w_tok], cfg.topk, w_feat=cfg.settings.w_feat
    ),
    settings_class=EagleSettings,
    check_recipe=lambda cfg: [
        at_least("eagle", cfg.settings, "noise", 0),
        one_of("eagle", cfg.settings, "draft_arch", DRAFT_ARCHS),
    ],
    drafter=eagle_drafter_for,
    draft_vocab="",
    calibrate=calibrate_eagle,
    default_tree="auto",  # calibrated (kept per machine) where the run can: it won in every run measured
    export_formats=("eagle",),
    refused_formats={
        "speculators": "vLLM's speculators loader supports speculators_model_type 'eagle3' only "
        "(vllm/transformers_utils/configs/speculators/algos.py); export EAGLE-1/2 heads with --format eagle"
    },
)
