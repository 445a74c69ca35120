"""Reading the hidden-state cache (train/hidden_cache.py: its format, and `build_cache`, which writes it):
`CachedRows`, a Dataset over its shards whose row i is the dataset's row i, and `collate_cached`, which
batches its rows as `collate` batches the online ones, the target's hidden states laid out as the tokens.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch.utils.data import Dataset

from specheads.core.target import TargetRecord
from specheads.data.packing import collate
from specheads.heads.checkpoint import sha256_file
from specheads.train.hidden_cache import (
    CacheCorruptError,
    CacheError,
    TokenMismatchError,
    read_index,
    scan_rows,
)


class CachedRows(Dataset):
    """The cache as a map-style Dataset: item i is row i of the data it was built from.

    Item: {"input_ids" (n,) long, "loss_mask" (n,) int8, ["position_ids" (n,) long], "hidden":
    {layer: (n, H)}}; `collate_cached` turns a list of them into a batch. Built with the same
    DataLoader arguments as the online loader (batch size, shuffle with the same seeded generator,
    drop_last), it yields the same rows in the same batches: the sampler only sees `len`.

    Args:
        cache_dir: a finished cache (build_cache).
        expected: the tokenised rows training would use; each row read is checked against them
            (TokenMismatchError names the shard and row).
        target: a TargetRecord to check the cache's against (TargetMismatchError).
        layers: the layers to read (default: all cached); each must be cached.
        verify: check now that `expected` is the data the cache was built from (all its tokens at
            once, TokenMismatchError), and checksum every shard (CacheCorruptError names the shard).
    """

    def __init__(
        self,
        cache_dir: str | Path,
        *,
        expected=None,
        target: TargetRecord | None = None,
        layers: Iterable[int] | None = None,
        verify: bool = True,
    ):
        self.dir = Path(cache_dir)
        self.index = index = read_index(self.dir)
        if not index.get("complete") or len(index["shards"]) != len(index["plan"]):
            raise CacheError(
                f"{self.dir}: unfinished cache ({len(index['shards'])} of {len(index['plan'])} shards); "
                "run `specheads cache` again to finish it"
            )
        if target is not None:
            TargetRecord.from_dict(index["target"]).check_matches(target, what="the hidden-state cache")
        cached = index["capture_layers"]
        self.layers = sorted(set(cached if layers is None else layers))
        missing = [i for i in self.layers if i not in cached]
        if missing:
            raise CacheError(
                f"{self.dir} holds layers {cached}, not {missing}; "
                "rebuild it for this method (cache_layers())"
            )
        if expected is not None and len(expected) != index["num_rows"]:
            raise TokenMismatchError(
                f"{self.dir} holds {index['num_rows']} rows, the dataset has {len(expected)}: the cache was "
                "built from other data or another tokenisation; rebuild it with `specheads cache`"
            )
        self.expected = expected
        self.shards = index["shards"]
        self.starts = [s["rows"][0] for s in self.shards]
        if verify:
            if expected is not None and scan_rows(expected)[1] != index["tokens_sha256"]:
                raise TokenMismatchError(
                    f"{self.dir} was built from other rows than the dataset's (their tokens' sha256 "
                    "differs): other data, max_length, loss_on or tokenizer; rebuild it with `specheads cache`"
                )
            for shard in self.shards:
                self.verify_shard(shard)
        self._open: dict[int, tuple[Any, dict[str, Any]]] = {}

    def verify_shard(self, shard: dict) -> None:
        path = self.dir / shard["file"]
        if not path.exists():
            raise CacheCorruptError(f"{path}: shard missing (rows {shard['rows']})")
        if sha256_file(path) != shard["sha256"]:
            raise CacheCorruptError(
                f"{path}: checksum mismatch (rows {shard['rows']}); the file is corrupt or was changed. "
                "Run `specheads cache` again: it rewrites shards whose checksum fails"
            )

    def __len__(self) -> int:
        return self.index["num_rows"]

    def __getstate__(self):  # open files stay behind when DataLoader workers are started
        return {**self.__dict__, "_open": {}}

    def _shard(self, k: int) -> tuple[Any, dict[str, Any]]:
        if k not in self._open:
            if len(self._open) >= 64:
                self._open.pop(next(iter(self._open)))
            handle = safe_open(str(self.dir / self.shards[k]["file"]), framework="pt")
            small = ["input_ids", "loss_mask", "row_offsets"] + (
                ["position_ids"] if self.index["prepacked"] else []
            )
            tensors = {name: handle.get_tensor(name) for name in small}
            tensors["row_offsets"] = tensors["row_offsets"].tolist()
            self._open[k] = (handle, tensors)
        return self._open[k]

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} of a cache of {len(self)} rows")
        k = bisect.bisect_right(self.starts, i) - 1
        handle, small = self._shard(k)
        r = i - self.starts[k]
        a, b = small["row_offsets"][r], small["row_offsets"][r + 1]
        row = {"input_ids": small["input_ids"][a:b].long(), "loss_mask": small["loss_mask"][a:b]}
        if "position_ids" in small:
            row["position_ids"] = small["position_ids"][a:b].long()
        if self.expected is not None:
            self._check_tokens(i, k, r, row)
        row["hidden"] = {layer: handle.get_slice(f"hidden.{layer}")[a:b] for layer in self.layers}
        return row

    def _check_tokens(self, i: int, k: int, r: int, row: dict) -> None:
        want = self.expected[i]
        for name in ("input_ids", "loss_mask"):
            have, expect = row[name], torch.as_tensor(want[name], dtype=row[name].dtype)
            if have.shape != expect.shape:
                problem = f"{len(have)} tokens cached, {len(expect)} in the dataset"
            elif not torch.equal(have, expect):
                j = int((have != expect).nonzero()[0])
                problem = f"{name}[{j}] is {int(have[j])} in the cache, {int(expect[j])} in the dataset"
            else:
                continue
            raise TokenMismatchError(
                f"hidden-state cache {self.dir}: row {i} ({self.shards[k]['file']}, its row {r}) does not "
                f"match the dataset: {problem}. The cache was built from other data or another "
                "tokenisation; rebuild it with `specheads cache` for this recipe"
            )


def collate_cached(examples: list[dict], **layout) -> dict[str, torch.Tensor]:
    """`collate` over CachedRows items, plus `hidden.{layer}` (B, T, H) laid out as the tokens are.
    `layout`: collate's keywords (pad_token_id, packing, max_length, mask_dtype).

    The tensors of `collate` are the online batch's exactly (same rows, same function); the hidden
    states land where their tokens did (padding positions hold zeros).
    """
    tokens = [{k: v for k, v in ex.items() if k != "hidden"} for ex in examples]
    batch = collate(tokens, **layout)
    packing, max_length = layout["packing"], layout["max_length"]
    # Where each token landed: collate the tokens' numbers in the concatenation, with the same layout.
    lengths = [len(t["input_ids"]) for t in tokens]
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    numbered = [{**t, "input_ids": torch.arange(s, s + n)} for t, s, n in zip(tokens, starts, lengths)]
    where = collate(numbered, pad_token_id=-1, packing=packing, max_length=max_length)["input_ids"]  # (B, T)
    real = (where >= 0)[..., None]
    for layer in examples[0]["hidden"]:
        flat = torch.cat([ex["hidden"][layer] for ex in examples])  # (N, H)
        gathered = flat[where.clamp_min(0)]  # (B, T, H)
        batch[f"hidden.{layer}"] = torch.where(real, gathered, torch.zeros((), dtype=flat.dtype))
    return batch
