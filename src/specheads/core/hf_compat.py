"""The KV cache's keyword across transformers releases.

transformers 5.x renamed the cache argument of its models, decoder layers and attention modules from
`past_key_values` to `cache` (and the output field likewise); the old name is accepted with a
FutureWarning until 5.40, and after that an attention module's `**kwargs` would swallow it silently: the
KV cache would go unused, not fail. specheads supports transformers from 4.45, where only the old name
exists, so every call that hands a cache to a stock module names it by what that module's `forward` takes.
"""

from __future__ import annotations

import inspect
from functools import cache

from torch import nn

NEW, OLD = "cache", "past_key_values"
_MISSING = object()


@cache
def _installed_keyword() -> str:
    """The name the installed transformers' own models take (for wrappers that pass **kwargs through)."""
    from transformers.models.llama.modeling_llama import LlamaModel  # lazy: transformers loads slowly

    return _cache_keyword(LlamaModel)


@cache
def _cache_keyword(forward_type: type) -> str:
    params = inspect.signature(forward_type.forward).parameters
    if NEW in params:
        return NEW
    if OLD in params:
        return OLD
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return _installed_keyword()  # a wrapper (peft, accelerate) hands **kwargs to a stock model
    raise TypeError(
        f"{forward_type.__name__}.forward takes neither `{NEW}` nor `{OLD}`: cannot hand it a KV cache "
        f"(its parameters: {', '.join(params)})"
    )


def cache_kwargs(module: nn.Module, cache_object) -> dict:
    """{keyword: cache_object} under the name `module`'s forward takes its KV cache by."""
    return {_cache_keyword(type(module)): cache_object}


def output_cache(output):
    """The cache a model output carries (`cache` from transformers 5.x, `past_key_values` before), or None."""
    # An output that has the new field answers by it, None included: reading the old name of such an
    # output goes through transformers' backward-compatibility property, which logs a deprecation warning.
    found = getattr(output, NEW, _MISSING)
    return getattr(output, OLD, None) if found is _MISSING else found
