"""Tree inputs for stock Hugging Face models: an additive 4D mask and position ids.

One forward of the unmodified target reads a whole draft tree on top of its KV cache when given

    attention_mask  (B, 1, N, past_len + N) float: 0 where a node may attend, finfo(dtype).min where
                    it may not. Every node attends to the whole past and to its own ancestors and itself.
    position_ids    (B, N): past_len + depth, so each node is rotated as if its root-to-node path
                    were the sequence.

so the target's logits at node i are exactly those of a plain forward over past + path(root..i).

What transformers does with them (read in the 5.23 sources and pinned by tests/decode), and the traps:

- A 4D `attention_mask` is handed to the attention layers untouched (`masking_utils.
  _preprocess_mask_arguments` returns any 4D tensor as is), for both `full_attention` and
  `sliding_attention` layers. No causal mask is added on top, so ours must be complete.
- Eager attention *adds* the mask to the scores (`scores + mask`): a boolean mask is added as 0/1 and
  masks nothing, silently. sdpa would read a boolean mask as "True = attend". We always build the
  additive float form, in the model's dtype, which both read the same way.
- Neither back-end slices the mask: its last dimension must be the real KV length (the cache's
  length after this forward, past_len + N). On 5.23 any other length fails deep inside attention
  with a shape error; the decoder checks it first and says which lengths disagree.
- Flash attention (and the paged/kernel back-ends) ignore a custom mask: `check_attention_implementation`
  refuses anything but sdpa and eager.
- A sliding-window model (Mistral, Qwen2 with `use_sliding_window`) applies its window through the
  mask it builds itself, which a 4D mask replaces: `attention_window` reads the window from the config,
  and `tree_attention_mask` applies it (key at position k is seen from position q iff q - k < window,
  as in `masking_utils.sliding_window_overlay`).
- A target whose layers mix full and sliding-window attention (Gemma-2, Gemma-3, gpt-oss, Cohere2, Qwen2
  with `max_window_layers`) reads one mask per layer type: its model takes `attention_mask` as a dict
  `{"full_attention": mask, "sliding_attention": mask}` (what `generate` hands it) and gives each layer
  the mask of its `config.layer_types` entry. `attention_window` then returns the window of each type,
  and `per_layer_type` builds one mask per window; a target with a single kind gets one tensor, as before.
  The cache keeps every position on every layer (kv_cache.new_cache), so both masks cover the same keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specheads.decode.trees import DraftTree

# Attention implementations that honour a custom additive 4D mask.
SUPPORTED_ATTENTION = ("sdpa", "eager")


def check_attention_implementation(config) -> None:
    """Raise unless the model attends with sdpa or eager (flash attention ignores custom masks)."""
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"the tree decoder needs an attention implementation that honours a custom 4D mask "
            f"({' or '.join(SUPPORTED_ATTENTION)}), but the target uses {impl!r}; load it with "
            f"attn_implementation='auto' (sdpa, or eager where transformers refuses sdpa)"
        )


# Layer types a tree forward can mask; others (chunked or linear attention, recurrent layers) are refused.
FULL, SLIDING = "full_attention", "sliding_attention"

# How configs written before `layer_types` said which layers slide (Gemma-2 by cache_implementation "hybrid").
_PATTERN_KEYS = ("sliding_window_pattern", "_sliding_window_pattern")

# One window for every layer (None: full attention), or one per layer type for targets that mix them.
Window = int | None | dict[str, int | None]
# One mask for every layer, or one per layer type (the dict a mixed target's model takes).
Mask = torch.Tensor | dict[str, torch.Tensor]


def attention_window(config) -> Window:
    """The sliding window the target's layers attend with: None for full attention, the window when every
    layer slides, or {"full_attention": None, "sliding_attention": window} for targets mixing both.

    Raises:
        ValueError: for layer types other than full and sliding-window attention.
    """
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        kinds = set(layer_types)
        unknown = sorted(kinds - {FULL, SLIDING})
        if unknown:
            raise ValueError(
                f"the tree decoder masks full and sliding-window attention layers; this target also has "
                f"{unknown} layers (config.layer_types), which it cannot mask"
            )
        if kinds == {FULL}:
            return None
        if kinds == {SLIDING}:
            return window
        return {FULL: None, SLIDING: window}
    if (
        any(hasattr(config, key) for key in _PATTERN_KEYS)
        or getattr(config, "cache_implementation", None) == "hybrid"
    ):
        raise ValueError(
            f"the {config.model_type} target alternates sliding-window and full attention layers, but its config "
            f"has no layer_types to say which is which (older transformers): upgrade transformers"
        )
    if window is not None and not getattr(config, "use_sliding_window", True):
        return None
    return window


def per_layer_type(window: Window, build: Callable[[int | None], torch.Tensor]) -> Mask:
    """`build(window)` for a target with one kind of layer; {layer type: build(its window)} for a mixed one."""
    if isinstance(window, dict):
        return {kind: build(w) for kind, w in window.items()}
    return build(window)


def mask_key_lengths(mask: Mask) -> set[int]:
    """The key lengths (last dimensions) of a mask or of each layer type's mask."""
    masks = mask.values() if isinstance(mask, dict) else [mask]
    return {m.shape[-1] for m in masks}


def tree_position_ids(tree: DraftTree, past_len: int) -> torch.Tensor:
    """(B, N) positions: past_len + depth."""
    return past_len + tree.depths


def tree_attention_mask(
    tree: DraftTree, past_len: int, dtype: torch.dtype, window: int | None = None
) -> torch.Tensor:
    """(B, 1, N, past_len + N) additive mask: 0 = attend, finfo(dtype).min = masked.

    Node i attends to every past token and to its ancestors and itself; with `window`, only to keys
    fewer than `window` positions behind it.
    """
    b, n = tree.tokens.shape
    device = tree.tokens.device
    allowed = torch.cat(
        [torch.ones(b, n, past_len, dtype=torch.bool, device=device), tree.ancestors], dim=-1
    )  # (B, N, past + N)
    if window is not None:
        query_pos = tree_position_ids(tree, past_len)  # (B, N)
        key_pos = torch.cat([torch.arange(past_len, device=device).expand(b, past_len), query_pos], dim=-1)
        allowed &= (query_pos[:, :, None] - key_pos[:, None, :]) < window
    return additive_mask(allowed, dtype)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, Q, K) bool -> (B, 1, Q, K) additive float mask: 0 = attend, finfo(dtype).min = masked.

    The one place a boolean mask becomes the additive form every mask here takes (module docstring).
    """
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)[:, None]


@dataclass
class TreeInputs:
    """What the target's forward takes to read a tree.

    input_ids:      (B, N)
    attention_mask: (B, 1, N, past_len + N) additive float; one per layer type for a mixed target
    position_ids:   (B, N)
    """

    input_ids: torch.Tensor
    attention_mask: Mask
    position_ids: torch.Tensor


def tree_inputs(tree: DraftTree, past_len: int, dtype: torch.dtype, window: Window = None) -> TreeInputs:
    """Build the inputs for one target forward over `tree` after `past_len` cached tokens."""
    return TreeInputs(
        input_ids=tree.tokens,
        attention_mask=per_layer_type(window, lambda w: tree_attention_mask(tree, past_len, dtype, w)),
        position_ids=tree_position_ids(tree, past_len),
    )
