"""EAGLE-1/2 heads in the EAGLE repo / SGLang / vLLM layout, and the Llama draft layer EAGLE formats share.

Layout (`eagle`), as the engines read it:
    config.json         a Llama config of the one draft layer (`num_hidden_layers: 1`)
    model.safetensors   fc.weight (H, 2H), fc.bias (H,), layers.0.* without input_layernorm

Where each convention comes from:
  * SafeAILab/EAGLE eagle/model/cnets1.py: `fc = Linear(2H, H, bias=bias)` over cat(embed, feature)
    (embedding first); decoder layer 0 has no input_layernorm; the target's lm_head reads the layer
    output directly (no final norm). ea_model.py reads `bias` from config.json, default True.
  * SGLang python/sglang/srt/models/llama_eagle.py (`LlamaForCausalLMEagle`): fc is built with a bias
    always; layer 0's input_layernorm is replaced by the identity; embed and lm_head come from the
    target (eagle_worker `set_embed_and_head`).
  * vLLM vllm/model_executor/models/llama_eagle.py (`EagleLlamaForCausalLM`): fc is built *without* a
    bias and skips weights it has no parameter for; vLLM's EAGLEConfig (transformers_utils/configs/
    eagle.py) renames each architecture A to `EagleA`, so only `LlamaForCausalLM` resolves there.
  * Both engines' Llama layer turn `attention_bias` *or `bias`* on for q/k/v/o (llama.py:
    `getattr(config, "attention_bias", False) or getattr(config, "bias", False)`), so a `bias` key in
    config.json would give them attention biases the checkpoint does not have.

Hence what we write: `architectures: [LlamaForCausalLMEagle, LlamaForCausalLM]` (SGLang's and vLLM's
registries each take the first name they know), no `bias` key and `attention_bias: false`, and always an
`fc.bias` tensor (zeros for a head trained without one: identical outputs, and SGLang's always-present fc
bias gets a value).

A *nonzero* fc bias (recipe key `fc_bias: true`) would be silently dropped by vLLM, so the export refuses
it unless told what to do (`fc_bias` option, CLI `--fc-bias`):
  * "keep": write it, and name SGLang's architecture only. vLLM's EAGLEConfig renames each architecture A
    to `EagleA` (transformers_utils/configs/eagle.py), and `EagleLlamaForCausalLMEagle` is no vLLM model,
    so vLLM refuses the checkpoint instead of drafting with a different head.
  * "drop": write a zero bias: every engine reads the same head, which is no longer the trained one.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.heads.eagle import EagleConfig, EagleHead, layer_config_from
from specheads.heads.formats.io import Export, FormatError, KeyTable, head_state, read_config, read_weights

LLAMA_FAMILIES = ("llama", "mistral")  # their decoder layer is the engines' LlamaDecoderLayer, key for key

# The draft decoder layer the engines build (vLLM / SGLang LlamaDecoderLayer, EAGLE cnets LlamaDecoderLayer).
# Hin is the attention input width: H for EAGLE-1, 2H for EAGLE-3 (cat(embed, hidden)).
LLAMA_LAYER = (
    ("self_attn.q_proj.weight", ("Hq", "Hin")),
    ("self_attn.k_proj.weight", ("Hkv", "Hin")),
    ("self_attn.v_proj.weight", ("Hkv", "Hin")),
    ("self_attn.o_proj.weight", ("H", "Hq")),
    ("mlp.gate_proj.weight", ("I", "H")),
    ("mlp.up_proj.weight", ("I", "H")),
    ("mlp.down_proj.weight", ("H", "I")),
    ("post_attention_layernorm.weight", ("H",)),
)

EAGLE_KEYS = KeyTable(
    ("fc.weight", "fc.weight", ("H", "2H")),
    ("fc.bias", "fc.bias", ("H",)),
    *((f"layers.0.{k}", f"layers.0.{k}", shape) for k, shape in LLAMA_LAYER),  # no input_layernorm
)


# -- the Llama draft layer -------------------------------------------------------------------------


def layer_sizes(config: dict[str, Any], attention_input: int) -> dict[str, int]:
    """Shape names of a Llama draft layer built from a (HF-style) config dict."""
    h, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or h // heads
    kv = config.get("num_key_value_heads") or heads
    return {
        "H": h,
        "2H": 2 * h,
        "3H": 3 * h,
        "Hin": attention_input * h,
        "Hq": heads * head_dim,
        "Hkv": kv * head_dim,
        "I": config["intermediate_size"],
        "V": config["vocab_size"],
    }


def check_llama_layer(layer_config: dict[str, Any], fmt: str) -> None:
    """The engines' draft layer is a Llama layer: refuse a family that is not one."""
    family = layer_config["model_type"]
    if family not in LLAMA_FAMILIES:
        raise FormatError(
            f"format {fmt!r} holds a Llama decoder layer (SGLang / vLLM LlamaDecoderLayer); this head's layer "
            f"is a {family!r} layer (draft_arch: target, the target's own family), which has no Llama "
            f"equivalent. Train the head with draft_arch: llama (a Llama draft layer for any target, the "
            f"default of new runs); draft_arch: target exports for families {list(LLAMA_FAMILIES)} only"
        )
    if layer_config.get("hidden_act", "silu") != "silu":
        raise FormatError(
            f"format {fmt!r}: the engines' LlamaMLP supports hidden_act 'silu' only, "
            f"this head's layer uses {layer_config['hidden_act']!r}"
        )


def _rope(layer_config: dict[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling or None) from either transformers convention."""
    if "rope_parameters" in layer_config:
        rp = dict(layer_config["rope_parameters"])
        theta = rp.pop("rope_theta", 10000.0)
        return theta, (rp if rp.get("rope_type", "default") != "default" else None)
    return layer_config.get("rope_theta", 10000.0), layer_config.get("rope_scaling")


def llama_draft_config(layer_config: dict[str, Any]) -> dict[str, Any]:
    """The Llama config of the one draft layer, as vLLM / SGLang / the EAGLE repo read it.

    rope is written both ways: `rope_theta` / `rope_scaling` (transformers 4.x, what the engines pin) and
    `rope_parameters` (transformers 5), so either reader builds the same rotary embedding.
    """
    h, heads = layer_config["hidden_size"], layer_config["num_attention_heads"]
    theta, scaling = _rope(layer_config)
    config = {
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": layer_config["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": layer_config.get("num_key_value_heads") or heads,
        "head_dim": layer_config.get("head_dim") or h // heads,
        "hidden_act": layer_config.get("hidden_act", "silu"),
        "rms_norm_eps": layer_config.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": layer_config.get("max_position_embeddings", 2048),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "vocab_size": layer_config["vocab_size"],
        "num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
    }
    if "rope_parameters" in layer_config:
        config["rope_parameters"] = dict(layer_config["rope_parameters"])
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if layer_config.get(key) is not None:
            config[key] = layer_config[key]
    return config


def import_layer_config(draft: dict[str, Any], target: FrozenTarget, what: str) -> dict[str, Any]:
    """Our head's layer config for an official Llama draft layer `draft` read against `target`.

    Sizes of the target (hidden, vocabulary, number of layers) come from the target; the draft layer's own
    sizes (heads, MLP width, rope, norm eps) from the checkpoint. The draft must be one layer (the heads here
    have one) and read the target's width.
    """
    if draft.get("num_hidden_layers", 1) != 1:
        raise FormatError(f"{what}: {draft['num_hidden_layers']} draft layers; the heads here have one")
    if draft.get("model_type", "llama") not in LLAMA_FAMILIES:
        raise FormatError(f"{what}: draft layer model_type {draft.get('model_type')!r} is not a Llama layer")
    if draft.get("hidden_size") != target.hidden_size:
        raise FormatError(
            f"{what}: the draft layer is {draft.get('hidden_size')} wide, the target's hidden size is "
            f"{target.hidden_size}"
        )
    if draft.get("vocab_size", target.vocab_size) != target.vocab_size:
        raise FormatError(
            f"{what}: vocab_size {draft['vocab_size']}, the target's vocabulary has {target.vocab_size} tokens"
        )
    for key in ("attention_bias", "mlp_bias"):
        if draft.get(key):
            raise FormatError(f"{what}: {key}: true; the heads here build a Llama layer without biases")
    heads = draft["num_attention_heads"]
    layer = {
        "model_type": "llama",
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "num_hidden_layers": target.num_layers,  # the target's: layer ids are read against it
        "intermediate_size": draft["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": draft.get("num_key_value_heads") or heads,
        "head_dim": draft.get("head_dim") or draft["hidden_size"] // heads,
        "hidden_act": draft.get("hidden_act", "silu"),
        "rms_norm_eps": draft.get("rms_norm_eps", 1e-6),
        "max_position_embeddings": draft.get("max_position_embeddings", 2048),
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }
    modern = "rope_parameters" in layer_config_from(target.config)  # the installed transformers' convention
    if "rope_parameters" in draft:
        rp = dict(draft["rope_parameters"])
    else:
        theta, scaling = draft.get("rope_theta", 10000.0), draft.get("rope_scaling")
        rp = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
        rp["rope_type"] = rp.pop("type", rp["rope_type"])
    if modern:
        layer["rope_parameters"] = rp
    else:
        theta, scaling = _rope({"rope_parameters": rp})
        layer["rope_theta"], layer["rope_scaling"] = theta, scaling
    return layer


def check_shared_weights(tensors: dict[str, torch.Tensor], target: FrozenTarget, what: str) -> None:
    """Drop the embedding a draft checkpoint may carry (the engines share the target's); check its shape,
    and warn when its values are not the target's: the EAGLE repo's EaModel drafts with the checkpoint's own
    copy, SGLang / vLLM and the heads here with the target's, so the drafts would differ (a checkpoint
    made against another target of the same shape)."""
    embed = tensors.pop("embed_tokens.weight", None)
    if embed is None:
        return
    expected = (target.vocab_size, target.hidden_size)
    if tuple(embed.shape) != expected:
        raise FormatError(f"{what}: embed_tokens.weight is {tuple(embed.shape)}, the target's is {expected}")
    ours = target.embed_tokens.weight.detach().to("cpu", torch.float32)
    diff = float((embed.float() - ours).abs().max())
    # the same weights stored in another float type differ by a rounding of the coarser of the two
    eps = max(torch.finfo(embed.dtype).eps, torch.finfo(target.embed_tokens.weight.dtype).eps)
    if diff > eps * float(ours.abs().max()):
        warnings.warn(
            f"{what}: its embed_tokens.weight is not the target's (max |diff| {diff:.3g}): the heads here "
            "and the engines use the target's embedding, the EAGLE repo's EaModel the checkpoint's own, so "
            "their drafts differ. Was it made for another target?",
            stacklevel=2,
        )


# -- EAGLE-1/2 -------------------------------------------------------------------------------------


FC_BIAS_CHOICES = ("keep", "drop")
SGLANG_ONLY = ["LlamaForCausalLMEagle"]
EVERY_ENGINE = ["LlamaForCausalLMEagle", "LlamaForCausalLM"]  # SGLang's name, then vLLM's


def _fc_bias_for_engines(
    state: dict[str, torch.Tensor], hidden_size: int, fc_bias: str | None
) -> tuple[list[str], list[str]]:
    """Put the fc bias the engines will read into `state`; return (architectures, notes).

    A nonzero bias is refused unless `fc_bias` says to keep it (SGLang / EAGLE repo only) or drop it.
    """
    if fc_bias not in (None, *FC_BIAS_CHOICES):
        raise FormatError(f"fc_bias option must be one of {FC_BIAS_CHOICES} or unset, got {fc_bias!r}")
    bias = state.get("fc.bias")
    if bias is None or not bias.any():
        state["fc.bias"] = torch.zeros(hidden_size, dtype=state["fc.weight"].dtype)
        return EVERY_ENGINE, []
    largest = float(bias.abs().max())
    if fc_bias is None:
        raise FormatError(
            f"format 'eagle': these heads were trained with a nonzero fc bias (recipe key fc_bias: true; "
            f"max |bias| {largest:.3g}). vLLM's EagleLlamaForCausalLM (llama_eagle.py) builds fc without a "
            "bias and skips fc.bias, so vLLM would draft with another head than this one. Train with "
            "fc_bias=false for a head every engine reads alike, or export with --fc-bias keep (SGLang and "
            "the EAGLE repo apply it; vLLM then refuses the checkpoint) or --fc-bias drop (a zero bias: "
            "every engine reads the same head, no longer the trained one)"
        )
    if fc_bias == "drop":
        state["fc.bias"] = torch.zeros_like(bias)
        return EVERY_ENGINE, [
            f"fc bias dropped (max |bias| {largest:.3g}): drafts differ from the trained head's"
        ]
    return SGLANG_ONLY, [
        "fc bias kept: architectures names SGLang's LlamaForCausalLMEagle only, so vLLM (no fc bias) "
        "refuses the checkpoint rather than drop the bias"
    ]


def to_eagle(
    heads: nn.Module,
    native_config: dict[str, Any],
    target: FrozenTarget | None = None,
    dtype=None,
    fc_bias: str | None = None,
) -> Export:
    """An EagleHead as an `eagle` checkpoint (EAGLE repo names, SGLang / vLLM loadable).

    Args:
        fc_bias: what to do with a nonzero fc bias, which vLLM cannot hold: None refuses it, "keep" writes
            it for SGLang and the EAGLE repo only, "drop" writes a zero bias (see the module docstring).
    """
    state = head_state(heads, "eagle", "eagle")
    layer_config = heads.config.layer_config
    check_llama_layer(layer_config, "eagle")
    architectures, notes = _fc_bias_for_engines(state, heads.config.hidden_size, fc_bias)
    tensors = EAGLE_KEYS.to_engine(state, layer_sizes(layer_config, 1), "eagle export")
    config = {"architectures": architectures, **llama_draft_config(layer_config)}
    record = {"fc_bias": heads.config.fc_bias, "fc_bias_export": fc_bias, "notes": list(notes)}
    return Export.build("eagle", native_config, config, tensors, dtype, notes, record)


def from_eagle(path, target: FrozenTarget) -> EagleHead:
    """An `eagle` checkpoint (official EAGLE-1/2 or ours) as an EagleHead reading `target`."""
    what = f"EAGLE checkpoint {path}"
    layer_config = import_layer_config(read_config(path), target, what)
    # official EAGLE-1 checkpoints ship pytorch_model.bin, SGLang / vLLM conversions safetensors: both are read
    tensors, _ = read_weights(path)
    check_shared_weights(tensors, target, what)
    if "lm_head.weight" in tensors:
        raise FormatError(
            f"{what}: has its own lm_head.weight; EAGLE-1/2 heads here read the target's lm_head"
        )
    bias = tensors.get("fc.bias")
    fc_bias = bias is not None and bool(bias.any())  # an all-zero bias is no bias: identical outputs
    if bias is not None and not fc_bias:
        del tensors["fc.bias"]
    table = EAGLE_KEYS if fc_bias else EAGLE_KEYS.without("fc.bias")
    state = table.to_native(tensors, layer_sizes(layer_config, 1), what)
    head = EagleHead(EagleConfig(layer_config, draft_arch="llama", fc_bias=fc_bias))
    head.load_state_dict(state, strict=True)
    return head.eval()
