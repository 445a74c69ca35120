"""EAGLE-3: a layer fed by three of the target's layers fused, trained with training-time test over a
draft vocabulary of the data's most frequent label tokens. Decoded like EAGLE (the same drafter)."""

from __future__ import annotations

from specheads.decode.calibrate_dynamic import calibrate_eagle
from specheads.decode.drafter_factory import eagle_drafter_for
from specheads.heads import (
    Eagle3Config,
    Eagle3Head,
    default_eagle3_layers,
    draft_layer_config,
    draft_vocab_from_counts,
)
from specheads.heads.eagle import with_rope_theta
from specheads.heads.method import Method
from specheads.train.eagle_losses import OUT_OF_VOCAB, DraftMetrics, eagle3_loss

# draft_head_init (train/config.py): the draft's lm_head and norm drawn at random, or copied from the target
DRAFT_HEAD_INITS = ("random", "target")


def build_heads(cfg, target, label_counts) -> tuple[Eagle3Head, dict]:
    """An EAGLE-3 head whose draft vocabulary is the most frequent label tokens: `label_counts` (V,), the
    training rows' (train/loop.py counts them once a run)."""
    size = min(cfg.draft_vocab_size, target.vocab_size)
    layer_config = draft_layer_config(target.config, cfg.draft_arch)  # a Llama layer, or the target's family
    if cfg.draft_rope_theta:
        layer_config = with_rope_theta(layer_config, cfg.draft_rope_theta)
    config = Eagle3Config(
        layer_config,
        draft_arch=cfg.draft_arch,
        draft_vocab_size=size,
        target_layers=tuple(target.layer_id(i) for i in cfg.eagle3_layers),
    )
    draft_vocab = draft_vocab_from_counts(label_counts, size)
    coverage = label_counts[draft_vocab].sum().item() / max(label_counts.sum().item(), 1)
    head = Eagle3Head(config).set_draft_vocab(draft_vocab)
    if cfg.draft_head_init == "target":
        head.init_from_target(target.lm_head, target.norm)
    return head.to(target.device), {"draft_vocab_size": size, "draft_vocab_label_coverage": coverage}


def fused_and_last(num_layers: int, chosen=()) -> tuple[int, ...]:
    """The three fused layers ((2, L//2, L-3) unless chosen) and L, whose lm_head gives the logits."""
    fused = [i % (num_layers + 1) for i in chosen] or list(default_eagle3_layers(num_layers))
    return tuple(sorted({*fused, num_layers}))


def loss(objective, batch: dict, out, target):
    """Training-time test over `ttt_steps` steps, step k weighted decay**k (train/eagle_losses.py)."""
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
        steps=objective.ttt_steps,
        decay=objective.decay,
        topk=objective.topk,
        noise=objective.eagle3_noise,
        temperature=objective.eagle3_teacher_temperature,
        out_of_vocab=objective.eagle3_out_of_vocab,
        topk_loss=objective.eagle3_topk_loss,
        topk_loss_weight=objective.eagle3_topk_loss_weight,
    )


def ascending_or_mixed(layers: list[int]) -> bool:
    """Ids of one sign must ascend strictly; mixed signs (e.g. [2, 16, -3]) are checked against the
    target's depth when the head is built (Eagle3Config)."""
    if not (all(i >= 0 for i in layers) or all(i < 0 for i in layers)):
        return True
    return all(a < b for a, b in zip(layers, layers[1:]))


def check_recipe(cfg) -> list[tuple[bool, str]]:
    layers = cfg.eagle3_layers
    return [
        (len(layers) in (0, 3), f"eagle3_layers takes 3 layer ids (low, mid, high) or none, got {layers}"),
        (
            ascending_or_mixed(layers),
            f"eagle3_layers {layers} must be distinct and ascending (low, mid, high): SGLang "
            "and vLLM capture each layer once, in ascending order",
        ),
        (cfg.draft_vocab_size >= 1, f"draft_vocab_size must be >= 1, got {cfg.draft_vocab_size}"),
        (cfg.ttt_steps >= 1, f"ttt_steps must be >= 1, got {cfg.ttt_steps}"),
        (cfg.eagle3_noise >= 0, f"eagle3_noise must be >= 0, got {cfg.eagle3_noise}"),
        (
            cfg.eagle3_teacher_temperature >= 0,
            "eagle3_teacher_temperature must be >= 0 (0: the target's top token), got "
            f"{cfg.eagle3_teacher_temperature}",
        ),
        (
            cfg.eagle3_out_of_vocab in OUT_OF_VOCAB,
            f"eagle3_out_of_vocab must be one of {OUT_OF_VOCAB}, got {cfg.eagle3_out_of_vocab!r}",
        ),
        (cfg.eagle3_topk_loss >= 0, f"eagle3_topk_loss must be >= 0 (0: off), got {cfg.eagle3_topk_loss}"),
        (
            cfg.eagle3_topk_loss_weight >= 0,
            f"eagle3_topk_loss_weight must be >= 0, got {cfg.eagle3_topk_loss_weight}",
        ),
        (
            cfg.draft_rope_theta >= 0,
            f"draft_rope_theta must be > 0, or 0 for the target's; got {cfg.draft_rope_theta}",
        ),
        (
            cfg.draft_head_init in DRAFT_HEAD_INITS,
            f"draft_head_init must be one of {DRAFT_HEAD_INITS}, got {cfg.draft_head_init!r}",
        ),
    ]


EAGLE3 = Method(
    name="eagle3",
    head_class=Eagle3Head,
    config_class=Eagle3Config,
    build_heads=build_heads,
    target_layers=fused_and_last,
    capture=lambda head: tuple(head.capture_layers),
    loss=loss,
    logit_columns=lambda head: head.vocab_target_ids(),  # the teacher's; and the argmax
    metric_shape=lambda cfg: (DraftMetrics.ROWS, cfg.ttt_steps),
    summarise=lambda cfg, sums: DraftMetrics.summarise(
        sums, [cfg.decay**i for i in range(cfg.ttt_steps)], cfg.topk
    ),
    recipe_keys=(
        "eagle3_layers",
        "draft_vocab_size",
        "ttt_steps",
        "decay",
        "draft_head_init",
        "eagle3_noise",
        "eagle3_teacher_temperature",
        "eagle3_out_of_vocab",
        "eagle3_topk_loss",
        "eagle3_topk_loss_weight",
        "draft_rope_theta",
        "draft_arch",
    ),
    check_recipe=check_recipe,
    drafter=eagle_drafter_for,
    draft_vocab="EAGLE-3 heads draft over the vocabulary they were trained on",
    calibrate=calibrate_eagle,
    default_tree="auto",  # calibrated (kept per machine) where the run can: it won in every run measured
    export_formats=("eagle3", "speculators"),
)
