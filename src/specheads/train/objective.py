"""The heads and their loss as one module: what DDP, DeepSpeed or FSDP wrap and train.

Data parallelism only works through the wrapper's own forward: DDP readies its gradient all-reduce there,
and ZeRO-3 / FSDP gather the heads' sharded weights there. A loss that calls `heads.head(k, ...)` or
`head.fc` on the wrapped module's insides from outside would skip all of that, so the loss is computed
*inside* `HeadsWithLoss.forward`.

The frozen target stays outside: it is passed in, never a submodule, so its weights never reach
`parameters()`, the gradient all-reduce or the optimizer (FrozenTarget is not an nn.Module for the same
reason). The loss reads the target's forward (`TargetOutput`, computed by the training loop) and borrows
its embedding and lm_head.

Normalisation: each call's loss is the mean over its own labelled positions, and data-parallel wrappers
average gradients over processes, so every micro-batch on every process weighs the same (as in the
Medusa and EAGLE reference trainers). When processes hold different numbers of labels, that is not the
token-weighted mean over the global batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specheads.core.target import TargetOutput

# the recipe's settings HeadsWithLoss holds for the losses (TrainConfig's fields of these names)
LOSS_SETTINGS = (
    "labels",
    "decay",
    "topk",
    "w_feat",
    "w_tok",
    "noise",
    "ttt_steps",
    "eagle3_noise",
    "eagle3_teacher_temperature",
    "eagle3_out_of_vocab",
    "eagle3_topk_loss",
    "eagle3_topk_loss_weight",
)


def loss_settings(cfg) -> dict[str, Any]:
    """The recipe's loss settings (LOSS_SETTINGS), as HeadsWithLoss's keyword arguments."""
    return {name: getattr(cfg, name) for name in LOSS_SETTINGS}


class HeadsWithLoss(nn.Module):
    """forward(batch, out, target) -> (loss (), metrics (rows, heads or draft steps) float64 sums).

    Args:
        heads: the method's heads (MedusaHeads, EagleHead, Eagle3Head, ...).
        loss: the method's loss (`Method.loss`), called as loss(self, batch, out, target); it reads the
            settings below from `self`.
        capture_layers: the target layers the loss reads (`Method.capture`).
        needs_logits: whether the loss reads the target's logits.
        labels: Medusa only: "data" (the text's tokens), "target" (the target's distributions) or
            "target-top1" (the target's top tokens).
        decay: weight of Medusa head k / EAGLE-3 step k is decay**k.
        topk: the k of the top-k accuracy in the metrics.
        w_feat, w_tok, noise: EAGLE-1/2 loss weights and input-feature noise.
        ttt_steps, eagle3_noise, eagle3_teacher_temperature, eagle3_out_of_vocab: EAGLE-3 training-time-test
            steps, input-feature noise, the temperature of its labels (1: the target's distribution; 0: its
            top token) and whether positions outside the draft vocabulary are trained ("skip", "train").
        eagle3_topk_loss, eagle3_topk_loss_weight: EAGLE-3's HASS top-K distillation term (0: none).
    """

    def __init__(
        self,
        heads: nn.Module,
        loss: Callable[..., tuple[torch.Tensor, Any]],
        *,
        capture_layers: tuple[int, ...],
        needs_logits: bool = True,
        labels: str = "data",
        decay: float = 0.8,
        topk: int = 5,
        w_feat: float = 1.0,
        w_tok: float = 0.1,
        noise: float = 0.1,
        ttt_steps: int = 7,
        eagle3_noise: float = 0.0,
        eagle3_teacher_temperature: float = 1.0,
        eagle3_out_of_vocab: str = "skip",
        eagle3_topk_loss: int = 0,
        eagle3_topk_loss_weight: float = 1.0,
    ):
        super().__init__()
        self.heads = heads
        self.loss, self.capture_layers, self.needs_logits = loss, tuple(capture_layers), needs_logits
        self.labels, self.decay, self.topk = labels, decay, topk
        self.w_feat, self.w_tok, self.noise, self.ttt_steps = w_feat, w_tok, noise, ttt_steps
        self.eagle3_noise, self.eagle3_teacher_temperature = eagle3_noise, eagle3_teacher_temperature
        self.eagle3_out_of_vocab = eagle3_out_of_vocab
        self.eagle3_topk_loss, self.eagle3_topk_loss_weight = eagle3_topk_loss, eagle3_topk_loss_weight

    def forward(self, batch: dict, out: TargetOutput, target) -> tuple[torch.Tensor, torch.Tensor]:
        """batch: input_ids, loss_mask, position_ids (B, T), attention_mask; out: the target's forward
        over it; target: lends embed_tokens, lm_head and num_layers."""
        loss, metrics = self.loss(self, batch, out, target)
        return loss, metrics.as_tensor()
