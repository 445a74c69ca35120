"""EAGLE-3: a layer fed by three of the target's layers fused, trained with training-time test over a
draft vocabulary of the data's most frequent label tokens. Decoded like EAGLE (the same drafter)."""

from __future__ import annotations

from dataclasses import dataclass

from specheads.decode.calibrate_dynamic import calibrate_eagle
from specheads.decode.drafter_factory import eagle_drafter_for
from specheads.heads import (
    DRAFT_ARCHS,
    Eagle3Config,
    Eagle3Head,
    default_eagle3_layers,
    draft_layer_config,
    draft_vocab_from_counts,
)
from specheads.heads.eagle import with_rope_theta
from specheads.heads.method import Method, at_least, one_of
from specheads.train.config import recipe_key
from specheads.train.eagle_losses import OUT_OF_VOCAB, DraftMetrics, eagle3_loss

# draft_head_init: the draft's lm_head and norm drawn at random, or copied from the target
DRAFT_HEAD_INITS = ("random", "target")


@dataclass
class Eagle3Settings:
    """EAGLE-3's recipe keys, the recipe's `eagle3:` section (`old`: a key's top-level name before the
    sections, where it differs)."""

    layers: list[int] = recipe_key(
        factory=list,
        help="target layers fused (HF hidden_states indexing, ascending); empty: (2, L//2, L-3), "
        "(1, L//2, L-1) for L < 7",
        old="eagle3_layers",
    )
    draft_vocab_size: int = recipe_key(
        32000, "the draft vocabulary: the most frequent label tokens of the data; capped at the target's"
    )
    ttt_steps: int = recipe_key(7, "training-time-test steps")
    decay: float = recipe_key(0.8, "the loss weight of step k is decay**k")
    noise: float = recipe_key(
        0.0,
        "training adds U(-a, a) to each captured target layer (EAGLE-1's feature noise; the paper's: 0)",
        old="eagle3_noise",
    )
    teacher_temperature: float = recipe_key(
        1.0,
        "labels: softmax(target logits / T) over the draft vocabulary; 1: the target's distribution, "
        "0: its top token",
        old="eagle3_teacher_temperature",
    )
    out_of_vocab: str = recipe_key(
        "skip",
        'positions whose target token lies outside the draft vocabulary: "skip", or "train" against the '
        "target's distribution renormalised over the draft vocabulary",
        old="eagle3_out_of_vocab",
    )
    topk_loss: int = recipe_key(
        0,
        "HASS's top-K distillation: adds -sum of p log q over the target's K most likely draft tokens; 0: off",
        old="eagle3_topk_loss",
    )
    topk_loss_weight: float = recipe_key(1.0, "the weight of that term", old="eagle3_topk_loss_weight")
    draft_head_init: str = recipe_key(
        "random",
        'the draft\'s lm_head and final norm at the start: "random", or "target": the target\'s lm_head rows '
        "of the draft vocabulary and its final norm",
    )
    draft_rope_theta: float = recipe_key(
        0.0, "the draft layer's rope theta; 0: the target's (exports write the draft's)"
    )
    draft_arch: str = recipe_key(
        "llama", "the draft layer: llama (the engines', sized from any target) or target (its own family)"
    )


def build_heads(cfg, target, label_counts) -> tuple[Eagle3Head, dict]:
    """An EAGLE-3 head whose draft vocabulary is the most frequent label tokens: `label_counts` (V,), the
    training rows' (train/loop.py counts them once a run)."""
    settings = cfg.settings
    size = min(settings.draft_vocab_size, target.vocab_size)
    layer_config = draft_layer_config(
        target.config, settings.draft_arch
    )  # a Llama layer, or the target's family
    if settings.draft_rope_theta:
        layer_config = with_rope_theta(layer_config, settings.draft_rope_theta)
    config = Eagle3Config(
        layer_config,
        draft_arch=settings.draft_arch,
        draft_vocab_size=size,
        target_layers=tuple(target.layer_id(i) for i in settings.layers),
    )
    draft_vocab = draft_vocab_from_counts(label_counts, size)
    coverage = label_counts[draft_vocab].sum().item() / max(label_counts.sum().item(), 1)
    head = Eagle3Head(config).set_draft_vocab(draft_vocab)
    if settings.draft_head_init == "target":
        head.init_from_target(target.lm_head, target.norm)
    return head.to(target.device), {"draft_vocab_size": size, "draft_vocab_label_coverage": coverage}


def fused_and_last(num_layers: int, chosen=()) -> tuple[int, ...]:
    """The three fused layers ((2, L//2, L-3) unless chosen) and L, whose lm_head gives the logits."""
    fused = [i % (num_layers + 1) for i in chosen] or list(default_eagle3_layers(num_layers))
    return tuple(sorted({*fused, num_layers}))


def loss(objective, batch: dict, out, target):
    """Training-time test over `ttt_steps` steps, step k weighted decay**k (train/eagle_losses.py)."""
    settings = objective.settings
    return eagle3_loss(
        objective.heads,
        out.hidden,
        batch["input_ids"],
        batch["loss_mask"],
        batch["position_ids"],
        out.logits,
        target.embed_tokens,
        target_tokens=out.top_tokens,  # with the draft vocabulary's columns alone (held-out states kept)
        attention_mask=batch["attention_mask"],
        steps=settings.ttt_steps,
        decay=settings.decay,
        topk=objective.topk,
        noise=settings.noise,
        temperature=settings.teacher_temperature,
        out_of_vocab=settings.out_of_vocab,
        topk_loss=settings.topk_loss,
        topk_loss_weight=settings.topk_loss_weight,
    )


def ascending_or_mixed(layers: list[int]) -> bool:
    """Ids of one sign must ascend strictly; mixed signs (e.g. [2, 16, -3]) are checked against the
    target's depth when the head is built (Eagle3Config)."""
    if not (all(i >= 0 for i in layers) or all(i < 0 for i in layers)):
        return True
    return all(a < b for a, b in zip(layers, layers[1:]))


def check_recipe(cfg) -> list[tuple[bool, str]]:
    s = cfg.settings
    layers = s.layers
    return [
        (len(layers) in (0, 3), f"eagle3.layers takes 3 layer ids (low, mid, high) or none, got {layers}"),
        (
            ascending_or_mixed(layers),
            f"eagle3.layers {layers} must be distinct and ascending (low, mid, high): SGLang "
            "and vLLM capture each layer once, in ascending order",
        ),
        at_least("eagle3", s, "draft_vocab_size", 1),
        at_least("eagle3", s, "ttt_steps", 1),
        at_least("eagle3", s, "noise", 0),
        at_least("eagle3", s, "teacher_temperature", 0, "0: the target's top token"),
        one_of("eagle3", s, "out_of_vocab", OUT_OF_VOCAB),
        at_least("eagle3", s, "topk_loss", 0, "0: off"),
        at_least("eagle3", s, "topk_loss_weight", 0),
        (
            s.draft_rope_theta >= 0,
            f"eagle3.draft_rope_theta must be > 0, or 0 for the target's; got {s.draft_rope_theta}",
        ),
        one_of("eagle3", s, "draft_head_init", DRAFT_HEAD_INITS),
        one_of("eagle3", s, "draft_arch", DRAFT_ARCHS),
    ]


EAGLE3 = Method(
    name="eagle3",
    head_class=Eagle3Head,
    build_heads=build_heads,
    target_layers=fused_and_last,
    loss=loss,
    logit_columns=lambda head: head.vocab_target_ids(),  # the teacher's; and the argmax
    metric_shape=lambda cfg: (DraftMetrics.ROWS, cfg.settings.ttt_steps),
    summarise=lambda cfg, sums: DraftMetrics.summarise(
        sums, [cfg.settings.decay**i for i in range(cfg.settings.ttt_steps)], cfg.topk
    ),
    settings_class=Eagle3Settings,
    check_recipe=check_recipe,
    drafter=eagle_drafter_for,
    draft_vocab="EAGLE-3 heads draft over the vocabulary they were trained on",
    calibrate=calibrate_eagle,
    default_tree="auto",  # calibrated (kept per machine) where the run can: it won in every run measured
    export_formats=("eagle3", "speculators"),
)
