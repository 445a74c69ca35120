"""The native head checkpoint: `config.json` + `model.safetensors` in one directory, and, from training,
`label_counts.safetensors` (one int64 tensor "counts" (V,): how often each target token is a label in the
training rows; decoding reads it for a frequency-ranked draft vocabulary, `draft_vocab_ids`).

config.json:
    format             "specheads"
    specheads_version  the version that wrote it
    method             "medusa" | "eagle" | "eagle3" (an entry of the method table, specheads.methods)
    head_config        the head class's config (its constructor arguments)
    target             the TargetRecord of the target the heads were trained against
    capture_layers     (EAGLE heads) the target layer ids the heads read, with the indexing they use
    training           the method's training hyper-parameters (loss weights, steps, data, ...)

Loading against a target checks the record first: heads trained for another target are an error. Reading a
checkpoint takes the method table (`methods`: name -> `Method`, as `specheads.methods.methods()` gives it):
the method named in config.json must be one of it, and its entry builds the heads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specheads.core.atomic import write_file, write_json
from specheads.core.target import ADAPTER_CONFIG, FrozenTarget, TargetRecord
from specheads.heads.eagle3 import draft_vocab_from_counts
from specheads.heads.method import Method
from specheads.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
LABEL_COUNTS_FILE = "label_counts.safetensors"
ADAPTER_DIR = "adapter"  # Medusa-2: the peft adapter trained with the heads (train/medusa2.py)
CAPTURE_LAYERS_INDEXING = (
    "Hugging Face hidden_states indexing: 0 = the embeddings, i = the output of decoder layer i-1, "
    "L = the last layer's output after the final norm. SGLang and ModelOpt count decoder-layer outputs "
    "from 0, so they number these ids minus one (EAGLE-3's default (2, L//2, L-3) is their (1, L//2-1, L-4))."
)


def save_heads(
    heads: nn.Module,
    path: str | Path,
    target: TargetRecord,
    training: dict[str, Any] | None = None,
    label_counts: torch.Tensor | None = None,
) -> Path:
    """Write `heads` into the directory `path` (other files there are left alone), with the training
    rows' `label_counts` (V,) when given.

    Never half-written: config.json is removed first and written last, each file is written to a
    temporary name and renamed, so a folder with a config.json always holds a whole checkpoint. The heads
    name their method (`heads.method`) and carry their config (`heads.config.to_dict()`); a reader checks the
    method against its table (`read_head_config`).
    """
    if not isinstance(getattr(heads, "method", None), str) or not hasattr(
        getattr(heads, "config", None), "to_dict"
    ):
        raise ValueError(
            f"cannot save a {type(heads).__name__}: heads name their method (`method`, a str) and carry a config "
            "with `to_dict()` (heads/method.py)"
        )
    path = Path(path)
    config = {
        "format": "specheads",
        "specheads_version": __version__,
        "method": heads.method,
        "head_config": heads.config.to_dict(),
        "target": target.to_dict(),
        "training": training or {},
    }
    if hasattr(heads, "capture_layers"):
        config["capture_layers"] = list(heads.capture_layers)
        config["capture_layers_indexing"] = CAPTURE_LAYERS_INDEXING
    state = {k: v.detach().to("cpu").contiguous() for k, v in heads.state_dict().items()}
    path.mkdir(parents=True, exist_ok=True)
    (path / CONFIG_FILE).unlink(missing_ok=True)
    # One metadata key: safetensors writes its metadata map in hash order, so two keys could come out in
    # either order and the same weights in different bytes (runs are compared by sha256). The method is
    # in config.json.
    write_file(path / WEIGHTS_FILE, lambda f: save_file(state, f, metadata={"format": "pt"}))
    if label_counts is not None:
        if label_counts.shape != (target.vocab_size,):
            raise ValueError(
                f"label_counts has shape {tuple(label_counts.shape)}; the target's vocabulary is "
                f"{target.vocab_size}"
            )
        counts = {"counts": label_counts.detach().to("cpu", torch.int64).contiguous()}
        write_file(path / LABEL_COUNTS_FILE, lambda f: save_file(counts, f, metadata={"format": "pt"}))
    write_json(path / CONFIG_FILE, config)
    return path


def read_label_counts(path: str | Path) -> torch.Tensor | None:
    """(V,) int64 label counts of the heads' training rows, or None for a checkpoint without them."""
    file = Path(path) / LABEL_COUNTS_FILE
    return read_weights(file)["counts"] if file.is_file() else None


def draft_vocab_ids(path: str | Path, size: int, vocab_size: int) -> torch.Tensor:
    """The `size` target ids that were labels most often in the training of the heads in `path`,
    ascending: the draft vocabulary EAGLE-1/2 and Medusa heads can decode over (FR-Spec's frequency-ranked
    vocabulary; EAGLE-3 builds its own the same way at training, `draft_vocab_from_counts`).

    Raises:
        ValueError: when `path` holds no label counts (trained before they were saved) or `size` is out
            of range.
    """
    counts = read_label_counts(path)
    if counts is None:
        raise ValueError(
            f"{path} has no {LABEL_COUNTS_FILE} (heads trained before specheads saved their label counts): "
            "a draft vocabulary needs them; retrain, or decode over the whole vocabulary"
        )
    if counts.numel() != vocab_size:
        raise ValueError(
            f"{path / LABEL_COUNTS_FILE} counts {counts.numel()} tokens; the target has {vocab_size}"
        )
    return draft_vocab_from_counts(counts, size)


def sha256_file(path: str | Path, chunk: int = 1 << 24) -> str:
    """The sha256 of a file's bytes, read in chunks (weights and cache shards run to GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def read_weights(file: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a truncated or damaged file is an error that names it."""
    try:
        return load_file(str(file))
    except Exception as e:
        if type(e).__name__ != "SafetensorError":  # safetensors' own error, which names no file
            raise
        raise ValueError(f"{file} cannot be read ({e}): truncated or damaged") from None


def read_head_config(path: str | Path, *, methods: Collection[str]) -> dict[str, Any]:
    """The parsed config.json of a native head checkpoint, with clear errors for anything else: a method
    that is not one of `methods` among them (the method table, or the names a caller accepts)."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(
            f"{path} is not a specheads head checkpoint (needs {CONFIG_FILE} and {WEIGHTS_FILE})"
        )
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path / CONFIG_FILE} is not valid JSON ({e}): a damaged checkpoint") from None
    if not isinstance(config, dict) or config.get("format") != "specheads":
        raise ValueError(
            f"{path / CONFIG_FILE} is not a specheads head config (format "
            f"{config.get('format') if isinstance(config, dict) else None!r})"
        )
    if config.get("method") not in methods:
        raise ValueError(f"{path}: unknown method {config.get('method')!r}; known: {sorted(methods)}")
    return config


def head_config_of(path: str | Path, config: dict[str, Any], method: Method):
    """`method`'s head config built from a checkpoint's config.json (`config`, read from `path`); keys of
    another method's config, or missing ones, are an error naming the file, not the dataclass's TypeError."""
    name, fields = config["method"], config.get("head_config")
    where = Path(path) / CONFIG_FILE
    if not isinstance(fields, dict):
        raise ValueError(
            f"{where}: head_config is {type(fields).__name__}, not a mapping: a damaged checkpoint"
        )
    known = {f.name: f for f in dataclasses.fields(method.config_class)}
    unexpected = sorted(set(fields) - set(known))
    required = [
        k
        for k, f in known.items()
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [k for k in required if k not in fields]
    if unexpected or missing:
        keys = [f"unexpected key{'s' * (len(unexpected) > 1)} {', '.join(map(repr, unexpected))}"] * bool(
            unexpected
        )
        keys += [f"missing key{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))}"] * bool(missing)
        raise ValueError(f"{where}: head_config does not fit method {name!r} ({'; '.join(keys)})")
    try:
        return method.config_class(**fields)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: head_config does not fit method {name!r} ({e})") from None


def heads_adapter(path: str | Path) -> Path | None:
    """The Medusa-2 adapter saved beside the heads in `path` (`adapter/`), or None."""
    adapter = Path(path) / ADAPTER_DIR
    return adapter if (adapter / ADAPTER_CONFIG).is_file() else None


def target_for_heads(target: FrozenTarget, path: str | Path) -> FrozenTarget:
    """The model that verifies the heads in `path`: `target` itself, or for Medusa-2 heads `target`
    with the adapter trained beside them merged into its weights (Medusa-2 moves the target's hidden
    states; its adapted target is what the heads read and what decodes)."""
    adapter = heads_adapter(path)
    return target if adapter is None else target.with_adapter(adapter)


def load_heads(
    path: str | Path,
    target: FrozenTarget | TargetRecord | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    allow_target_mismatch: bool = False,
    *,
    methods: Mapping[str, Method],
) -> tuple[nn.Module, dict[str, Any]]:
    """Load native heads; with `target`, first check they were trained against it (another weights
    fingerprint is only a warning with `allow_target_mismatch`). `methods`: the method table; the entry of
    the checkpoint's method builds the heads.

    Returns (heads in eval mode, the checkpoint's config dict).
    """
    config = read_head_config(path, methods=methods)
    if target is not None:
        actual = target.record() if isinstance(target, FrozenTarget) else target
        TargetRecord.from_dict(config["target"]).check_matches(
            actual, what=f"heads in {path}", allow_weights=allow_target_mismatch
        )
    method = methods[config["method"]]
    heads = method.head_class(head_config_of(path, config, method))
    state = read_weights(Path(path) / WEIGHTS_FILE)
    missing, unexpected = heads.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not match the config (missing {missing}, unexpected {unexpected})"
        )
    heads.to(device=device, dtype=dtype)
    return heads.eval(), config
