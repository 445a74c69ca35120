"""Decoding: trees, tree inputs, verification, drafters, the one speculative step and the decoders."""

from specheads.decode.batched import BatchedSpeculativeDecoder, as_batched
from specheads.decode.batched_inputs import left_pad
from specheads.decode.decoder import DecodeOutput, SpeculativeDecoder, eos_ids
from specheads.decode.drafters import CHILDREN, DraftContext, Drafter, MedusaDrafter, SampledTree
from specheads.decode.dynamic_tree import Candidates, dynamic_tree, grow_candidates, rerank
from specheads.decode.eagle_drafter import EagleDrafter
from specheads.decode.kv_cache import compact_cache, new_cache
from specheads.decode.sampling import SamplingParams, sampling_probs
from specheads.decode.step import SamplingOptions
from specheads.decode.tree_inputs import (
    TreeInputs,
    attention_window,
    check_attention_implementation,
    tree_attention_mask,
    tree_inputs,
    tree_position_ids,
)
from specheads.decode.trees import (
    DEFAULT_TREES,
    DraftTree,
    StaticTree,
    ancestor_mask,
    build_tree,
    default_tree,
    expected_accept_length,
)
from specheads.decode.verify import (
    Acceptance,
    TypicalAcceptance,
    verify_greedy,
    verify_sampling,
    verify_typical,
)

__all__ = [
    "Acceptance",
    "BatchedSpeculativeDecoder",
    "CHILDREN",
    "Candidates",
    "DEFAULT_TREES",
    "DecodeOutput",
    "DraftContext",
    "DraftTree",
    "Drafter",
    "EagleDrafter",
    "MedusaDrafter",
    "SampledTree",
    "SamplingOptions",
    "SamplingParams",
    "SpeculativeDecoder",
    "StaticTree",
    "TreeInputs",
    "TypicalAcceptance",
    "ancestor_mask",
    "as_batched",
    "attention_window",
    "build_tree",
    "check_attention_implementation",
    "compact_cache",
    "default_tree",
    "dynamic_tree",
    "eos_ids",
    "expected_accept_length",
    "grow_candidates",
    "left_pad",
    "new_cache",
    "rerank",
    "sampling_probs",
    "tree_attention_mask",
    "tree_inputs",
    "tree_position_ids",
    "verify_greedy",
    "verify_sampling",
    "verify_typical",
]
