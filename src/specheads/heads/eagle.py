"""EAGLE-1/2 draft head (Li et al., 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty"; EAGLE-2 changes only the draft tree, see decode/dynamic_tree.py).

The head extrapolates the target's *features*, f_t = its last hidden state after the final norm (the
vector its lm_head reads; FrozenTarget layer id L). At position t it reads the feature and the token
that follows it, and predicts the next feature:

    input_t  = fc(cat(embed(x_{t+1}), f_t))         # (B, T, 2H) -> (B, T, H), embedding first
    f̂_{t+1} = layer(input_t)                        # one decoder layer, causal over positions <= t
    logits   = lm_head(f̂_{t+1})                     # the target's lm_head: predicts x_{t+2}

The label of position t is f_{t+1} (SmoothL1) and the target's own distribution at t+1, softmax(
lm_head(f_{t+1})) (soft cross-entropy); train/eagle_losses.py holds the loss and pins these shifts.
At decoding time, t is the root's predecessor: the feature f_t comes from the target and x_{t+1} is the
root, so f̂_{t+1} drafts the tokens after the root, and feeding f̂ back drafts deeper ones.

The decoder layer is built with a stock Hugging Face class (no forked modelling code), with its first
input norm replaced by the identity (the fc output goes into attention as it is, as in the reference).
Its architecture is the head config's `draft_arch`:
  * "llama": a Llama layer whatever the target's family (the layer vLLM, SGLang, speculators and the
    EAGLE repo build for a draft; SpecForge and speculators give every target one), sized from the
    target's config by `llama_layer_config_from`. What new runs train (recipe key `draft_arch`).
  * "target": a layer of the target's own family (`layer_config_from`). Heads saved before `draft_arch`
    was recorded are of this kind and load as it; only Llama-family ones export to the engines.
The target's embedding and lm_head are shared, frozen, and not stored in the head's checkpoint: callers
pass them in.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from specheads.core.hf_compat import cache_kwargs

# Keys of a target's config that describe the file, not the model; left out of a head's layer config.
_CONFIG_METADATA = ("transformers_version", "architectures", "_name_or_path", "dtype", "torch_dtype")

# The draft layer's architecture (module docstring): the engines' Llama layer, or the target's family.
DRAFT_ARCHS = ("llama", "target")


def layer_config_from(target_config) -> dict[str, Any]:
    """The target's HF config as a plain dict, to build a draft decoder layer of the same family."""
    config = target_config.to_diff_dict() if hasattr(target_config, "to_diff_dict") else dict(target_config)
    config = {k: v for k, v in config.items() if k not in _CONFIG_METADATA}
    config["model_type"] = target_config.model_type
    # to_diff_dict leaves out values equal to the class defaults; these are read by the heads.
    for key in ("hidden_size", "vocab_size", "num_hidden_layers"):
        config[key] = getattr(target_config, key)
    return config


def _llama_rope(config) -> dict[str, Any]:
    """The target's rope as a Llama config's keys, in the target config's convention.

    Per-layer-type rope (Gemma-3: a local theta for the sliding layers, a global one with the scaling for
    the full ones) gives the full-attention layers' (the draft attends to the whole context). A partial
    rotary factor (Phi-3's key, 1 in its released configs) is left out: the Llama draft layer rotates the
    whole head, as SpecForge's and speculators' do.
    """
    parameters = getattr(config, "rope_parameters", None)
    if parameters is None:  # transformers 4: top-level rope_theta / rope_scaling
        scaling = getattr(config, "rope_scaling", None)
        return {"rope_theta": float(getattr(config, "rope_theta", 10000.0)), "rope_scaling": scaling}
    parameters = dict(parameters)
    if parameters and all(isinstance(v, dict) for v in parameters.values()):  # keyed by layer type
        parameters = dict(parameters.get("full_attention") or next(iter(parameters.values())))
    parameters.pop("partial_rotary_factor", None)
    parameters.setdefault("rope_type", "default")
    return {"rope_parameters": parameters}


def llama_layer_config_from(target_config) -> dict[str, Any]:
    """A Llama decoder layer's config, sized from the target's config whatever its family.

    Taken from the target: hidden size, intermediate size, attention heads, KV heads, head dim, rope (theta
    and scaling: `_llama_rope`), RMSNorm epsilon, max positions, vocabulary and special token ids; its
    number of layers is kept too (layer ids are read against it; the built layer is one). Fixed by the
    engines' Llama draft layer: SiLU MLP (vLLM / SGLang LlamaMLP take no other), no attention or MLP
    biases (Qwen2's q/k/v biases are the target's, not the draft's), no q/k norms (Qwen3's), separate
    q/k/v projections (Phi-3's fused qkv is the target's).

    Mixture-of-experts targets get a dense MLP of the config's `intermediate_size`, as speculators'
    `create_transformer_layer_config` builds it: Qwen3-MoE's dense width (not `moe_intermediate_size`, an
    expert's), Mixtral's and gpt-oss's one expert's width (their only intermediate size).
    """
    config = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    needed = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size")
    missing = [key for key in needed if getattr(config, key, None) is None]
    if missing:
        raise ValueError(
            f"a Llama draft layer is sized from the target's config, and {type(config).__name__} has no "
            f"{missing}: train with draft_arch: target (a layer of the target's own family)"
        )
    hidden, heads = config.hidden_size, config.num_attention_heads
    layer = {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": hidden,
        "num_hidden_layers": config.num_hidden_layers,  # the target's: layer ids are read against it
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(config, "head_dim", None) or hidden // heads,
        "hidden_act": "silu",
        "rms_norm_eps": getattr(config, "rms_norm_eps", None) or 1e-6,
        "max_position_embeddings": getattr(config, "max_position_embeddings", None) or 2048,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        **_llama_rope(config),
    }
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(config, key, None) is not None:
            layer[key] = getattr(config, key)
    return layer


def draft_layer_config(target_config, draft_arch: str) -> dict[str, Any]:
    """The head's layer config for a draft layer of `draft_arch` (DRAFT_ARCHS) over this target."""
    if draft_arch == "llama":
        return llama_layer_config_from(target_config)
    if draft_arch == "target":
        return layer_config_from(target_config)
    raise ValueError(f"draft_arch must be one of {DRAFT_ARCHS}, got {draft_arch!r}")


def with_rope_theta(layer_config: dict[str, Any], theta: float) -> dict[str, Any]:
    """`layer_config` with its rotary embedding's base set to `theta`, in whichever convention it uses
    (transformers 5's `rope_parameters`, else the older top-level `rope_theta`); the scaling is kept."""
    if not theta > 0:
        raise ValueError(f"a rope theta must be > 0, got {theta}")
    config = dict(layer_config)
    if "rope_parameters" in config:
        config["rope_parameters"] = {**config["rope_parameters"], "rope_theta": float(theta)}
    else:
        config["rope_theta"] = float(theta)
    return config


def build_layer_config(layer_config: dict[str, Any], attn_implementation: str = "sdpa"):
    """A one-layer HF config of the target's family, with full attention.

    The number of layers stays the target's in `layer_config` (layer ids are read from it); the built
    config has one layer. Sliding windows are dropped: the draft's masks are always passed in full.
    """
    from transformers import AutoConfig  # lazy: transformers adds seconds to every command's start

    values = dict(layer_config)
    model_type = values.pop("model_type")
    values["num_hidden_layers"] = 1
    if "layer_types" in values:
        values["layer_types"] = ["full_attention"]
    if "use_sliding_window" in values:
        values["use_sliding_window"] = False
    if "sliding_window" in values:
        values["sliding_window"] = None
    config = AutoConfig.for_model(model_type, **values)
    config._attn_implementation = attn_implementation
    return config


def stock_layer_classes(config) -> tuple[type[nn.Module], type[nn.Module]]:
    """(decoder layer class, rotary embedding class) of a config's family, from transformers itself."""
    from transformers import AutoModelForCausalLM  # lazy: transformers adds seconds to every command's start

    try:
        model_cls = AutoModelForCausalLM._model_mapping[type(config)]
    except KeyError:
        raise TypeError(f"model_type {config.model_type!r} is not a causal LM transformers knows") from None
    prefix = model_cls.__name__.removesuffix("ForCausalLM")
    module = sys.modules[model_cls.__module__]
    layer_cls = getattr(module, f"{prefix}DecoderLayer", None)
    rotary_cls = getattr(module, f"{prefix}RotaryEmbedding", None)
    if layer_cls is None or rotary_cls is None:
        raise TypeError(
            f"EAGLE heads need a {prefix}DecoderLayer and a {prefix}RotaryEmbedding in {module.__name__}; "
            f"model_type {config.model_type!r} has no such classes"
        )
    return layer_cls, rotary_cls


def draft_embedding(config: DraftLayerConfig, embed_tokens: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """(..., ) token ids -> (..., H) the embeddings an EAGLE head of `config` reads.

    A Llama draft layer reads a plain lookup of the target's embedding table, as the engines' drafts do
    (vLLM / SGLang / speculators share the table's weights; a scale the target applies to its embeddings,
    Gemma's sqrt(H) `embed_scale`, is the target model's, not the draft's). An embedding module without a
    scale is called as it is (so that hooks on it run: ZeRO-3 gathers its sharded table in them). A head
    of the target's family ("target") reads the target's embedding module as it always has (Gemma's
    scaled one included)."""
    if config.draft_arch == "llama" and getattr(embed_tokens, "embed_scale", None) is not None:
        return nn.functional.embedding(ids, embed_tokens.weight)
    return embed_tokens(ids)


@dataclass(frozen=True)
class DraftLayerConfig:
    """What both EAGLE heads are built from: the config of their one decoder layer
    (`draft_layer_config(target.config, draft_arch)`) and its architecture (DRAFT_ARCHS).

    `draft_arch` defaults to "target": a head config saved without one (written before it was recorded)
    holds the target's own config, and loads as it was built."""

    layer_config: dict[str, Any] = field(default_factory=dict)
    draft_arch: str = "target"

    def __post_init__(self):
        missing = [k for k in ("model_type", "hidden_size", "vocab_size") if k not in self.layer_config]
        if missing:
            raise ValueError(
                f"{type(self).__name__}.layer_config lacks {missing}; build it with draft_layer_config()"
            )
        if self.draft_arch not in DRAFT_ARCHS:
            raise ValueError(f"draft_arch must be one of {DRAFT_ARCHS}, got {self.draft_arch!r}")
        if self.draft_arch == "llama" and self.layer_config["model_type"] != "llama":
            raise ValueError(
                f"draft_arch 'llama' needs a Llama layer config, got model_type "
                f"{self.layer_config['model_type']!r}; build it with llama_layer_config_from()"
            )

    @property
    def hidden_size(self) -> int:
        return self.layer_config["hidden_size"]

    @property
    def vocab_size(self) -> int:
        return self.layer_config["vocab_size"]

    @property
    def target_num_layers(self) -> int:
        return self.layer_config["num_hidden_layers"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stock_layer(self) -> tuple[nn.Module, nn.Module]:
        """(a fresh decoder layer of `layer_config`'s family, its rotary embedding), both from transformers."""
        layer_config = build_layer_config(self.layer_config)
        layer_cls, rotary_cls = stock_layer_classes(layer_config)
        # the rotary embedding has no weights: inv_freq is a non-persistent buffer
        return layer_cls(layer_config, layer_idx=0), rotary_cls(layer_config)


@dataclass(frozen=True)
class EagleConfig(DraftLayerConfig):
    """EAGLE-1/2 head: the target's config (to build the layer) and whether fc has a bias."""

    fc_bias: bool = True  # the EAGLE-1 reference has one; SGLang's format keeps it optional


class EagleHead(nn.Module):
    """fc(cat(embed(x_{t+1}), f_t)) -> one decoder layer of the target's family -> f̂_{t+1}.

    forward(features (B, T, H), input_embeds (B, T, H), position_ids (B, T), attention_mask
    (B, 1, T, past + T) additive, cache) -> (B, T, H) predicted features; `input_embeds[:, t]` must be
    the embedding of the token *after* the one whose feature is `features[:, t]`.
    """

    method = "eagle"
    config_class = EagleConfig

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=config.fc_bias)
        layer, self.rotary_emb = config.stock_layer()
        layer.input_layernorm = nn.Identity()  # EAGLE-1 has no first input norm
        self.layers = nn.ModuleList([layer])

    def embed(self, embed_tokens: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """The head's input embeddings of `ids` from the target's `embed_tokens` (draft_embedding)."""
        return draft_embedding(self.config, embed_tokens, ids)

    @property
    def capture_layers(self) -> tuple[int, ...]:
        """The target layer the head reads: L, the last hidden state after the final norm."""
        return (self.config.target_num_layers,)

    def input_hidden(self, features: dict[int, torch.Tensor]) -> torch.Tensor:
        """The target's captured features (keyed by `capture_layers`) -> the head's input f (B, T, H)."""
        return features[self.capture_layers[0]]

    def forward(
        self,
        features: torch.Tensor,
        input_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache=None,
    ) -> torch.Tensor:
        x = self.fc(torch.cat([input_embeds, features], dim=-1))  # (B, T, H)
        return self.layers[0](
            x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=cache is not None,
            **cache_kwargs(self.layers[0], cache),
            position_embeddings=self.rotary_emb(x, position_ids),  # (cos, sin)
        )

    @property
    def layer(self) -> nn.Module:
        """The decoder layer (`forward` is it over `attention_inputs`)."""
        return self.layers[0]

    def attention_inputs(
        self, features: torch.Tensor, input_embeds: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual, attention input) of the layer, both x = fc(cat(embed, f)) (B, T, H): its first norm
        is the identity. A lean forward of the layer (decode/draft_layer.py) starts from these."""
        x = self.fc(torch.cat([input_embeds, features], dim=-1))
        return x, self.layers[0].input_layernorm(x)

    @property
    def draft_vocab_size(self) -> int:
        """EAGLE-1/2 drafts over the target's whole vocabulary."""
        return self.config.vocab_size

    def logits(self, predicted: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """(..., H) predicted features -> (..., V) logits through the target's lm_head."""
        return lm_head(predicted.to(lm_head.weight.dtype))

    def to_target_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Draft ids are target ids (EAGLE-1/2 drafts over the whole vocabulary)."""
        return ids


def clone_norm(norm: nn.Module) -> nn.Module:
    """A fresh copy of a (freshly built) norm module, for a head that needs one more of the same kind."""
    return copy.deepcopy(norm)
