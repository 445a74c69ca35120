"""Medusa heads (Cai et al., 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads").

Offsets: the target's own lm_head reads the last hidden state h_t (after the final norm) and predicts
token t+1. Medusa head k (0-based) reads the same h_t and predicts token t+2+k.

Each head is `num_layers` residual blocks, x + SiLU(W x + b) with W and b zero-initialised (so a fresh
block is the identity), then a vocabulary projection initialised from the target's lm_head. A fresh
head therefore reproduces the target's next-token logits exactly, and training moves it off by the
offset it is asked to predict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class MedusaConfig:
    hidden_size: int
    vocab_size: int
    num_heads: int = 4
    num_layers: int = 1
    share_lm_head: bool = False  # use the target's lm_head (frozen, not stored) instead of one per head

    def __post_init__(self):
        for name in ("hidden_size", "vocab_size", "num_heads", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"MedusaConfig.{name} must be >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


class ResBlock(nn.Module):
    """x + SiLU(W x + b), zero-initialised: the identity until trained."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa heads over the target's last hidden state.

    forward(hidden (B, T, H)) -> logits (K, B, T, V); logits[k, :, t] predicts token t+2+k.
    """

    method = "medusa"
    config_class = MedusaConfig
    capture_layers = (-1,)  # the target's last hidden state, after the final norm (its lm_head's input)

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        h, v = config.hidden_size, config.vocab_size
        # Independent modules per head and per layer (never `[ResBlock(h)] * n`, which shares weights).
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(h) for _ in range(config.num_layers))) for _ in range(config.num_heads)
        )
        self.lm_heads = (
            None
            if config.share_lm_head
            else nn.ModuleList(nn.Linear(h, v, bias=False) for _ in range(config.num_heads))
        )

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    @torch.no_grad()
    def init_lm_heads_from(self, lm_head: nn.Module) -> MedusaHeads:
        """Copy the target's lm_head weight into every head's own projection."""
        weight = lm_head.weight
        if weight.shape != (self.config.vocab_size, self.config.hidden_size):
            raise ValueError(
                f"target lm_head is {tuple(weight.shape)}, heads expect "
                f"({self.config.vocab_size}, {self.config.hidden_size})"
            )
        if getattr(lm_head, "bias", None) is not None:
            raise ValueError("target lm_head has a bias; Medusa heads' projections have none")
        for head in self.lm_heads or ():
            head.weight.copy_(weight)
        return self

    def head(self, k: int, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """Head k alone: (..., H) -> (..., V). `lm_head` is the target's, required when it is shared.

        Training calls this on the positions that have a label only, so the K x B x T x V logits of
        `forward` are never built at once. `hidden` enters in the heads' dtype, and a shared lm_head gets its
        own (a bf16 target's states into fp32 heads trained without mixed precision); under autocast, which
        casts each matmul's inputs anyway, the result is the same.
        """
        block = self.blocks[k]
        out = block(hidden.to(block[0].linear.weight.dtype))
        if self.lm_heads is not None:
            return self.lm_heads[k](out)
        if lm_head is None:
            raise ValueError("these Medusa heads share the target's lm_head: pass it as `lm_head`")
        return lm_head(out.to(lm_head.weight.dtype))

    def forward(self, hidden: torch.Tensor, lm_head: nn.Module | None = None) -> torch.Tensor:
        """(B, T, H) -> (K, B, T, V)."""
        return torch.stack([self.head(k, hidden, lm_head) for k in range(self.num_heads)])
