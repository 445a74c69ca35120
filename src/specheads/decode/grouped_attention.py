"""Grouped-query attention in the tree forward without copying the cache (CPU).

For a grouped-query target (fewer key/value heads than query heads), transformers' sdpa attention expands the
cached keys and values to every query head (`repeat_kv`). That is a copy of the layer's whole cache, on every
layer, in every forward over more than one token with a mask, which means every tree forward. Its cost grows
with the context, not with the tree. `generate()`'s one-token steps skip the copy, so the decoder paid it and
its baseline did not.

torch's sdpa attends grouped heads itself (`enable_gqa`, torch >= 2.5), and on the CPU the result is
bit-identical to the expanded one. transformers takes that route for every sdpa call while
TRANSFORMERS_SDPA_FORCE_GQA=1. The decoder sets it for its tree forward only:

    grouped = grouped_attention_for(target)   # False where it does not apply: CUDA (sdpa with a mask and
                                              # enable_gqa runs the unfused math kernel there), eager
                                              # attention, a target without grouped heads, a transformers
                                              # or torch without the route, switched off
    with forced_grouped_attention() if grouped else nullcontext():
        target(...)

SmolLM2-135M (9 query heads, 3 key/value heads), fp32, 1 thread, the machine loaded: one tree forward took
1.09-1.13x as long without it over 300 cached tokens, and 1.13-1.23x over 900, with equal logits.
`SPECHEADS_GROUPED_ATTENTION=0` turns it off (the A/B switch of the benchmarks). The variable is the
process's: another thread's sdpa call during a tree forward takes the same route, with the same results
(on CUDA more slowly).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

try:
    from transformers.integrations.sdpa_attention import use_gqa_in_sdpa
except ImportError:  # a transformers before the attention integrations: the route is not there
    use_gqa_in_sdpa = None

ENV = "SPECHEADS_GROUPED_ATTENTION"
FORCE = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers' own switch, read on every sdpa call


@contextmanager
def forced_grouped_attention() -> Iterator[None]:
    """Within the block, transformers' sdpa attention attends grouped heads without expanding the cache;
    the variable is put back as it was afterwards, also after an error."""
    previous = os.environ.get(FORCE)
    os.environ[FORCE] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(FORCE, None)
        else:
            os.environ[FORCE] = previous


@functools.cache
def supported() -> bool:
    """Whether this torch and transformers route sdpa calls with a mask to `enable_gqa` when forced: asked
    of transformers' own decision function, so a version without the switch is simply left alone."""
    torch_version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if use_gqa_in_sdpa is None or torch_version < (2, 5):  # sdpa's enable_gqa came with torch 2.5
        return False
    mask, key = torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 8)
    with forced_grouped_attention():
        for args in ((mask, key, key), (mask, key)):  # its signature changed across versions
            try:
                return use_gqa_in_sdpa(*args) is True
            except TypeError:
                continue
    return False


def grouped_attention_for(target) -> bool:
    """Whether the tree forward of this FrozenTarget should attend grouped heads directly: on the CPU, with
    sdpa attention and fewer key/value heads than query heads, unless switched off."""
    if os.environ.get(ENV, "1") == "0" or target.device.type != "cpu":
        return False
    config = target.config
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if getattr(config, "_attn_implementation", None) != "sdpa" or not heads or kv_heads >= heads:
        return False
    return supported()
