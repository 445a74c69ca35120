"""Two trainings that are the same computation in another floating-point order, compared at the scale
that reordering alone produces, measured in the test itself.

Several processes against one, offline against online: each pair computes the same sums in another
order (a gradient all-reduce instead of one matmul over the batch, hidden states cached from a forward
of another shape). In fp32 that moves results by roundings, and AdamW's g / sqrt(v) turns roundings on
near-zero gradients into much larger weight differences: how much larger depends on the CPU's kernels
(AVX2, AVX-512, AMX) and is no fixed constant.

So every such test also trains a *twin*: the reference run again, the same rows and the same math, with
its micro-batches split otherwise (`batch_size` halved, `grad_accum` doubled; rows of equal length, so
each micro-batch's mean loss weighs the same). |reference - twin| is what reordering does to this very
run on this machine and thread count; the run under test must stay within FACTOR times that. A real
fault (a gradient not synchronised, a row or position off by one, a layer swapped) moves weights and
losses by orders of magnitude more; the tests' notes show each such break failing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

# How far beyond the twin's distance the run under test may be. Measured on a 2-core Xeon with AVX-512
# and AMX, at 1 and 2 threads: DDP and ZeRO-3 runs land at 0.5-1x the twin's distance, Medusa-2 under
# ZeRO-3 (DeepSpeed's own partitioned optimizer step) at 5.3x, offline training at 0 (bit-equal). The
# subtlest fault tried, a cache that rounds hidden states through bf16, lands at 66x; a process drawing
# another's rows, or gradients never synchronised, at 1e5x and more.
FACTOR = 16.0


def max_gap(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """max |a - b| over every tensor; the two must hold the same names and shapes."""
    assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)), "names differ")
    for k in a:
        assert a[k].shape == b[k].shape, (k, a[k].shape, b[k].shape)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def max_value_gap(a: Sequence[float], b: Sequence[float]) -> float:
    """max |a_i - b_i| over two equally long sequences of logged values."""
    assert len(a) == len(b), (len(a), len(b))
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


# A twin further than this from its reference is not the same computation (rows or steps differ), and
# would make the bound meaningless: roundings stay orders of magnitude below it.
TWIN_LIMIT = 1e-3


def assert_within_rounding(gap: float, noise: float, what: str) -> None:
    """`gap` (the run under test against the reference) is at most FACTOR x `noise` (the twin against
    the reference). A twin identical to its reference makes the bound 0: then the run must be exact."""
    # shown on failure, or with -s
    print(f"equivalence: {what}: {gap:.3g} from the reference, twin {noise:.3g}")
    assert math.isfinite(gap), f"{what}: gap is {gap}"
    assert noise <= TWIN_LIMIT, (
        f"{what}: the twin is {noise:.3g} from its reference: not the same computation"
    )
    assert gap <= FACTOR * noise, (
        f"{what}: {gap:.3g} from the reference run, more than {FACTOR:g}x the {noise:.3g} that reordering "
        f"the reference's own sums (its twin) gives"
    )


def assert_same_weights(ref, other, twin, what: str = "weights") -> None:
    assert_within_rounding(max_gap(ref, other), max_gap(ref, twin), what)


def assert_same_values(
    ref: Sequence[float], other: Sequence[float], twin: Sequence[float], what: str
) -> None:
    assert_within_rounding(max_value_gap(ref, other), max_value_gap(ref, twin), what)
