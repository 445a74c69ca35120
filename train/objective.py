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

import torch
from torch import nn

from specheads.heads import TargetOutput
from specheads.train.eagle_losses import eagle3_loss, eagle_loss
from specheads.train.losses import medusa_loss


class HeadsWithLoss(nn.Module):
    """forward(batch, out, target) -> (loss (), metrics (rows, heads or draft steps) float64 sums).

    Args:
        heads: MedusaHeads, EagleHead or Eagle3Head (its `method` picks the loss).
        labels: Medusa only: "data" (the text's tokens) or "target" (the target's distributions).
        decay: weight of Medusa head k / EAGLE-3 step k is decay**k.
        topk: the k of the top-k accuracy in the metrics.
        w_feat, w_tok, noise: EAGLE-1/2 loss weights and input-feature noise.
        ttt_steps: EAGLE-3 training-time-test steps.
    """

    def __init__(
        self,
        heads: nn.Module,
        *,
        labels: str = "data",
        decay: float = 0.8,
        topk: int = 5,
        w_feat: float = 1.0,
        w_tok: float = 0.1,
        noise: float = 0.1,
        ttt_steps: int = 7,
    ):
        super().__init__()
        self.heads = heads
        self.method = heads.method
        self.labels, self.decay, self.topk = labels, decay, topk
        self.w_feat, self.w_tok, self.noise, self.ttt_steps = w_feat, w_tok, noise, ttt_steps

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """The target layers the loss reads (Medusa: the last hidden state, id -1)."""
        return (-1,) if self.method == "medusa" else tuple(self.heads.capture_layers)

    @property
    def needs_logits(self) -> bool:
        """Whether the loss reads the target's logits."""
        return self.method != "medusa" or self.labels == "target"

    def forward(self, batch: dict, out: TargetOutput, target) -> tuple[torch.Tensor, torch.Tensor]:
        """batch: input_ids, loss_mask, position_ids (B, T), attention_mask; out: the target's forward
        over it; target: lends embed_tokens, lm_head and num_layers."""
        if self.method == "medusa":
            loss, metrics = self.medusa(batch, out, target)
        elif self.method == "eagle":
            loss, metrics = eagle_loss(
                self.heads,
                out.hidden[target.num_layers],  # f_t, after the final norm
                batch["input_ids"],
                batch["loss_mask"],
                batch["position_ids"],
                out.logits,
                target.embed_tokens,
                target.lm_head,
                attention_mask=batch["attention_mask"],
                w_feat=self.w_feat,
                w_tok=self.w_tok,
                noise=self.noise,
                topk=self.topk,
            )
        else:
            loss, metrics = eagle3_loss(
                self.heads,
                out.hidden,
                batch["input_ids"],
                batch["loss_mask"],
                batch["position_ids"],
                out.logits,
                target.embed_tokens,
                attention_mask=batch["attention_mask"],
                steps=self.ttt_steps,
                decay=self.decay,
                topk=self.topk,
            )
        return loss, metrics.as_tensor()

    def medusa(self, batch: dict, out: TargetOutput, target):
        hidden = out.hidden[target.num_layers]  # (B, T, H), after the final norm
        loss, metrics = medusa_loss(
            self.heads,
            hidden,
            batch["input_ids"],
            batch["loss_mask"],
            batch["position_ids"],
            decay=self.decay,
            topk=self.topk,
            target_logits=out.logits if self.labels == "target" else None,
            lm_head=target.lm_head,
        )
        # Heads whose offset passes the batch's length get no loss; DDP needs every parameter in the
        # graph, so run them on no positions (a zero with zero gradients).
        for k in range(max(0, hidden.shape[1] - 2), self.heads.num_heads):
            loss = loss + self.heads.head(k, hidden[:0, 0], target.lm_head).sum()
        return loss, metrics
