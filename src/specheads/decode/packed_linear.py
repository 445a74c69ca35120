"""The target's fp32 linear layers with their weights packed once, for the tree forward's row count (CPU).

On a CPU, fp32 `F.linear` over a handful of rows (2 to about 16: a draft tree's nodes) runs MKL's sgemm,
which repacks the whole weight into its panel layout on every call: for SmolLM2-135M, a forward over 4
tokens cost 1.7x one over a single token (1 thread, a 2-core Intel Xeon), where the
arithmetic is a small part of reading the weights. MKL can pack a weight once (`cblas_sgemm_pack`) and
multiply against the packed copy for a fixed row count; torch exposes that as
`torch.ops.mkl._mkl_reorder_linear_weight` / `_mkl_linear`, what Inductor's CPU freezing uses. A speculative
step's tree forward always has the same row count (B x N nodes), so the decoder packs for it:

    packed = PackedLinears.for_target(target)     # None where it does not apply: GPU, bf16, a small
                                                  # model, no MKL, switched off
    with packed.rows(n):                          # inside, every linear over n rows uses its packed copy
        target(...)

Other row counts inside the block (the prefill, a shorter last tree) take `_mkl_linear`'s own fallback,
`at::linear`, the same kernel as before. The packed product sums in another order than the unpacked one,
as any kernel change does: fp32 argmaxes are unchanged in the identity tests, but not bit-identical logits.
The packed copies are kept per row count asked for (a few: each decoder's tree size); each costs about a
copy of the linear weights. The first MAX_ROW_COUNTS counts are packed and later ones never, so what a
timing sees is what decoding gets. `--tree auto`'s sweep (evaluate/step_timing.py) times each size packed
and releases it afterwards, so every size is timed as a decoder of that size alone would run it.
`SPECHEADS_PACKED_LINEARS=0` turns it off (the A/B switch of the benchmarks).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

ENV = "SPECHEADS_PACKED_LINEARS"
_MKL_LINEAR = torch.ops.mkl._mkl_linear.default if hasattr(torch.ops.mkl, "_mkl_linear") else None


def available() -> bool:
    """Whether this torch can pack fp32 weights for MKL (x86 builds with MKL)."""
    return (
        torch.backends.mkl.is_available()
        and _MKL_LINEAR is not None
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    )


class PackedLinears:
    """Every fp32 nn.Linear of `model`, packed per row count on first use (at most `MAX_ROW_COUNTS` of
    them: the trees of the decoders sharing one target)."""

    MAX_ROW_COUNTS = 4
    # past a few dozen rows sgemm's own packing is a small part of the product (and batched decoding's row
    # counts, B x N as rows finish, would each cost a copy of the weights)
    MAX_ROWS = 64
    # below this many bytes of linear weights a model sits in the CPU's caches, where a packed copy beside
    # the weights costs more than the repacking it saves (the 2 MB tiny target decoded about 12% slower
    # against generate() packed, in two paired runs); SmolLM2-135M has 513 MiB
    MIN_TOTAL_BYTES = 128 << 20

    def __init__(self, model: nn.Module):
        self.linears = [
            m for m in model.modules() if isinstance(m, nn.Linear) and m.weight.dtype == torch.float32
        ]
        # per row count, each layer's forward over its packed weight, built once (a step only swaps them in)
        self.packed: dict[int, list[Callable[[torch.Tensor], torch.Tensor]]] = {}

    @classmethod
    def for_target(cls, target) -> PackedLinears | None:
        """The packing of a FrozenTarget on the CPU in fp32 with at least MIN_TOTAL_BYTES of linear weights,
        one per target (the decoders of a comparison share it), unless switched off; else None."""
        if os.environ.get(ENV, "1") == "0" or not available():
            return None
        if target.device.type != "cpu" or target.dtype != torch.float32:
            return None
        weights = {id(m.weight): m.weight for m in target.model.modules() if isinstance(m, nn.Linear)}
        if sum(w.numel() * w.element_size() for w in weights.values()) < cls.MIN_TOTAL_BYTES:
            return None  # a model the caches hold
        if getattr(target, "_packed_linears", None) is None:
            target._packed_linears = cls(target.model)
        return target._packed_linears

    @contextmanager
    def rows(self, n: int) -> Iterator[None]:
        """Within the block, each linear over `n` rows (all leading dimensions together) multiplies its
        packed weight, packed on the first call for `n`; more than MAX_ROWS rows, or a row count past the
        first MAX_ROW_COUNTS, leaves the layers as they are."""
        if n not in self.packed and n <= self.MAX_ROWS and len(self.packed) < self.MAX_ROW_COUNTS:
            self.packed[n] = [
                _packed_forward(m, torch.ops.mkl._mkl_reorder_linear_weight(m.weight.detach(), n), n)
                for m in self.linears
            ]
        if n not in self.packed:
            yield
            return
        for layer, forward in zip(self.linears, self.packed[n]):
            layer.forward = forward
        try:
            yield
        finally:
            for layer in self.linears:
                del layer.forward  # back to the class's forward

    def release(self, n: int) -> None:
        """Drop the packed copies for `n` rows (a timing sweep's, once that size is timed), freeing their
        memory and their place among the MAX_ROW_COUNTS."""
        self.packed.pop(n, None)


def _packed_forward(layer: nn.Linear, packed: torch.Tensor, n: int):
    weight, bias = layer.weight, layer.bias

    def forward(x: torch.Tensor) -> torch.Tensor:
        return _MKL_LINEAR(x, packed, weight, bias, n)

    return forward
