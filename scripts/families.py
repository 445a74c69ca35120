"""The model families the engines serve, as tiny random configs built offline (nothing is downloaded).

One place for the list: the engine load check (scripts/check_engines.py --families) and any table of what
each family supports read it. Each family is its transformers `model_type`, the overrides that keep its
config tiny and shaped like the released models (a few small experts for the mixtures of experts, layers
alternating sliding-window and full attention where the family mixes them) and the attention
implementation transformers accepts for it (eager where SDPA is refused).

    from scripts.families import FAMILIES, tiny_config, tiny_target
    config = tiny_config("qwen3_moe")                    # a 4-layer, 64-wide random Qwen3-MoE config
    tiny_target("gemma2", "targets/gemma2")              # its random model saved as an HF directory
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the sliding-window families' tiny layer pattern: sliding and full attention alternate, window 8
MIXED_LAYERS = ("sliding_attention", "full_attention", "sliding_attention", "full_attention")


@dataclass(frozen=True)
class Family:
    """A family's tiny config: its transformers model_type, overrides of the shared tiny sizes
    (`tiny_config`), and the attention implementation transformers builds it with on CPU."""

    model_type: str
    overrides: dict[str, Any] = field(default_factory=dict)
    attn_implementation: str = "sdpa"
    what: str = ""


# the sizes every family's tiny config shares (tests/helpers.py builds its tiny models from them too)
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
    bos_token_id=256,
    eos_token_id=257,
    pad_token_id=258,
)

_MIXED = {"layer_types": list(MIXED_LAYERS), "sliding_window": 8}

FAMILIES: dict[str, Family] = {
    "llama": Family("llama", what="Llama: the engines' own draft family"),
    "mistral": Family(
        "mistral", {"sliding_window": None}, what="Mistral (full attention, as Mistral-7B v0.2+)"
    ),
    "qwen2": Family("qwen2", what="Qwen2 / Qwen2.5: q/k/v biases"),
    "qwen3": Family("qwen3", {"head_dim": 16}, what="Qwen3: q/k norms"),
    "qwen3_moe": Family(
        "qwen3_moe",
        {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
        what="Qwen3-MoE: mixture of experts",
    ),
    "mixtral": Family(
        "mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, what="Mixtral: mixture of experts"
    ),
    "gemma2": Family(
        "gemma2",
        {"head_dim": 16, **_MIXED},
        "eager",
        "Gemma-2: sliding and full attention, softcapped scores (SDPA refused)",
    ),
    "gemma3_text": Family(
        "gemma3_text",
        {"head_dim": 16, **_MIXED},
        what="Gemma-3 text: sliding and full attention, a rope theta per layer type",
    ),
    "phi3": Family("phi3", what="Phi-3: fused qkv and gate/up projections"),
    "smollm2": Family(
        "llama",
        {"tie_word_embeddings": True, "rope_theta": 1e5},
        what="SmolLM2's shape: a Llama with tied embeddings, rope theta 1e5",
    ),
    "gpt_oss": Family(
        "gpt_oss",
        {
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "max_position_embeddings": 131072,
            **_MIXED,
        },
        "eager",
        "gpt-oss: mixture of experts, sliding and full attention, attention sinks (SDPA refused)",
    ),
}


def tiny_config(family: str, vocab_size: int = 264, **overrides):
    """A 4-layer, 64-wide random config of `family` (a FAMILIES key), GQA with 2 KV heads."""
    from transformers import AutoConfig

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(FAMILIES)}")
    kwargs = dict(vocab_size=vocab_size, **TINY)
    kwargs.update(FAMILIES[family].overrides)
    kwargs.update(overrides)
    return AutoConfig.for_model(FAMILIES[family].model_type, **kwargs)


def tiny_model(family: str, seed: int = 0, **overrides):
    """A random fp32 model of `tiny_config(family, **overrides)`, with the family's attention."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = tiny_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=FAMILIES[family].attn_implementation, dtype=torch.float32
    )
    return model.eval()


def tiny_target(family: str, path: str | Path, seed: int = 0, **overrides) -> Path:
    """`tiny_model(family)` saved as an HF directory at `path` (weights and config; no tokenizer)."""
    model = tiny_model(family, seed=seed, **overrides)
    model.save_pretrained(path)
    return Path(path)
