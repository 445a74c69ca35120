"""A fifth method, written the way a new one would be: one module holding its `Method` entry, which its
distribution names in an entry point of the `specheads.methods` group (test_toy_method.py installs it so).

"bigram": one linear head on the target's last hidden state at t guesses token t + 2 (the token after
the one the target's own lm_head predicts), and decodes as a chain of one node after the root. It
shares no code with the built-in methods: the training loop, eval, export and the checkpoint read
everything they need from its `Method` entry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specheads.decode.drafters import DraftContext
from specheads.decode.trees import DraftTree
from specheads.heads.method import Method


@dataclass
class BigramConfig:
    hidden_size: int
    vocab_size: int

    def to_dict(self) -> dict:
        return asdict(self)


class BigramHead(nn.Module):
    method = "bigram"
    config_class = BigramConfig
    capture_layers = (-1,)

    def __init__(self, config: BigramConfig):
        super().__init__()
        self.config = config
        self.proj = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)  # (..., H) -> (..., V): logits of the token two after


class Sums:
    """(3, 1) float64 sums: loss, top-1 hits, labelled positions."""

    def __init__(self, loss: torch.Tensor, hits: torch.Tensor, count: torch.Tensor):
        self.values = torch.stack([loss, hits, count]).double().reshape(3, 1)

    def as_tensor(self) -> torch.Tensor:
        return self.values


def loss(objective, batch: dict, out, target):
    hidden = out.hidden[target.num_layers][:, :-2]  # (B, T-2, H) at t
    labels = batch["input_ids"][:, 2:]  # token t + 2
    pos = batch["position_ids"]
    valid = (batch["loss_mask"][:, 2:] > 0) & (pos[:, 2:] == pos[:, :-2] + 2)  # same packed row
    logits = objective.heads(hidden)[valid]  # (n, V)
    ce = F.cross_entropy(logits.float(), labels[valid], reduction="sum")
    n = valid.sum()
    hits = (logits.argmax(-1) == labels[valid]).sum()
    return ce / n.clamp_min(1), Sums(ce.detach(), hits, n)


def summarise(cfg, sums: torch.Tensor) -> dict[str, float]:
    loss_sum, hits, count = sums[:, 0].tolist()
    top1 = hits / max(count, 1)
    return {"head0/top1": top1, "loss": loss_sum / max(count, 1), "tau_sim": 1 + top1, "tokens": count}


class ChainDrafter:
    """The head's one guess after the root: a two-node chain."""

    capture_layers = (-1,)

    def __init__(self, head: BigramHead):
        self.head = head

    @torch.no_grad()
    def propose(self, context: DraftContext) -> DraftTree:
        feature = context.hidden[-1][:, -1]  # (B, H) at the root's predecessor
        guess = self.head(feature.to(self.head.proj.weight.dtype)).argmax(-1, keepdim=True)  # (B, 1)
        root = context.tokens[:, -1:].to(guess.device)
        tokens = torch.cat([root, guess], dim=1)  # (B, 2)
        parents = torch.tensor([[-1, 0]], device=guess.device).expand_as(tokens)
        return DraftTree(tokens=tokens, parents=parents)


BIGRAM = Method(
    name="bigram",
    head_class=BigramHead,
    build_heads=lambda cfg, target, label_counts: (
        BigramHead(BigramConfig(target.hidden_size, target.vocab_size)).to(target.device),
        {},
    ),
    target_layers=lambda num_layers, chosen=(): (num_layers,),
    loss=loss,
    needs_logits=lambda cfg: False,
    metric_shape=lambda cfg: (3, 1),
    summarise=summarise,
    metric_unit="head",
    drafter=lambda head, target, tree: (
        ChainDrafter(head),
        {"name": "chain-2", "nodes": 2, "depth": 1},
    ),
)
