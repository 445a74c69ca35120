"""The native head checkpoint: `config.json` + `model.safetensors` in one directory.

config.json:
    format             "specheads"
    specheads_version  the version that wrote it
    method             "medusa" | "eagle" | "eagle3" (an entry of the method table, heads/methods.py)
    head_config        the head class's config (its constructor arguments)
    target             the TargetRecord of the target the heads were trained against
    capture_layers     (EAGLE heads) the target layer ids the heads read, with the indexing they use
    training           the method's training hyper-parameters (loss weights, steps, data, ...)

Loading against a target checks the record first: heads trained for another target are an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specheads.heads.methods import methods
from specheads.heads.target import ADAPTER_CONFIG, FrozenTarget, TargetRecord
from specheads.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
ADAPTER_DIR = "adapter"  # Medusa-2: the peft adapter trained with the heads (train/medusa2.py)
CAPTURE_LAYERS_INDEXING = (
    "Hugging Face hidden_states indexing: 0 = the embeddings, i = the output of decoder layer i-1, "
    "L = the last layer's output after the final norm. SGLang and ModelOpt count decoder-layer outputs "
    "from 0, so they number these ids minus one (EAGLE-3's default (2, L//2, L-3) is their (1, L//2-1, L-4))."
)


def save_heads(
    heads: nn.Module, path: str | Path, target: TargetRecord, training: dict[str, Any] | None = None
) -> Path:
    """Write `heads` into the directory `path` (other files there are left alone).

    Never half-written: config.json is removed first and written last, each file is written to a
    temporary name and renamed, so a folder with a config.json always holds a whole checkpoint.
    """
    if heads.method not in methods():
        raise ValueError(f"cannot save heads of unknown method {heads.method!r}")
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
    _write_atomic(path / WEIGHTS_FILE, lambda f: save_file(state, f, metadata={"format": "pt"}))
    _write_atomic(path / CONFIG_FILE, lambda f: Path(f).write_text(json.dumps(config, indent=1, default=str)))
    return path


def sha256_file(path: str | Path, chunk: int = 1 << 24) -> str:
    """The sha256 of a file's bytes, read in chunks (weights and cache shards run to GBs)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@contextmanager
def replace_dir(out: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `out` to write into; it replaces `out` whole if the block
    succeeds, and is removed if it fails, so `out` is always the old folder or the whole new one."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)  # os.replace cannot put a directory over a non-empty one
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_atomic(dest: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_weights(file: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a truncated or damaged file is an error that names it."""
    try:
        return load_file(str(file))
    except Exception as e:
        if type(e).__name__ != "SafetensorError":  # safetensors' own error, which names no file
            raise
        raise ValueError(f"{file} cannot be read ({e}): truncated or damaged") from None


def read_head_config(path: str | Path) -> dict[str, Any]:
    """The parsed config.json of a native head checkpoint, with clear errors for anything else."""
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
    if config.get("method") not in methods():
        raise ValueError(f"{path}: unknown method {config.get('method')!r}; known: {sorted(methods())}")
    return config


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
) -> tuple[nn.Module, dict[str, Any]]:
    """Load native heads; with `target`, first check they were trained against it.

    Returns (heads in eval mode, the checkpoint's config dict).
    """
    config = read_head_config(path)
    if target is not None:
        actual = target.record() if isinstance(target, FrozenTarget) else target
        TargetRecord.from_dict(config["target"]).check_matches(actual, what=f"heads in {path}")
    method = methods()[config["method"]]
    heads = method.head_class(method.config_class(**config["head_config"]))
    state = read_weights(Path(path) / WEIGHTS_FILE)
    missing, unexpected = heads.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not match the config (missing {missing}, unexpected {unexpected})"
        )
    heads.to(device=device, dtype=dtype)
    return heads.eval(), config
