"""The frozen target's states over the held-out batches, kept from the first evaluation for the next ones.

Every evaluation reads the same first `eval_batches` held-out batches, and the target is frozen, so its
forward over them gives the same states each time. Online, that forward is most of an evaluation (on the
SmolLM2 EAGLE-3 recipe, 1 thread: about 30 s of the 40 an evaluation took, five times a run). The first
evaluation keeps, in host memory, the layers the heads read and, when the loss reads logits, the final
norm's output; later ones compute only the logits from it with the target's lm_head, as offline training
does (train/offline_target.py). The logits are the same tensor op on the same input as inside the forward,
so the metrics equal a full forward's (tests/train/test_held_out.py).

A loss that reads only some columns of the logits besides their argmax (the method's `logit_columns`:
EAGLE-3's draft vocabulary, 8,192 of SmolLM2's 49,152) gets only those: the first evaluation keeps the
argmax too, and later ones multiply the final norm's output by those rows of the lm_head alone. A product
over fewer rows adds up the same terms, and on the CPUs measured in the same order, so the metrics are the
full product's to the last digit there; a library may pick another order for another shape (a GPU's may),
and then they are the same to float rounding (tests/train/test_held_out.py).

What is kept is capped (`eval_cache_mib`; 0 keeps nothing): the batches that fit are kept, in order, and the
rest run the target each time. Not used offline (the batches carry their states), with a ZeRO-3 target
(its lm_head is a shard outside its forward) or with an objective that runs the target itself (Medusa-2:
its adapters change).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specheads.core.target import TargetOutput
from specheads.train.offline_target import target_output

MIB = 1 << 20


@dataclass
class Kept:
    """One held-out batch's kept states: its rows, its layers (id -> (B, T, H)) and, for a loss that reads
    some columns of the logits, their argmax over the whole vocabulary (B, T)."""

    input_ids: torch.Tensor
    hidden: dict[int, torch.Tensor]
    top_tokens: torch.Tensor | None = None

    @property
    def bytes(self) -> int:
        tensors = [*self.hidden.values(), *([self.top_tokens] if self.top_tokens is not None else [])]
        return sum(t.numel() * t.element_size() for t in tensors)


def logit_columns(lm_head: nn.Module, hidden: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """lm_head(hidden)[..., columns], from those rows of its weight alone (B, T, C); a head that is not a
    plain Linear runs whole."""
    if type(lm_head) is not nn.Linear:
        return lm_head(hidden)[..., columns]
    bias = lm_head.bias[columns] if lm_head.bias is not None else None
    return F.linear(hidden, lm_head.weight[columns], bias)


class HeldOutStates:
    """target_output() of train/offline_target.py for held-out batch `index`: a kept batch's states, or the
    target's forward (kept while the cap allows).

    `columns()`: the vocabulary ids of the only logits the loss reads besides their argmax (the method's
    `logit_columns` of the run's heads); a kept batch then gives those alone, with the argmax kept
    (TargetOutput.top_tokens). None: it reads them all.
    """

    def __init__(self, limit_mib: int, columns: Callable[[], torch.Tensor] | None = None):
        self.limit = limit_mib * MIB
        self.columns = columns
        self.kept: dict[int, Kept] = {}
        self.bytes = 0
        self.full = limit_mib <= 0  # once a batch did not fit, later ones are not tried

    def target_output(
        self, target, batch: dict, *, capture: Iterable[int], logits: bool, index: int
    ) -> TargetOutput:
        layers = [target.layer_id(i) for i in capture]
        final = target.num_layers
        kept = self.kept.get(index)
        if kept is not None and torch.equal(kept.input_ids, batch["input_ids"].cpu()):
            device = batch["input_ids"].device
            hidden = {i: h.to(device, non_blocking=True) for i, h in kept.hidden.items()}
            out = TargetOutput(logits=None, hidden={i: hidden[i] for i in layers})
            if logits and kept.top_tokens is not None:
                out.logits = logit_columns(target.lm_head, hidden[final], self.columns().to(device))
                out.top_tokens = kept.top_tokens.to(device, non_blocking=True)
            elif logits:
                out.logits = target.lm_head(hidden[final])
            return out
        wanted = sorted({*layers, *([final] if logits else [])})
        out = target_output(target, batch, capture=wanted, logits=logits)
        self._keep(index, batch["input_ids"], out.hidden, out.logits)
        return TargetOutput(logits=out.logits, hidden={i: out.hidden[i] for i in layers})

    def _keep(
        self,
        index: int,
        input_ids: torch.Tensor,
        hidden: dict[int, torch.Tensor],
        logits: torch.Tensor | None,
    ) -> None:
        if self.full or index in self.kept:
            return
        # the argmax, only for a batch that may be kept and a loss that reads some columns alone
        top = logits.argmax(-1) if logits is not None and self.columns is not None else None
        size = Kept(input_ids, hidden, top).bytes
        if self.bytes + size > self.limit:
            self.full = True
            return
        # copies: the loss must not be able to change what the next evaluation reads
        self.kept[index] = Kept(
            input_ids.detach().to("cpu", copy=True),
            {i: h.detach().to("cpu", copy=True) for i, h in hidden.items()},
            top.to("cpu", copy=True) if top is not None else None,
        )
        self.bytes += size
