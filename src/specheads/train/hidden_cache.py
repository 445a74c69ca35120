"""The hidden-state cache (offline mode): run the frozen target once, then train heads from its files.

    build_cache(target, rows, capture_layers, "cache/train", max_length=2048)  # the target runs once
    cached = CachedRows("cache/train", expected=rows)      # a Dataset over the shards, row i = rows[i]
    collate_fn = partial(collate_cached, pad_token_id=0, packing=False, max_length=2048)  # as `collate`
    target = OfflineTarget.from_pretrained(path)           # embedding, final norm, lm_head only
    out = target_output(target, batch, capture=(-1,), logits=True)  # the TargetOutput the online one gives

This module writes the cache; `CachedRows` and `collate_cached`, which read it, are in train/cached_rows.py.

`rows` are the tokenised rows (`tokenize_rows`, optionally `pack_rows`), in their order; a cache row is
one of them. Each shard holds whole consecutive rows, their tokens laid end to end (N = the shard's
tokens, R = its rows):

    tensor              shape      dtype              what
    input_ids           (N,)       int32              the rows' tokens, checked against the dataset when read
    loss_mask           (N,)       int8               their loss masks, checked too
    row_offsets         (R + 1,)   int64              row r is tokens row_offsets[r] : row_offsets[r + 1]
    position_ids        (N,)       int32              only for pre-packed rows (pack_rows)
    hidden.{layer}      (N, H)     the cache's dtype  the target's hidden state, HF hidden_states indexing

`index.json` (written atomically after every shard; `complete` once all are there):

    format, version           "specheads-hidden-cache", FORMAT_VERSION
    target                    TargetRecord of the target that ran (checked against the one training uses)
    capture_layers            layer ids stored, FrozenTarget / HF hidden_states indexing (L = after the norm)
    dtype                     storage dtype of hidden.* (bf16 by default; fp32 for exactness checks)
    vocab_hash                the tokenizer's vocabulary hash (also in target)
    dataset_fingerprint       the `datasets` fingerprint of the rows (None for plain lists)
    tokens_sha256             sha256 over every row's input_ids and loss_mask: what the cache is of
    num_rows, num_tokens, max_length, pad_token_id, prepacked, shard_tokens, batch_size
    plan                      [[first row, end row], ...] per shard, fixed before any is written
    shards                    finished shards: {file, rows: [first, end], tokens, sha256}

Resuming: the shard plan depends only on the rows' lengths and `shard_tokens`, and a shard's forward
batches depend only on its own rows, so a restarted job skips the shards whose checksum matches
`index.json` and writes the others byte for byte as an uninterrupted job would (same machine and
software: the kernels must be deterministic for a given batch).

Equivalence: a row's hidden states do not depend on the rows it was batched with (right padding and
document masks are exact), so a cached row laid out by `collate_cached` gives the online batch's
states at every real token, up to the kernels' rounding for other batch shapes (none on CPU here);
padding positions hold zeros, which no loss reads. fp32 storage reproduces the online losses; bf16
(the default) rounds the states once. A cache serves any batch size, shuffle seed and `packing`
setting, since rows are laid out at read time; pre-packed rows (pack_rows) are cached as packed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from specheads.core.atomic import write_file, write_json
from specheads.core.processes import Processes
from specheads.core.run_folder import clean_stale_tmp
from specheads.core.target import FrozenTarget, resolve_dtype
from specheads.data.packing import collate
from specheads.heads.checkpoint import sha256_file
from specheads.heads.method import Method
from specheads.train.offline_target import OfflineTarget, target_output

__all__ = [
    "CacheCorruptError",
    "CacheError",
    "OfflineTarget",
    "TokenMismatchError",
    "build_cache",
    "cache_layers",
    "read_index",
    "target_output",
]

FORMAT = "specheads-hidden-cache"
FORMAT_VERSION = 1
INDEX_FILE = "index.json"
RANK_INDEX = "index-rank{rank}.json"  # what process `rank` of a several-process run has finished
RANK_GLOB = "index-rank*.json"
# Index fields that must agree for a restarted job to reuse the shards already written.
RESUME_KEYS = (
    "version",
    "target",
    "capture_layers",
    "dtype",
    "tokens_sha256",
    "num_rows",
    "max_length",
    "pad_token_id",
    "prepacked",
    "shard_tokens",
    "batch_size",
    "plan",
)
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


class CacheError(ValueError):
    """A cache that is missing, unfinished, or made for other data, layers or target."""


class CacheCorruptError(CacheError):
    """A shard whose bytes do not match the checksum recorded in index.json."""


class TokenMismatchError(CacheError):
    """A cached row whose tokens differ from the dataset's row at the same index."""


def cache_layers(method: Method, num_layers: int, chosen: Sequence[int] = ()) -> tuple[int, ...]:
    """The layer ids a method's training reads (its entry's `target_layers`): L (after the final norm;
    logits are lm_head of it), plus EAGLE-3's three fused layers ((2, L//2, L-3) unless `chosen`, the
    recipe's `eagle3.layers`)."""
    if method.online_only:
        raise ValueError(f"no cache layout for method {method.name!r}: it {method.online_only}")
    return method.target_layers(num_layers, chosen)


def read_index(cache_dir: str | Path) -> dict:
    path = Path(cache_dir) / INDEX_FILE
    try:
        index = json.loads(path.read_text())
    except FileNotFoundError:
        raise CacheError(
            f"{cache_dir} is not a hidden-state cache (no {INDEX_FILE}); build it with `specheads cache`"
        ) from None
    if index.get("format") != FORMAT or index.get("version") != FORMAT_VERSION:
        raise CacheError(
            f"{path}: format {index.get('format')!r} v{index.get('version')}, "
            f"expected {FORMAT!r} v{FORMAT_VERSION}"
        )
    return index


# -- rows -----------------------------------------------------------------------------------------


def _rows_slice(rows, start: int, end: int) -> list[dict]:
    """Rows start..end-1 as dicts (a `datasets.Dataset` slice is a dict of columns)."""
    if hasattr(rows, "column_names") and not isinstance(rows, (list, tuple)):
        columns = rows[start:end]
        return [dict(zip(columns, values)) for values in zip(*columns.values())]
    return [rows[i] for i in range(start, end)]


def scan_rows(rows, batch: int = 1024) -> tuple[np.ndarray, str, bool]:
    """(row lengths (R,), sha256 over every row's input_ids and loss_mask, pre-packed?) in one pass."""
    if not hasattr(rows, "__getitem__") or not hasattr(rows, "__len__"):
        raise CacheError("the cache needs a map-style dataset (tokenize_rows over a Dataset, not streaming)")
    digest, lengths, prepacked = hashlib.sha256(), [], None
    for start in range(0, len(rows), batch):
        for row in _rows_slice(rows, start, min(start + batch, len(rows))):
            ids = np.asarray(row["input_ids"], dtype=np.int32)
            mask = np.asarray(row["loss_mask"], dtype=np.int8)
            if ids.shape != mask.shape or ids.ndim != 1 or len(ids) == 0:
                raise CacheError(
                    f"row {len(lengths)}: input_ids and loss_mask must be equal, non-empty lists"
                )
            packed = "position_ids" in row
            if prepacked is not None and packed != prepacked:
                raise CacheError(f"row {len(lengths)}: pre-packed rows (with position_ids) mixed with others")
            prepacked = packed
            digest.update(len(ids).to_bytes(8, "little") + ids.tobytes() + mask.tobytes())
            lengths.append(len(ids))
    if not lengths:
        raise CacheError("no rows to cache")
    return np.asarray(lengths, dtype=np.int64), digest.hexdigest(), bool(prepacked)


def plan_shards(lengths: np.ndarray, shard_tokens: int) -> list[list[int]]:
    """Consecutive [first, end) row ranges, each closed once it holds >= shard_tokens tokens."""
    if shard_tokens < 1:
        raise ValueError(f"shard_tokens must be >= 1, got {shard_tokens}")
    plan, start, tokens = [], 0, 0
    for i, n in enumerate(lengths.tolist()):
        tokens += n
        if tokens >= shard_tokens:
            plan.append([start, i + 1])
            start, tokens = i + 1, 0
    if start < len(lengths):
        plan.append([start, len(lengths)])
    return plan


# -- writing --------------------------------------------------------------------------------------


@torch.no_grad()
def shard_tensors(
    target: FrozenTarget,
    examples: list[dict],
    layers: Sequence[int],
    *,
    dtype: torch.dtype,
    batch_size: int,
    pad_token_id: int,
    max_length: int,
    prepacked: bool,
) -> dict[str, torch.Tensor]:
    """One shard's tensors (module docstring): the target over `examples`, longest rows batched first."""
    order = sorted(range(len(examples)), key=lambda i: (-len(examples[i]["input_ids"]), i))
    states: list[dict[int, torch.Tensor]] = [{} for _ in examples]
    for first in range(0, len(order), batch_size):
        chunk = order[first : first + batch_size]
        batch = collate(
            [examples[i] for i in chunk], pad_token_id=pad_token_id, packing=prepacked, max_length=max_length
        )
        out = target(
            batch["input_ids"].to(target.device),
            attention_mask=batch["attention_mask"].to(target.device),
            position_ids=batch["position_ids"].to(target.device),
            capture=layers,
            logits=False,
        )
        hidden = {layer: out.hidden[layer].to("cpu", dtype) for layer in layers}  # (b, T, H) each
        for b, i in enumerate(chunk):
            n = len(examples[i]["input_ids"])  # each example is row b of the batch, tokens 0..n-1
            states[i] = {layer: hidden[layer][b, :n] for layer in layers}
    lengths = torch.tensor([0] + [len(ex["input_ids"]) for ex in examples])
    tensors = {
        "input_ids": torch.cat([torch.as_tensor(ex["input_ids"], dtype=torch.int32) for ex in examples]),
        "loss_mask": torch.cat([torch.as_tensor(ex["loss_mask"], dtype=torch.int8) for ex in examples]),
        "row_offsets": torch.cumsum(lengths, 0),
    }
    if prepacked:
        tensors["position_ids"] = torch.cat(
            [torch.as_tensor(ex["position_ids"], dtype=torch.int32) for ex in examples]
        )
    for layer in layers:
        tensors[f"hidden.{layer}"] = torch.cat([s[layer] for s in states]).contiguous()  # (N, H)
    return tensors


def _write_shard(tensors: dict[str, torch.Tensor], path: Path, rows: list[int]) -> str:
    """Write to a temporary name, rename into place, then checksum the file: returns its sha256."""
    write_file(path, lambda tmp: save_file(tensors, tmp, metadata={"rows": json.dumps(rows)}))  # one key:
    return sha256_file(path)  # a byte-stable header


def _start_index(out_dir: Path, settings: dict, overwrite: bool) -> dict:
    """The index to continue: the existing one when its settings agree, else a fresh one; with the shards
    that the processes of an earlier several-process run recorded in their own index-rank*.json (those
    of other settings are dropped; every shard's checksum is checked before it is skipped)."""
    path = out_dir / INDEX_FILE
    if path.exists() and not overwrite:
        old = read_index(out_dir)
        differ = [k for k in RESUME_KEYS if old.get(k) != settings.get(k)]
        if differ:
            shown = ", ".join(
                f"{k}: {old.get(k)!r} vs now {settings.get(k)!r}" for k in differ if k != "plan"
            )
            raise CacheError(
                f"{out_dir} holds a cache built with other settings ({shown or 'shard plan'}); "
                "use another directory or overwrite=True (`--overwrite`)"
            )
        shards = old.get("shards", []) + _rank_shards(out_dir, settings)
        return {**settings, "shards": shards, "complete": False}
    for old_shard in [*out_dir.glob("shard-*.safetensors"), *out_dir.glob(RANK_GLOB)]:
        old_shard.unlink()
    return {**settings, "shards": [], "complete": False}


def _rank_shards(out_dir: Path, settings: dict) -> list[dict]:
    """The shards the processes of an earlier run recorded in their index-rank*.json, where that run had
    these settings."""
    shards = []
    for rank_file in sorted(out_dir.glob(RANK_GLOB)):
        try:
            record = json.loads(rank_file.read_text())
        except ValueError:  # written atomically, so not expected; a rerun recomputes its shards
            continue
        if all(record.get(k) == settings.get(k) for k in RESUME_KEYS):
            shards += record.get("shards", [])
    return shards


def _remove_rank_records(out_dir: Path) -> None:
    """Remove the index-rank*.json files of a several-process run, and what a process killed while writing
    one left beside it (`.index-rank{r}.json.tmp-*`, clean_stale_tmp)."""
    names = {p.name for p in out_dir.glob(RANK_GLOB)}
    names |= {p.name[1:].split(".tmp-")[0] for p in out_dir.glob(f".{RANK_GLOB}.tmp-*")}
    for name in names:
        (out_dir / name).unlink(missing_ok=True)
        clean_stale_tmp(out_dir / name)


def _cache_settings(
    target: FrozenTarget,
    rows,
    capture_layers: Iterable[int],
    storage: torch.dtype,
    max_length: int,
    pad_token_id: int | None,
    shard_tokens: int,
    batch_size: int,
) -> tuple[dict[str, Any], np.ndarray]:
    """(the settings a cache is built with and resumed only under, the rows' lengths); checks the
    inputs before any forward runs."""
    layers = sorted({target.layer_id(i) for i in capture_layers})
    if not layers:
        raise ValueError("capture_layers is empty: name the layers the heads read (cache_layers())")
    if pad_token_id is None:
        if target.tokenizer is None or target.tokenizer.pad_token_id is None:
            raise ValueError("pass pad_token_id: the target has no tokenizer with a pad token")
        pad_token_id = target.tokenizer.pad_token_id
    lengths, tokens_sha256, prepacked = scan_rows(rows)
    if lengths.max() > max_length:
        row = int(lengths.argmax())
        raise CacheError(f"row {row} has {lengths[row]} tokens, more than max_length={max_length}")
    record = target.record()
    settings = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "target": record.to_dict(),
        "capture_layers": layers,
        "dtype": DTYPE_NAMES[storage],
        "hidden_size": target.hidden_size,
        "vocab_hash": record.vocab_hash,
        "dataset_fingerprint": getattr(rows, "_fingerprint", None),
        "tokens_sha256": tokens_sha256,
        "num_rows": len(lengths),
        "num_tokens": int(lengths.sum()),
        "max_length": max_length,
        "pad_token_id": pad_token_id,
        "prepacked": prepacked,
        "shard_tokens": shard_tokens,
        "batch_size": batch_size,
        "plan": plan_shards(lengths, shard_tokens),
    }
    return settings, lengths


def build_cache(
    target: FrozenTarget,
    rows,
    capture_layers: Iterable[int],
    out_dir: str | Path,
    *,
    max_length: int,
    dtype: torch.dtype | str = torch.bfloat16,
    shard_tokens: int = 1 << 15,
    batch_size: int = 8,
    pad_token_id: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    on_shard: Callable[[int, dict], None] | None = None,
    processes: Processes | None = None,
) -> dict[str, Any]:
    """Run the frozen target once over `rows` and store the captured layers as sharded safetensors.

    Args:
        target: the frozen target (FrozenTarget), on the device it should run on.
        rows: tokenised rows in training order (tokenize_rows; pack_rows output too), map-style.
        capture_layers: layer ids to store (HF hidden_states indexing, negative from the end); see
            `cache_layers` for what each method reads.
        out_dir: the cache directory (index.json + shard-*.safetensors); an unfinished cache of the
            same settings there is resumed.
        max_length: the recipe's max_length (rows longer than it are an error, as in `collate`).
        dtype: storage dtype of the hidden states (bf16 default; fp32 to reproduce online losses).
        shard_tokens: a shard is closed once it holds this many tokens.
        batch_size: rows per target forward (part of the settings: it must match to resume).
        pad_token_id: defaults to the target tokenizer's.
        overwrite: discard a cache of other settings in `out_dir` instead of refusing.
        on_shard: called as on_shard(shard number, its index entry) after each shard is recorded.
        processes: the processes sharing the work (core/processes.py; None: this one alone). Every one
            calls build_cache with the same arguments; see "Several processes" below.

    Returns:
        {"dir", "shards", "written", "skipped", "tokens", "bytes"}, over every process's shards.

    Several processes: process r of N computes and writes shards r, r + N, ... of the plan (the plan, the
    shard names and their bytes do not depend on N), and records each one it finishes in its own
    `index-rank{r}.json`; process 0 merges those into `index.json` at the start (so a rerun with any N
    skips what any process finished) and at the end, after every process is done, writes the finished
    `index.json` (byte for byte the one a single process writes) and removes the per-process files.
    """
    procs = processes or Processes()
    storage = resolve_dtype(dtype)
    if storage not in DTYPE_NAMES:
        raise ValueError(f"cache dtype must be one of {sorted(DTYPE_NAMES.values())}, got {dtype!r}")
    settings, lengths = _cache_settings(
        target, rows, capture_layers, storage, max_length, pad_token_id, shard_tokens, batch_size
    )
    out_dir = Path(out_dir)
    index, error = None, None
    if procs.main:  # the others wait: it may remove the shards of a cache of other settings
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            index = _start_index(out_dir, settings, overwrite)
            if procs.world > 1:  # the merged record of every process's finished shards, for a rerun
                write_json(out_dir / INDEX_FILE, index)
        except (CacheError, OSError) as e:
            error = e
    procs.agree(error)  # one process: raises its own error, as it is
    index = procs.broadcast(index)
    done = {tuple(s["rows"]): s for s in index["shards"]}
    index["shards"] = []
    written = skipped = 0
    mine = [k for k in range(len(settings["plan"])) if procs.owns(k)]
    bar = tqdm(
        total=sum(int(lengths[slice(*settings["plan"][k])].sum()) for k in mine),
        desc="cache" if procs.world == 1 else f"cache (process {procs.rank} of {procs.world})",
        unit="tok",
        disable=not progress or not procs.main,
        dynamic_ncols=True,
    )
    entries: dict[int, dict] = {}
    for k in mine:
        start, end = settings["plan"][k]
        path = out_dir / f"shard-{k:05d}.safetensors"
        entry = done.get((start, end))
        if entry is None or not path.exists() or sha256_file(path) != entry["sha256"]:
            examples = _rows_slice(rows, start, end)
            tensors = shard_tensors(
                target,
                examples,
                settings["capture_layers"],
                dtype=storage,
                batch_size=batch_size,
                pad_token_id=settings["pad_token_id"],
                max_length=max_length,
                prepacked=settings["prepacked"],
            )
            entry = {"file": path.name, "rows": [start, end], "tokens": int(lengths[start:end].sum())}
            entry["sha256"] = _write_shard(tensors, path, [start, end])
            written += 1
        else:
            skipped += 1
        entries[k] = entry
        if procs.world == 1:
            index["shards"].append(entry)
            index["complete"] = k == len(settings["plan"]) - 1
            write_json(out_dir / INDEX_FILE, index)
            if index["complete"]:
                _remove_rank_records(out_dir)  # an earlier several-process run's, now merged
        else:  # this process's own record: what it has finished, for a rerun
            write_json(
                out_dir / RANK_INDEX.format(rank=procs.rank), {**index, "shards": list(entries.values())}
            )
        bar.update(entry["tokens"])
        if on_shard is not None:
            on_shard(k, entry)
    bar.close()
    if procs.world > 1:
        gathered = procs.gather((entries, written, skipped))
        written, skipped = sum(g[1] for g in gathered), sum(g[2] for g in gathered)
        every = {k: e for g in gathered for k, e in g[0].items()}
        index["shards"] = [every[k] for k in range(len(settings["plan"]))]
        index["complete"] = True
        if procs.main:
            write_json(out_dir / INDEX_FILE, index)
            _remove_rank_records(out_dir)
        procs.barrier()  # no process returns before the index is finished
    size = sum((out_dir / s["file"]).stat().st_size for s in index["shards"])
    return {
        "dir": str(out_dir),
        "shards": len(index["shards"]),
        "written": written,
        "skipped": skipped,
        "tokens": settings["num_tokens"],
        "bytes": size,
    }
