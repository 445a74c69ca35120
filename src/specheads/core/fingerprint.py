"""A cheap fingerprint of a target's weights: same shapes are not the same model.

Heads fitted to one target run silently at τ 1.00 against a same-shape target trained with another seed;
the vocabulary hash and the sizes cannot tell the two apart. The fingerprint is a sha256 over a fixed,
evenly spaced sample of SAMPLES values of the input embedding and the lm_head (the tensors every load of a
target holds, the offline one's included), each rounded to bfloat16 so that a float32 and a bfloat16 load
of the same weights agree. Integer strides, so every device picks the same values.
"""

from __future__ import annotations

import hashlib

import torch

SAMPLES = 4096  # values a tensor


def weights_fingerprint(tensors: dict[str, torch.Tensor]) -> str | None:
    """ "sample-sha256:<hex>" over `tensors` (name -> weight); None when one is not whole here (a ZeRO-3
    shard holds an empty placeholder)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        flat = tensors[name].detach().reshape(-1)
        if flat.numel() == 0:
            return None
        n = min(SAMPLES, flat.numel())
        index = torch.arange(n, device=flat.device) * (flat.numel() // n)
        values = flat[index].to(torch.bfloat16).to(torch.float32).cpu()
        digest.update(f"{name}:{tuple(tensors[name].shape)}:".encode())
        digest.update(values.numpy().tobytes())
    return "sample-sha256:" + digest.hexdigest()[:32]
