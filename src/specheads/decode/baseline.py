"""The baseline every speculative run is checked and timed against: the target's own `generate`."""

from __future__ import annotations

from typing import Any

import torch

from specheads.core.target import FrozenTarget
from specheads.decode.step import eos_ids


def pad_token_id(target: FrozenTarget) -> int:
    """The id `generate` pads finished rows (and we pad prompts) with: the generation config's, else an EOS
    (else 0: with no EOS no row finishes early, so no padding is ever written)."""
    pad = getattr(target.model.generation_config, "pad_token_id", None)
    return int(pad) if pad is not None else min(eos_ids(target), default=0)


@torch.no_grad()
def generate_rows(
    target: FrozenTarget,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    attention_mask: torch.Tensor | None = None,
    **how: Any,
) -> list[list[int]]:
    """The target's own `generate` over prompts (B, T), greedy unless `how` says otherwise; each row's new
    tokens up to its first EOS (kept), as `generate` gives the row alone.

    Args:
        attention_mask: (B, T) 0 on the left padding; None when nothing is padded.
        how: further `generate` arguments (sampling settings, an assistant model, prompt lookup...).
    """
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    out = target.model.generate(
        input_ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_token_id(target),
        **{"do_sample": False, **how},
    )
    eos, rows = eos_ids(target), []
    for row in out[:, input_ids.shape[1] :].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), len(row) - 1)
        rows.append(row[: end + 1])
    return rows
