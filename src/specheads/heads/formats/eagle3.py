"""EAGLE-3 heads in the SGLang / vLLM layout (`eagle3`) and the vLLM speculators layout (`speculators`).

`eagle3` (SGLang python/sglang/srt/models/llama_eagle3.py `LlamaForCausalLMEagle3`; vLLM
vllm/model_executor/models/llama_eagle3.py `Eagle3LlamaForCausalLM`, registered under that name too):
    config.json   Llama config of the draft layer + draft_vocab_size,
                  eagle_config.eagle_aux_hidden_state_layer_ids (SGLang), eagle_aux_hidden_state_layer_ids (vLLM)
    weights       fc.weight (H, 3H), midlayer.* (q/k/v read 2H; input_layernorm and hidden_norm),
                  norm.weight, lm_head.weight (Vd, H), d2t (Vd,) int64, t2d (V,) bool
                  (import also reads layers.0.* for midlayer.*, and no t2d: NVIDIA Model Optimizer's
                  export_speculative_decoding writes so; vLLM reads both names)

`speculators` (vllm-project/speculators src/speculators/models/eagle3; read by vLLM
vllm/transformers_utils/configs/speculators/{base,algos}.py):
    config.json   speculators_model_type "eagle3", transformer_layer_config, draft_vocab_size,
                  norm_before_residual, target_hidden_size, eagle_aux_hidden_state_layer_ids,
                  speculators_config {algorithm, proposal_methods, default_proposal_method, verifier}
    weights       as above with layers.0.* in place of midlayer.* (vLLM renames midlayer. to layers.0.),
                  and embed_tokens.weight (V, H), the target's, when the export is given the target:
                  speculators' own checkpoints carry it, and its Eagle3DraftModel.from_pretrained (0.9.0,
                  transformers 5.19 and 5.24) leaves a missing one uninitialised (its NaN "load from the
                  verifier" sentinel does not survive transformers' loading); vLLM loads it or, equal to
                  the target's, shares the target's

Conventions, and which way each engine reads them:
  * Layer ids. We store Hugging Face `hidden_states` indexing (FrozenTarget's). SGLang adds one to
    `eagle_config.eagle_aux_hidden_state_layer_ids` (`set_eagle3_layers_to_capture`: `val + 1`) and
    captures the residual stream *entering* decoder layer i, i.e. HF id i: so SGLang's ids are ours minus
    one (the default (2, L//2, L-3) is its (1, L//2-1, L-4)); SpecForge and ModelOpt write that
    convention. vLLM reads the top-level `eagle_aux_hidden_state_layer_ids` as is
    (gpu_model_runner `_get_eagle3_aux_layers_from_config`) and captures before layer idx
    (llama.py `if idx in self.aux_hidden_state_layers`): HF ids. We write both keys. Engines capture
    pre-norm streams entering layers 1..L-1 only, so ids 0 (embeddings) and L (after the final norm)
    cannot be exported. (SGLang PR #25454 applies its +1 only when the first id is 1; ids whose lowest
    layer is not HF 2 may be read differently by SGLang builds after it; provenance keeps our ids.)
  * norm_before_residual. Our layer keeps the raw fc output as the residual and normalises a copy (the
    SGLang / EAGLE reference behaviour). vLLM's llama_eagle3 layer reads `norm_before_residual`
    (default False), but vLLM's speculators loader defaults it to True (algos.py `update_eagle3`), so it
    is always written, false.
  * fc has no bias (SGLang: `bias=getattr(config, "bias", False)`; vLLM and speculators: bias=False).
  * d2t are int64 offsets (target_id = i + d2t[i]); t2d is a bool mask over the target vocabulary;
    vLLM skips t2d, SGLang turns d2t into its hot-token ids.
  * lm_head over the draft vocabulary is stored; the embedding is the target's (both engines share it)
    and is not written. `tie_word_embeddings: false` is explicit: SGLang ties lm_head to embed_tokens
    when it is true.
  * `eagle3` has no `target_hidden_size` (our draft is always as wide as its target, and SGLang, vLLM
    and the EAGLE repo all fall back to hidden_size): the EAGLE repo's cnets.py `Model` loads the
    target's embedding only when that key is absent (`if load_emb and not hasattr(config,
    "target_hidden_size")`), and with it set expects the draft's own embed_tokens.weight, which we do
    not write, so it would draft from a random embedding. `speculators` keeps the key (its config
    model reads it; vLLM's speculators loader shares the verifier's embedding).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from specheads.core.target import FrozenTarget
from specheads.heads.eagle3 import (
    Eagle3Config,
    Eagle3Head,
    check_ascending_layers,
    default_eagle3_layers,
    vocab_maps,
)
from specheads.heads.formats.eagle import (
    LLAMA_LAYER,
    check_llama_layer,
    check_shared_weights,
    import_layer_config,
    layer_sizes,
    llama_draft_config,
)
from specheads.heads.formats.io import Export, FormatError, KeyTable, head_state, read_config, read_weights

EAGLE3_LAYER = (*LLAMA_LAYER, ("input_layernorm.weight", ("H",)), ("hidden_norm.weight", ("H",)))


def _table(layer_prefix: str) -> KeyTable:
    return KeyTable(
        ("fc.weight", "fc.weight", ("H", "3H")),
        *((f"midlayer.{k}", f"{layer_prefix}{k}", shape) for k, shape in EAGLE3_LAYER),
        ("norm.weight", "norm.weight", ("H",)),
        ("lm_head.weight", "lm_head.weight", ("Vd", "H")),
        ("d2t", "d2t", ("Vd",), torch.int64),
        ("t2d", "t2d", ("V",), torch.bool),
    )


EAGLE3_KEYS = _table("midlayer.")  # SGLang llama_eagle3.py, EAGLE cnets.py
SPECULATORS_KEYS = _table("layers.0.")  # speculators Eagle3 draft model


# -- checks shared by both directions --------------------------------------------------------------


def check_layer_ids(ids: list[int], num_layers: int, what: str) -> list[int]:
    """EAGLE-3 fuses 3 pre-norm residual streams, HF ids 1..L-1 (what the engines can capture), distinct
    and ascending (the engines capture each layer once, in order, and concatenate them so)."""
    ids = [int(i) for i in ids]
    if len(ids) != 3 or not all(1 <= i <= num_layers - 1 for i in ids):
        raise FormatError(
            f"{what}: EAGLE-3 layer ids {ids} (HF hidden_states indexing) must be 3 ids in 1..{num_layers - 1}: "
            "SGLang and vLLM capture the residual stream entering decoder layers 1..L-1, not the embeddings "
            f"(0) nor the output after the final norm ({num_layers})"
        )
    try:
        check_ascending_layers(ids, what)
    except ValueError as e:
        raise FormatError(str(e)) from None
    return ids


def check_vocab_maps(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int, what: str) -> None:
    """d2t (Vd,) int64 offsets and t2d (V,) bool must describe the same strictly ascending draft vocabulary."""
    if d2t.dtype != torch.int64 or t2d.dtype != torch.bool or t2d.shape != (vocab_size,):
        raise FormatError(
            f"{what}: d2t must be int64 (Vd,) and t2d bool ({vocab_size},); "
            f"got {d2t.dtype} {tuple(d2t.shape)} and {t2d.dtype} {tuple(t2d.shape)}"
        )
    try:
        _, mask = vocab_maps(torch.arange(d2t.numel()) + d2t, vocab_size)
    except ValueError as e:
        raise FormatError(
            f"{what}: d2t does not map draft ids to target ids (target_id = i + d2t[i]): {e}"
        ) from e
    if not torch.equal(mask, t2d):
        raise FormatError(
            f"{what}: t2d does not mark exactly the target ids i + d2t[i] of the draft vocabulary"
        )


def _eagle3_export_parts(heads: nn.Module, fmt: str, table: KeyTable) -> tuple[dict, dict, list[int], int]:
    """(engine tensors, layer config, HF layer ids, draft vocab size) after every check of an export."""
    state = head_state(heads, "eagle3", fmt)
    layer_config = heads.config.layer_config
    check_llama_layer(layer_config, fmt)
    ids = check_layer_ids(list(heads.capture_layers), layer_config["num_hidden_layers"], f"{fmt} export")
    check_vocab_maps(state["d2t"], state["t2d"], heads.config.vocab_size, f"{fmt} export")
    sizes = {**layer_sizes(layer_config, 2), "Vd": heads.config.draft_vocab_size}
    return table.to_engine(state, sizes, f"{fmt} export"), layer_config, ids, heads.config.draft_vocab_size


def _record(ids: list[int], draft_vocab: int) -> dict[str, Any]:
    """What both EAGLE-3 formats add to the provenance block."""
    layer_ids = {
        "hf_hidden_states": ids,
        "sglang_eagle_config": [i - 1 for i in ids],
        "vllm_eagle_aux_hidden_state_layer_ids": ids,
    }
    return {"draft_vocab_size": draft_vocab, "layer_ids": layer_ids, "norm_before_residual": False}


# -- eagle3 ----------------------------------------------------------------------------------------


def to_eagle3(
    heads: nn.Module, native_config: dict[str, Any], target: FrozenTarget | None = None, dtype=None
) -> Export:
    """An Eagle3Head as an SGLang / vLLM `LlamaForCausalLMEagle3` checkpoint."""
    tensors, layer_config, ids, draft_vocab = _eagle3_export_parts(heads, "eagle3", EAGLE3_KEYS)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        **llama_draft_config(layer_config),
        "draft_vocab_size": draft_vocab,
        # no target_hidden_size: see the module docstring (the EAGLE repo would skip the embedding)
        "norm_before_residual": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in ids],
            "use_aux_hidden_state": True,
        },
        "eagle_aux_hidden_state_layer_ids": ids,
    }
    notes = []
    if ids[0] != 2:
        notes.append(
            f"SGLang builds with PR #25454 add one to eagle_config ids only when the first is 1 (HF 2); these "
            f"start at HF {ids[0]}, so such builds would read {[i - 1 for i in ids]} as HF ids. vLLM reads "
            f"eagle_aux_hidden_state_layer_ids {ids} as written."
        )
    return Export.build("eagle3", native_config, config, tensors, dtype, notes, _record(ids, draft_vocab))


def _verifier_architectures(model_type: str, target: FrozenTarget | None) -> list[str]:
    if target is not None and getattr(target.config, "architectures", None):
        return list(target.config.architectures)
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,  # lazy: transformers adds seconds to every command's start
    )

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    return [name] if name else []


def to_speculators(
    heads: nn.Module,
    native_config: dict[str, Any],
    target: FrozenTarget | None = None,
    dtype=None,
    speculative_tokens: int | None = None,
) -> Export:
    """An Eagle3Head as a vLLM speculators checkpoint (`vllm serve DIR` runs it with its verifier).

    `speculative_tokens` (proposal_methods[0]) defaults to the training-time-test steps it was trained with.
    EAGLE-1/2 heads are refused: vLLM's speculators loader registers eagle3 only (algos.py; the method
    table's EAGLE entry says so).
    """
    tensors, layer_config, ids, draft_vocab = _eagle3_export_parts(heads, "speculators", SPECULATORS_KEYS)
    training = native_config.get("training") or {}
    steps = (training.get("eagle3") or {}).get("ttt_steps") or training.get("ttt_steps")  # or a flat record's
    tokens = int(speculative_tokens or steps or 3)
    record = native_config.get("target") or {}
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_draft_config(layer_config),
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "norm_before_fc": False,
        "target_hidden_size": layer_config["hidden_size"],
        "eagle_aux_hidden_state_layer_ids": ids,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": record.get("name_or_path"),
                "architectures": _verifier_architectures(record.get("model_type", ""), target),
            },
        },
    }
    notes = []
    if target is not None:
        tensors["embed_tokens.weight"] = _target_embedding(target, layer_config)
    else:
        notes.append(
            "no embed_tokens.weight (pass --target to include the target's): vLLM shares the verifier's "
            "embedding, but the speculators library's Eagle3DraftModel.from_pretrained (0.9.0) leaves a "
            "missing one uninitialised"
        )
    return Export.build(
        "speculators", native_config, config, tensors, dtype, notes, _record(ids, draft_vocab)
    )


def _target_embedding(target: FrozenTarget, layer_config: dict[str, Any]) -> torch.Tensor:
    weight = target.embed_tokens.weight.detach().to("cpu")
    expected = (layer_config["vocab_size"], layer_config["hidden_size"])
    if tuple(weight.shape) != expected:
        raise FormatError(f"the target's embedding is {tuple(weight.shape)}, the head expects {expected}")
    return weight.clone()


# -- import ----------------------------------------------------------------------------------------


def _build_eagle3(
    draft: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    target: FrozenTarget,
    ids: list[int],
    draft_vocab: int | None,
    table: KeyTable,
    what: str,
) -> Eagle3Head:
    """An Eagle3Head from an official draft layer config and its engine-named tensors."""
    layer_config = import_layer_config(draft, target, what)
    check_shared_weights(tensors, target, what)
    if "lm_head.weight" not in tensors:
        raise FormatError(
            f"{what}: no lm_head.weight (a head that borrows the target's lm_head is not supported)"
        )
    draft_vocab = draft_vocab or tensors["lm_head.weight"].shape[0]
    bias = tensors.pop("fc.bias", None)
    if bias is not None and bias.any():
        raise FormatError(f"{what}: fc has a nonzero bias; Eagle3Head's fc has none")
    vocab = target.vocab_size
    if "d2t" not in tensors:
        if draft_vocab != vocab:
            raise FormatError(
                f"{what}: no d2t, but the head drafts over {draft_vocab} of the target's {vocab} tokens: "
                "its ids cannot be mapped to target ids"
            )
        tensors["d2t"] = torch.zeros(draft_vocab, dtype=torch.int64)
    if not tensors["d2t"].is_floating_point():
        tensors["d2t"] = tensors["d2t"].to(torch.int64)  # some writers use int32; the offsets are the same
        _ids_in_order(tensors, draft_vocab)
    if "t2d" not in tensors:
        tensors["t2d"] = vocab_maps(torch.arange(draft_vocab) + tensors["d2t"], vocab)[1]
    tensors["t2d"] = tensors["t2d"].to(torch.bool)
    check_vocab_maps(tensors["d2t"], tensors["t2d"], vocab, what)
    sizes = {**layer_sizes(layer_config, 2), "Vd": draft_vocab}
    state = table.to_native(tensors, sizes, what)
    head = Eagle3Head(
        Eagle3Config(layer_config, draft_arch="llama", draft_vocab_size=draft_vocab, target_layers=tuple(ids))
    )
    head.load_state_dict(state, strict=True)
    return head.eval()


def _ids_in_order(tensors: dict[str, torch.Tensor], draft_vocab: int) -> None:
    """A draft vocabulary of distinct target ids in another order (Model Optimizer's calibration writes them
    most frequent first; the engines read any order) becomes the same head in id order: lm_head's rows and
    d2t sorted together, which changes no draft token's logit."""
    own = torch.arange(draft_vocab)
    ids = own + tensors["d2t"]
    if (
        ids.numel() == draft_vocab
        and bool((ids[1:] < ids[:-1]).any())
        and ids.unique().numel() == draft_vocab
    ):
        order = ids.argsort()
        for key in ("lm_head.weight", "lm_head.bias"):
            if key in tensors:
                tensors[key] = tensors[key][order]
        tensors["d2t"] = ids[order] - own


def _check_flags(config: dict[str, Any], what: str) -> None:
    if config.get("norm_before_residual"):
        raise FormatError(
            f"{what}: norm_before_residual: true (residual taken after hidden_norm); Eagle3Head keeps the "
            "raw fused feature as the residual (SGLang / EAGLE reference), so it cannot reproduce this head"
        )
    if config.get("norm_before_fc"):
        raise FormatError(f"{what}: norm_before_fc: true (a norm over the fused layers); Eagle3Head has none")
    target_hidden = config.get("target_hidden_size")
    if target_hidden is not None and target_hidden != config.get("hidden_size", target_hidden):
        raise FormatError(
            f"{what}: target_hidden_size {target_hidden} differs from the draft's hidden_size; "
            "Eagle3Head drafts at the target's width"
        )


def from_eagle3(path, target: FrozenTarget) -> Eagle3Head:
    """An `eagle3` checkpoint (official EAGLE-3, SpecForge / SGLang, or ours) as an Eagle3Head."""
    what = f"EAGLE-3 checkpoint {path}"
    config = read_config(path)
    _check_flags(config, what)
    num_layers = target.num_layers
    sglang = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    vllm = config.get("eagle_aux_hidden_state_layer_ids")
    from_sglang = [int(i) + 1 for i in sglang] if sglang else None
    if from_sglang and vllm and from_sglang != [int(i) for i in vllm]:
        raise FormatError(
            f"{what}: eagle_config.eagle_aux_hidden_state_layer_ids {sglang} (SGLang, HF id - 1) and "
            f"eagle_aux_hidden_state_layer_ids {vllm} (vLLM, HF ids) name different layers"
        )
    ids = from_sglang or vllm or list(default_eagle3_layers(num_layers))
    ids = check_layer_ids(ids, num_layers, what)
    tensors, _ = read_weights(path)
    return _build_eagle3(
        config, tensors, target, ids, config.get("draft_vocab_size"), _layer_table(tensors), what
    )


def _layer_table(tensors: dict[str, torch.Tensor]) -> KeyTable:
    """EAGLE3_KEYS (midlayer.*), or the layers.0.* names NVIDIA Model Optimizer's exporter writes (0.47.0
    `export_speculative_decoding`, hf_spec_export.py: eagle_module.* with the prefix dropped) and vLLM's
    llama_eagle3 reads (it renames midlayer. to layers.0.). A checkpoint with both is refused by the key check."""
    if any(k.startswith("layers.0.") for k in tensors) and not any(
        k.startswith("midlayer.") for k in tensors
    ):
        return SPECULATORS_KEYS
    return EAGLE3_KEYS


def from_speculators(path, target: FrozenTarget) -> Eagle3Head:
    """A speculators `eagle3` checkpoint as an Eagle3Head."""
    what = f"speculators checkpoint {path}"
    config = read_config(path)
    kind = config.get("speculators_model_type")
    if kind != "eagle3":
        raise FormatError(f"{what}: speculators_model_type {kind!r}; only 'eagle3' imports")
    if "norm_before_residual" not in config:
        raise FormatError(
            f"{what}: norm_before_residual is not set, and readers disagree on its default (vLLM's speculators "
            "loader: true; the speculators library: false); set it explicitly"
        )
    draft = dict(config.get("transformer_layer_config") or {})
    _check_flags({**config, "hidden_size": draft.get("hidden_size")}, what)
    ids = config.get("eagle_aux_hidden_state_layer_ids") or list(default_eagle3_layers(target.num_layers))
    ids = check_layer_ids(ids, target.num_layers, what)
    tensors, _ = read_weights(path)
    return _build_eagle3(draft, tensors, target, ids, config.get("draft_vocab_size"), SPECULATORS_KEYS, what)
