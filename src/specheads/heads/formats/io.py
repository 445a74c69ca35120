"""Plumbing shared by the engine formats: key tables, reading, atomic writing, provenance.

A key table is data: rows of (native key, engine key, shape[, dtype]). Keys may hold `{h}` (head index),
`{l}` (layer index) and `{L}` (the number of layers, where Medusa puts each head's lm_head); shapes are
names looked up in a `sizes` dict ("H", "2H", "V", ...). `KeyTable.expand` turns a table and its sizes
into the exact key -> (shape, dtype) map a checkpoint of that format must have, so every exporter and
importer checks what it writes or reads against the same table.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specheads.core.atomic import replace_dir
from specheads.heads.checkpoint import CAPTURE_LAYERS_INDEXING
from specheads.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"  # the Hugging Face name, which the engines' loaders look for first
# what Hugging Face style checkpoints hold their weights in, in the order read_weights tries them
HF_WEIGHTS = (WEIGHTS_FILE, "*.safetensors", "pytorch_model.bin")
PROVENANCE_KEY = "specheads_provenance"

# (native key, engine key, shape names), or with a fourth item, the dtype the tensor must have (without
# one, any floating point dtype passes)
KeyRow = tuple[str, str, tuple[str, ...]] | tuple[str, str, tuple[str, ...], torch.dtype]


class FormatError(ValueError):
    """A head cannot be written in (or read from) an engine format; the message says why."""


# -- key tables ------------------------------------------------------------------------------------


def _indices(template: str, sizes: dict[str, int]) -> Iterator[dict[str, int]]:
    """Every binding of the `{h}` / `{l}` placeholders a key template uses ({L} is fixed)."""
    ranges = {"h": range(sizes.get("heads", 1)), "l": range(sizes.get("layers", 1))}
    names = [n for n in ("h", "l") if "{" + n + "}" in template]
    for values in itertools.product(*(ranges[n] for n in names)):
        yield {"L": sizes.get("layers", 0), **dict(zip(names, values))}


def check_tensors(
    tensors: dict[str, torch.Tensor],
    expected: dict[str, tuple[tuple[int, ...], torch.dtype | None]],
    what: str,
) -> None:
    """Raise FormatError naming every missing, unexpected, mis-shaped or mis-typed tensor."""
    problems = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    for key in sorted(set(expected) & set(tensors)):
        shape, dtype = expected[key]
        t = tensors[key]
        if tuple(t.shape) != shape:
            problems.append(f"{key} is {tuple(t.shape)}, expected {shape}")
        if dtype is not None and t.dtype != dtype:
            problems.append(f"{key} is {t.dtype}, expected {dtype}")
        if dtype is None and not t.is_floating_point():
            problems.append(f"{key} is {t.dtype}, expected a floating point tensor")
    if problems:
        raise FormatError(f"{what}: " + "; ".join(problems))


class KeyTable:
    """One format's tensors: the native key, engine key, shape and dtype of each, as rows (`KeyRow`)."""

    def __init__(self, *rows: KeyRow) -> None:
        self.rows = tuple(r if len(r) == 4 else (*r, None) for r in rows)  # dtype None: any floating point

    def without(self, native_prefix: str) -> KeyTable:
        """The table less the rows whose native key starts with `native_prefix` (a part a head may lack)."""
        return KeyTable(*(r for r in self.rows if not r[0].startswith(native_prefix)))

    def expand(self, sizes: dict[str, int]) -> dict[str, tuple[str, tuple[int, ...], torch.dtype | None]]:
        """engine key -> (native key, shape, dtype) for the given sizes."""
        out = {}
        for native, engine, shape, dtype in self.rows:
            for idx in _indices(engine, sizes):
                out[engine.format(**idx)] = (native.format(**idx), tuple(sizes[s] for s in shape), dtype)
        return out

    def to_engine(self, state: dict[str, torch.Tensor], sizes: dict[str, int], what: str) -> dict:
        """Native state dict -> engine-named tensors, checked against the table (nothing else passes)."""
        layout = self.expand(sizes)
        by_native = {native: engine for engine, (native, _, _) in layout.items()}
        extra = sorted(set(state) - set(by_native))
        if extra:
            raise FormatError(f"{what}: the format has no place for {extra}")
        out = {by_native[k]: v for k, v in state.items()}
        check_tensors(out, {k: (s, d) for k, (_, s, d) in layout.items()}, what)
        return out

    def to_native(self, tensors: dict[str, torch.Tensor], sizes: dict[str, int], what: str) -> dict:
        """Engine-named tensors -> native state dict, after checking every key and shape against the table."""
        layout = self.expand(sizes)
        check_tensors(tensors, {k: (s, d) for k, (_, s, d) in layout.items()}, what)
        return {layout[k][0]: v for k, v in tensors.items()}


def head_state(heads: nn.Module, method: str, fmt: str) -> dict[str, torch.Tensor]:
    """The head's state dict, after checking it is a head of `method`."""
    if getattr(heads, "method", None) != method:
        raise FormatError(
            f"format {fmt!r} holds {method} heads; these are {getattr(heads, 'method', type(heads).__name__)} heads"
        )
    return {k: v.detach() for k, v in heads.state_dict().items()}


# -- the written checkpoint ------------------------------------------------------------------------


@dataclass
class Export:
    """One engine checkpoint, built and checked in memory before anything touches the disk."""

    config: dict[str, Any]
    weights_file: str
    tensors: dict[str, torch.Tensor]
    notes: list[str] = field(default_factory=list)  # what a user should know (printed by the CLI)
    torch_copy: str | None = None  # the same tensors also torch.save'd here, for readers of .pt files only

    @classmethod
    def build(
        cls,
        fmt: str,
        native_config: dict[str, Any],
        config: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        dtype: torch.dtype | None,
        notes: list[str],
        record: dict[str, Any] | None = None,
        weights_file: str = WEIGHTS_FILE,
        torch_copy: str | None = None,
    ) -> Export:
        """Heads with native config `native_config` as a `fmt` checkpoint: the engine's `config` with the
        provenance block as its last key (`record`: the format's own entries in it), and `tensors` with
        their floating point ones cast to `dtype`."""
        config = {**config, PROVENANCE_KEY: provenance(native_config, fmt, **(record or {}))}
        return cls(config, weights_file, cast_floats(tensors, dtype), notes, torch_copy)


def cast_floats(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Cast the floating point tensors to `dtype` (d2t / t2d keep theirs); None keeps every dtype."""
    if dtype is None:
        return tensors
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}


def check_out_dir(out: Path) -> None:
    """Refuse an output that exists and is not an empty directory (before any work is done)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory; choose a new --out")


@contextmanager
def atomic_dir(out: str | Path) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; rename it to `out` only if the block succeeds.

    On any error the temporary directory is removed: `out` is either absent or whole.
    """
    out = Path(out)
    check_out_dir(out)  # absent or empty: replacing it loses nothing
    with replace_dir(out) as tmp:
        yield tmp
        _default_permissions(tmp)


def _default_permissions(directory: Path) -> None:
    """Give a directory and its files the umask's usual modes: mkdtemp / mkstemp / safetensors make them
    private (0700 / 0600), and a serving engine may run as another user."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(directory, 0o777 & ~umask)
    for f in directory.iterdir():
        if f.is_file():
            os.chmod(f, 0o666 & ~umask)


def write_export(export: Export, out: str | Path) -> Path:
    """Write config.json and the weights file (and its torch copy) into a new directory `out`, atomically."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in export.tensors.items()}
    with atomic_dir(out) as tmp:
        save_file(tensors, str(tmp / export.weights_file), metadata={"format": "pt"})
        if export.torch_copy:
            torch.save(tensors, tmp / export.torch_copy)
        (tmp / CONFIG_FILE).write_text(json.dumps(export.config, indent=2) + "\n")
    return Path(out)


# -- reading official checkpoints ------------------------------------------------------------------


def read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} has no {CONFIG_FILE}")
    return json.loads(file.read_text())


def read_weights(path: Path, names: tuple[str, ...] = HF_WEIGHTS) -> tuple[dict[str, torch.Tensor], Path]:
    """The tensors of the first of `names` found in `path` (.safetensors, or a torch .pt / .bin file).

    A name "*.safetensors" merges every safetensors file in the directory. Torch files are loaded with
    `weights_only=True`: tensors only, no code.
    """
    for name in names:
        files = sorted(path.glob(name)) if "*" in name else [path / name]
        files = [f for f in files if f.is_file()]
        if not files:
            continue
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            part = _load_tensors(f)
            if not isinstance(part, dict) or not all(isinstance(v, torch.Tensor) for v in part.values()):
                raise FormatError(f"{f} does not hold a flat dict of tensors")
            clash = sorted(set(tensors) & set(part))
            if clash:
                raise FormatError(f"{path}: tensors {clash} appear in more than one weights file")
            tensors.update(part)
        return tensors, files[0]
    raise FileNotFoundError(f"{path} has none of the weights files {list(names)}")


def _load_tensors(f: Path) -> Any:
    """What a weights file holds; a truncated or damaged file, or a pickle holding more than tensors, is a
    FormatError naming it (the libraries' own messages name no file, and torch's suggests unpickling
    anything with weights_only=False, which specheads never does)."""
    if f.suffix == ".safetensors":
        try:
            return load_file(str(f))
        except Exception as e:
            if type(e).__name__ != "SafetensorError":
                raise
            raise FormatError(f"{f} cannot be read ({e}): truncated or corrupt") from None
    try:
        with warnings.catch_warnings():  # torch's note on the pickle protocol: the error below says it all
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(f, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise FormatError(
            f"{f} holds objects specheads will not load (a pickle of more than tensors, which could run "
            "code): convert it to safetensors from a source you trust"
        ) from None
    except (RuntimeError, EOFError, ValueError, OSError) as e:
        raise FormatError(
            f"{f} cannot be read ({str(e).splitlines()[0] if str(e) else e!r}): truncated or corrupt"
        ) from None


# -- provenance ------------------------------------------------------------------------------------


def provenance(native_config: dict[str, Any], fmt: str, **extra: Any) -> dict[str, Any]:
    """What every export records of where it came from (config.json key `specheads_provenance`).

    Every engine here ignores config keys it does not know: transformers' PretrainedConfig keeps them as
    attributes (vLLM, SGLang, the EAGLE and Medusa repos read configs through it), TGI reads only the
    Medusa keys it names, TensorRT-LLM's Medusa converter takes sizes from the command line, and the
    speculators library's config model has `extra="allow"`. vLLM's MedusaConfig renames top-level keys
    containing both "num" and "heads"/"layers", so nothing here is top-level but this one block.
    """
    record = {
        "specheads_version": __version__,
        "format": fmt,
        "method": native_config.get("method"),
        "target": native_config.get("target"),
        "head_config": native_config.get("head_config"),
        "source_specheads_version": native_config.get("specheads_version"),
    }
    if "capture_layers" in native_config:
        record["capture_layers"] = native_config["capture_layers"]
        record["capture_layers_indexing"] = CAPTURE_LAYERS_INDEXING
    record.update(extra)
    return record
