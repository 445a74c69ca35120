"""The frozen target's states over the held-out batches, kept from the first evaluation for the next ones.

Every evaluation reads the same first `eval_batches` held-out batches, and the target is frozen, so its
forward over them gives the same states each time. Online, that forward is most of an evaluation (on the
SmolLM2 EAGLE-3 recipe, 1 thread: about 30 s of the 40 an evaluation took, five times a run). The first
evaluation keeps, in host memory, the layers the heads read and, when the loss reads logits, the final
norm's output; later ones compute only the logits from it with the target's lm_head, as offline training
does (train/offline_target.py). The logits are the same tensor op on the same input as inside the forward,
so the metrics equal a full forward's (tests/train/test_held_out.py).

What is kept is capped (`eval_cache_mib`; 0 keeps nothing): the batches that fit are kept, in order, and the
rest run the target each time. Not used offline (the batches carry their states), with a ZeRO-3 target
(its lm_head is a shard outside its forward) or with an objective that runs the target itself (Medusa-2:
its adapters change).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specheads.heads import TargetOutput
from specheads.train.offline_target import target_output

MIB = 1 << 20


class HeldOutStates:
    """target_output() of train/offline_target.py for held-out batch `index`: a kept batch's states, or the
    target's forward (kept while the cap allows)."""

    def __init__(self, limit_mib: int):
        self.limit = limit_mib * MIB
        self.kept: dict[int, tuple[torch.Tensor, dict[int, torch.Tensor]]] = {}  # index -> (ids, layers)
        self.bytes = 0
        self.full = limit_mib <= 0  # once a batch did not fit, later ones are not tried

    def target_output(
        self, target, batch: dict, *, capture: Iterable[int], logits: bool, index: int
    ) -> TargetOutput:
        layers = [target.layer_id(i) for i in capture]
        final = target.num_layers
        kept = self.kept.get(index)
        if kept is not None and torch.equal(kept[0], batch["input_ids"].cpu()):
            device = batch["input_ids"].device
            hidden = {i: h.to(device, non_blocking=True) for i, h in kept[1].items()}
            out_logits = target.lm_head(hidden[final]) if logits else None
            return TargetOutput(logits=out_logits, hidden={i: hidden[i] for i in layers})
        wanted = sorted({*layers, *([final] if logits else [])})
        out = target_output(target, batch, capture=wanted, logits=logits)
        self._keep(index, batch["input_ids"], out.hidden)
        return TargetOutput(logits=out.logits, hidden={i: out.hidden[i] for i in layers})

    def _keep(self, index: int, input_ids: torch.Tensor, hidden: dict[int, torch.Tensor]) -> None:
        if self.full or index in self.kept:
            return
        size = sum(h.numel() * h.element_size() for h in hidden.values())
        if self.bytes + size > self.limit:
            self.full = True
            return
        # copies: the loss must not be able to change what the next evaluation reads
        states = {i: h.detach().to("cpu", copy=True) for i, h in hidden.items()}
        self.kept[index] = (input_ids.detach().to("cpu", copy=True), states)
        self.bytes += size
