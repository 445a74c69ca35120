"""Medusa heads in the FasterDecoding v0.1 layout (`medusa`: TGI, TensorRT-LLM) and vLLM's (`vllm-medusa`).

`medusa`:
    config.json                   medusa_num_heads, medusa_num_layers, base_model_name_or_path
    medusa_lm_head.safetensors    {h}.{l}.linear.weight (H, H), {h}.{l}.linear.bias (H,), {h}.{L}.weight (V, H)
    medusa_lm_head.pt             the same tensors, torch.save'd: FasterDecoding's own
                                  `MedusaModel.from_pretrained` reads only this file

  FasterDecoding/Medusa medusa/model/medusa_model.py: head h is
  `nn.Sequential(*[ResBlock(H)] * L, nn.Linear(H, V, bias=False))`, so block l is `{h}.{l}` and the
  head's own lm_head is index L. TGI server/text_generation_server/layers/medusa.py (`MedusaHeadV1`)
  reads exactly these names from medusa_lm_head.safetensors, sizes from config.json; its
  layers/speculative.py disables speculation when config.json has an `architectures` key that is not
  the MLP speculator's, so none is written. TensorRT-LLM tensorrt_llm/models/medusa/weight.py
  (`load_medusa_hf`) reads medusa_lm_head.pt or .safetensors with the same names; its
  examples/medusa/convert_checkpoint.py writes its engine config from --num_medusa_heads (default 4) and
  --num_medusa_layers (default 1) before it reads our config.json, so the export notes give both flags.

`vllm-medusa`:
    config.json          model_type medusa, architectures [MedusaModel], hidden_size, vocab_size,
                         num_heads, num_hidden_layers, medusa_fc_bias
    model.safetensors    blocks.{h}.layers.{l}.weight / .bias, lm_heads.{h}.weight

  vLLM vllm/model_executor/models/medusa.py (gone by vLLM 0.33.0: neither the file nor a MedusaModel
  registry entry ships in its wheel; scripts/check_engines.py): `ResidualBlock.layers[l]` is
  Linear(H, H, bias=medusa_fc_bias) (default False, so true is written), x + SiLU(W x + b) per layer;
  one lm_head per head unless `original_lm_head`. vllm/transformers_utils/configs/medusa.py renames any
  top-level key holding "num" and "heads" / "layers", so no other top-level key holds "num" (our
  provenance is one nested block).

Offsets agree everywhere: head k reads the target's last hidden state (after the final norm) at t and
proposes token t+2+k. Heads that share the target's lm_head need the target to be exported: `medusa` writes
one copy of it per head (its three readers build one lm_head per head and have no shared form), `vllm-medusa`
one copy in all, `lm_heads.0.weight` with `original_lm_head: true` (vLLM's MedusaModel then builds a single
lm_head for every head, and its load_weights reads that key into it).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.heads.formats.io import Export, FormatError, KeyTable, head_state, read_config, read_weights
from specheads.heads.medusa import MedusaConfig, MedusaHeads

MEDUSA_KEYS = KeyTable(
    ("blocks.{h}.{l}.linear.weight", "{h}.{l}.linear.weight", ("H", "H")),
    ("blocks.{h}.{l}.linear.bias", "{h}.{l}.linear.bias", ("H",)),
    ("lm_heads.{h}.weight", "{h}.{L}.weight", ("V", "H")),
)
VLLM_MEDUSA_KEYS = KeyTable(
    ("blocks.{h}.{l}.linear.weight", "blocks.{h}.layers.{l}.weight", ("H", "H")),
    ("blocks.{h}.{l}.linear.bias", "blocks.{h}.layers.{l}.bias", ("H",)),
    ("lm_heads.{h}.weight", "lm_heads.{h}.weight", ("V", "H")),
)
MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"
MEDUSA_TORCH_WEIGHTS = "medusa_lm_head.pt"  # medusa_model.py v0.1 from_pretrained: torch.load of this name


def _medusa_state(heads: nn.Module, fmt: str, target: FrozenTarget | None) -> tuple[dict, dict[str, int]]:
    """(native state with one lm_head per head, sizes): shared lm_heads become copies of the target's."""
    state = head_state(heads, "medusa", fmt)
    cfg = heads.config
    if cfg.share_lm_head:
        if target is None:
            raise FormatError(
                f"format {fmt!r} stores one lm_head per Medusa head; these heads share the target's lm_head, "
                "which is not in the checkpoint: pass --target to write copies of it"
            )
        dtype = next(heads.parameters()).dtype
        weight = target.lm_head.weight.detach().to("cpu", dtype)
        if tuple(weight.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise FormatError(
                f"the target's lm_head is {tuple(weight.shape)}, the heads expect ({cfg.vocab_size}, {cfg.hidden_size})"
            )
        for h in range(cfg.num_heads):
            state[f"lm_heads.{h}.weight"] = weight.clone()
    sizes = {"heads": cfg.num_heads, "layers": cfg.num_layers, "H": cfg.hidden_size, "V": cfg.vocab_size}
    return state, sizes


def _engine_tensors(heads: nn.Module, fmt: str, keys: KeyTable, target: FrozenTarget | None):
    """The heads' tensors under `fmt`'s names (`keys`), and their config."""
    state, sizes = _medusa_state(heads, fmt, target)
    return keys.to_engine(state, sizes, f"{fmt} export"), heads.config


def to_medusa(
    heads: nn.Module, native_config: dict[str, Any], target: FrozenTarget | None = None, dtype=None
) -> Export:
    """MedusaHeads as a FasterDecoding v0.1 checkpoint (TGI `--model-id DIR`, TensorRT-LLM convert)."""
    tensors, cfg = _engine_tensors(heads, "medusa", MEDUSA_KEYS, target)
    notes = [
        f"TensorRT-LLM: examples/medusa/convert_checkpoint.py --medusa_model_dir DIR "
        f"--num_medusa_heads {cfg.num_heads} --num_medusa_layers {cfg.num_layers}"
    ]
    if cfg.num_layers > 1:
        notes.append(
            "FasterDecoding's own MedusaModel builds `[ResBlock(H)] * medusa_num_layers` (one block repeated), "
            "so it keeps only one block per head; TGI and TensorRT-LLM read every block"
        )
    config = {
        "medusa_num_heads": cfg.num_heads,
        "medusa_num_layers": cfg.num_layers,
        "base_model_name_or_path": (native_config.get("target") or {}).get("name_or_path"),
    }
    record = {"share_lm_head": cfg.share_lm_head}
    return Export.build(
        "medusa", native_config, config, tensors, dtype, notes, record, MEDUSA_WEIGHTS, MEDUSA_TORCH_WEIGHTS
    )


def to_vllm_medusa(
    heads: nn.Module, native_config: dict[str, Any], target: FrozenTarget | None = None, dtype=None
) -> Export:
    """MedusaHeads as a vLLM `MedusaModel` checkpoint."""
    tensors, cfg = _engine_tensors(heads, "vllm-medusa", VLLM_MEDUSA_KEYS, target)
    if cfg.share_lm_head:  # vLLM's original_lm_head: one lm_head for every head, read from lm_heads.0
        for h in range(1, cfg.num_heads):
            del tensors[f"lm_heads.{h}.weight"]
    config = {
        "model_type": "medusa",
        "architectures": ["MedusaModel"],
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "num_heads": cfg.num_heads,
        "num_hidden_layers": cfg.num_layers,
        "medusa_fc_bias": True,
        "truncated_vocab_size": cfg.vocab_size,
        "original_lm_head": cfg.share_lm_head,
    }
    notes = [
        "vLLM 0.33.0 ships no MedusaModel (model_executor/models/medusa.py is gone): this layout loads in the "
        "vLLM releases that still have it; for current engines export --format medusa (TGI, TensorRT-LLM)"
    ]
    record = {"share_lm_head": cfg.share_lm_head}
    return Export.build("vllm-medusa", native_config, config, tensors, dtype, notes, record)


# -- import ----------------------------------------------------------------------------------------


def _count(tensors: dict[str, torch.Tensor], template: str, limit: int = 10_000) -> int:
    """How many consecutive indices i from 0 have `template.format(i)` in `tensors`."""
    n = 0
    while n < limit and template.format(n) in tensors:
        n += 1
    return n


def _build(heads_cfg: MedusaConfig, state: dict[str, torch.Tensor]) -> MedusaHeads:
    heads = MedusaHeads(heads_cfg)
    heads.load_state_dict(state, strict=True)
    return heads.eval()


def from_medusa(path, target: FrozenTarget) -> MedusaHeads:
    """A FasterDecoding Medusa checkpoint (v0.1, or v0 without per-head lm_heads) as MedusaHeads."""
    config = read_config(path)
    tensors, file = read_weights(path, (MEDUSA_WEIGHTS, MEDUSA_TORCH_WEIGHTS))
    what = f"Medusa checkpoint {file} (against target {target.name_or_path})"
    if "medusa_num_heads" not in config:
        raise FormatError(
            f"{path}/config.json has no medusa_num_heads: not a FasterDecoding Medusa checkpoint"
        )
    num_heads, num_layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    found_layers = _count(tensors, "0.{}.linear.weight")
    if found_layers != num_layers:
        raise FormatError(
            f"{what}: config.json says medusa_num_layers {num_layers}, head 0 has {found_layers} residual blocks"
        )
    found_heads = _count(tensors, "{}.0.linear.weight")
    if found_heads != num_heads:
        raise FormatError(
            f"{what}: config.json says medusa_num_heads {num_heads}, the weights hold {found_heads}"
        )
    # v0 checkpoints (medusa_model_legacy.py) have no lm_head per head: the target's is used.
    share = not any(f"{h}.{num_layers}.weight" in tensors for h in range(num_heads))
    table = MEDUSA_KEYS.without("lm_heads.") if share else MEDUSA_KEYS
    sizes = {"heads": num_heads, "layers": num_layers, "H": target.hidden_size, "V": target.vocab_size}
    state = table.to_native(tensors, sizes, what)
    return _build(MedusaConfig(target.hidden_size, target.vocab_size, num_heads, num_layers, share), state)


def from_vllm_medusa(path, target: FrozenTarget) -> MedusaHeads:
    """A vLLM MedusaModel checkpoint as MedusaHeads (no bias: zero biases; original_lm_head: copies)."""
    config = read_config(path)
    tensors, file = read_weights(path)
    what = f"vLLM Medusa checkpoint {file} (against target {target.name_or_path})"
    tensors = {k.removeprefix("medusa_heads."): v for k, v in tensors.items()}  # as vLLM's load_weights
    # vLLM's MedusaConfig.from_pretrained: any key with "num" and "heads" / "layers" names the sizes
    num_heads = next((v for k, v in config.items() if "num" in k and "heads" in k), None)
    num_layers = next((v for k, v in config.items() if "num" in k and "layers" in k), 1)
    if num_heads is None:
        raise FormatError(f"{path}/config.json names no number of heads (num_heads)")
    if config.get("truncated_vocab_size", target.vocab_size) != target.vocab_size or "token_map" in tensors:
        raise FormatError(f"{what}: a truncated vocabulary (token_map) is not supported by MedusaHeads")
    num_heads, num_layers = int(num_heads), int(num_layers)
    hidden = target.hidden_size
    if not config.get("medusa_fc_bias", False):
        for h in range(num_heads):
            for layer in range(num_layers):
                tensors.setdefault(f"blocks.{h}.layers.{layer}.bias", torch.zeros(hidden))
    if config.get("original_lm_head", False):
        shared = tensors.pop("lm_heads.0.weight", None)
        if shared is None:
            raise FormatError(f"{what}: original_lm_head is set but lm_heads.0.weight is missing")
        tensors.update({f"lm_heads.{h}.weight": shared.clone() for h in range(num_heads)})
    sizes = {"heads": num_heads, "layers": num_layers, "H": hidden, "V": target.vocab_size}
    state = VLLM_MEDUSA_KEYS.to_native(tensors, sizes, what)
    return _build(MedusaConfig(hidden, target.vocab_size, num_heads, num_layers, False), state)
