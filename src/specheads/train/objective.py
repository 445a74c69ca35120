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


class HeadsWithLoss(nn.Module):
    """forward(batch, out, target) -> (loss (), metrics (rows, heads or draft steps) float64 sums).

    Args:
        heads: the method's heads (MedusaHeads, EagleHead, Eagle3Head, ...).
        loss: the method's loss (`Method.loss`), called as loss(self, batch, out, target); it reads the
            settings below from `self`.
        capture_layers: the target layers the loss reads (`Method.capture`).
        needs_logits: whether the loss reads the target's logits.
        topk: the k of the top-k accuracy in the metrics.
        settings: the method's recipe section (`TrainConfig.settings`: MedusaSettings, Eagle3Settings, ...),
            whose keys its loss reads (decay, labels, ttt_steps, ...).
    """

    def __init__(
        self,
        heads: nn.Module,
        loss: Callable[..., tuple[torch.Tensor, Any]],
        *,
        capture_layers: tuple[int, ...],
        needs_logits: bool = True,
        topk: int = 5,
        settings: Any = None,
    ):
        super().__init__()
        self.heads = heads
        self.loss, self.capture_layers, self.needs_logits = loss, tuple(capture_layers), needs_logits
        self.topk, self.settings = topk, settings

    def forward(self, batch: dict, out: TargetOutput, target) -> tuple[torch.Tensor, torch.Tensor]:
        """batch: input_ids, loss_mask, position_ids (B, T), attention_mask; out: the target's forward
        over it; target: lends embed_tokens, lm_head and num_layers."""
        loss, metrics = self.loss(self, batch, out, target)
        return loss, metrics.as_tensor()
