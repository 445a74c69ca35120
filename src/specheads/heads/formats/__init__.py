"""Head checkpoints in serving-engine layouts: export native heads, import official ones.

| format        | heads   | read by                                        | module            |
| ------------- | ------- | ---------------------------------------------- | ----------------- |
| `medusa`      | Medusa  | TGI, TensorRT-LLM (FasterDecoding v0.1)        | formats/medusa.py |
| `vllm-medusa` | Medusa  | vLLM MedusaModel (absent from vLLM 0.33.0)     | formats/medusa.py |
| `eagle`       | EAGLE   | SGLang LlamaForCausalLMEagle, vLLM, EAGLE repo | formats/eagle.py  |
| `eagle3`      | EAGLE-3 | SGLang / vLLM LlamaForCausalLMEagle3           | formats/eagle3.py |
| `speculators` | EAGLE-3 | vLLM (speculators library format)              | formats/eagle3.py |

Each format is a key table plus one `to_<format>(heads, native_config, target, dtype) -> Export` and one
`from_<format>(path, target) -> heads`. Exports are checked whole in memory and written atomically;
imports give heads that `save_heads` stores as a native checkpoint for `specheads eval`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specheads.core.target import FrozenTarget, TargetMismatchError
from specheads.heads.checkpoint import load_heads, read_head_config, save_heads
from specheads.heads.formats.eagle import from_eagle, to_eagle
from specheads.heads.formats.eagle3 import from_eagle3, from_speculators, to_eagle3, to_speculators
from specheads.heads.formats.io import (
    Export,
    FormatError,
    atomic_dir,
    check_out_dir,
    read_config,
    write_export,
)
from specheads.heads.formats.medusa import from_medusa, from_vllm_medusa, to_medusa, to_vllm_medusa
from specheads.heads.method import Method

# format -> (exporter, importer); which method's heads each holds is the method table's `export_formats`
FORMATS = {
    "medusa": (to_medusa, from_medusa),
    "vllm-medusa": (to_vllm_medusa, from_vllm_medusa),
    "eagle": (to_eagle, from_eagle),
    "eagle3": (to_eagle3, from_eagle3),
    "speculators": (to_speculators, from_speculators),
}


def _format(fmt: str) -> tuple:
    if fmt not in FORMATS:
        raise FormatError(f"unknown format {fmt!r}; known: {sorted(FORMATS)}")
    return FORMATS[fmt]


def format_method(fmt: str, *, methods: Mapping[str, Method]) -> str:
    """The method whose heads `fmt` holds (its entry in `methods`, the method table, lists the format)."""
    return next(name for name, m in methods.items() if fmt in m.export_formats)


def export_heads(
    heads_dir: str | Path,
    fmt: str,
    out: str | Path,
    target: FrozenTarget | None = None,
    dtype: torch.dtype | None = None,
    allow_target_mismatch: bool = False,
    *,
    methods: Mapping[str, Method],
    **options: Any,
) -> Export:
    """Write the native heads in `heads_dir` as an engine checkpoint in the new directory `out`.

    Args:
        target: needed only for Medusa heads that share the target's lm_head; when given, the heads'
            target record is checked against it first.
        dtype: cast floating point weights (None keeps the checkpoint's).
        methods: the method table; the heads' entry lists the formats that hold them.
        options: format-specific (`speculative_tokens` for speculators, `fc_bias` for eagle).

    Raises:
        FormatError: the heads cannot be expressed in `fmt` (nothing is written).
    """
    exporter, _ = _format(fmt)
    out = Path(out)
    check_out_dir(out)
    native_config = read_head_config(heads_dir, methods=methods)
    method = methods[native_config["method"]]
    if fmt not in method.export_formats:
        why = method.refused_formats.get(fmt)
        raise FormatError(
            f"format {fmt!r}: {why}"
            if why
            else f"format {fmt!r} holds {format_method(fmt, methods=methods)} heads; {heads_dir} holds {method.name} heads "
            f"(its formats: {', '.join(method.export_formats) or 'none'})"
        )
    try:
        heads, native_config = load_heads(
            heads_dir, target, allow_target_mismatch=allow_target_mismatch, methods=methods
        )
    except TargetMismatchError:
        raise
    except ValueError as e:  # a head config the heads' own checks refuse (e.g. EAGLE-3 layer order)
        raise FormatError(f"{heads_dir}: {e}") from None
    options = {k: v for k, v in options.items() if v is not None}
    export = exporter(heads, native_config, target=target, dtype=dtype, **options)
    write_export(export, out)
    return export


def import_heads(checkpoint: str | Path, fmt: str, target: FrozenTarget, out: str | Path) -> nn.Module:
    """Read an official (or exported) engine checkpoint against `target`; save it natively in `out`."""
    _, importer = _format(fmt)
    out = Path(out)
    check_out_dir(out)
    heads = importer(Path(checkpoint), target)
    source = {"format": fmt, "checkpoint": str(checkpoint), "config": read_config(Path(checkpoint))}
    training = {"imported_from": source}
    with atomic_dir(out) as tmp:
        save_heads(heads, tmp, target.record(), training=training)
    return heads


__all__ = [
    "FORMATS",
    "format_method",
    "Export",
    "FormatError",
    "export_heads",
    "import_heads",
    "from_eagle",
    "from_eagle3",
    "from_medusa",
    "from_speculators",
    "from_vllm_medusa",
    "to_eagle",
    "to_eagle3",
    "to_medusa",
    "to_speculators",
    "to_vllm_medusa",
]
