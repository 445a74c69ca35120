"""The draft heads (Medusa, EAGLE-1/2, EAGLE-3), their native checkpoints and engine formats (formats/).

Stands on core/ alone.
"""

from specheads.heads.checkpoint import load_heads, read_head_config, save_heads
from specheads.heads.eagle import (
    DRAFT_ARCHS,
    EagleConfig,
    EagleHead,
    draft_layer_config,
    layer_config_from,
    llama_layer_config_from,
)
from specheads.heads.eagle3 import (
    Eagle3Config,
    Eagle3Head,
    default_eagle3_layers,
    draft_vocab_from_counts,
    vocab_maps,
)
from specheads.heads.medusa import MedusaConfig, MedusaHeads, ResBlock

__all__ = [
    "DRAFT_ARCHS",
    "Eagle3Config",
    "Eagle3Head",
    "EagleConfig",
    "EagleHead",
    "MedusaConfig",
    "MedusaHeads",
    "ResBlock",
    "load_heads",
    "read_head_config",
    "save_heads",
    "default_eagle3_layers",
    "draft_layer_config",
    "draft_vocab_from_counts",
    "layer_config_from",
    "llama_layer_config_from",
    "vocab_maps",
]
