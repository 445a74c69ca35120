"""A cheap fingerprint of a target's weights: same shapes are not the same model.

Heads fitted to one target run silently at τ 1.00 against a same-shape target trained with another seed;
the vocabulary hash and the sizes cannot tell the two apart. The fingerprint is a sha256 over a fixed,
evenly spaced sample of SAMPLES values of the input embedding and the lm_head (the tensors every load of a
target holds, the offline one's included), each rounded to bfloat16 so that a float32 and a bfloat16 load
of the same weights agree. Integer strides, so every device picks the same values.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from specheads.core.confined import confined

SAMPLES = 4096  # values a tensor


def weights_fingerprint(tensors: dict[str, torch.Tensor]) -> str | None:
    """ "sample-sha256:<hex>" over `tensors` (name -> weight); None when one is not whole here (a ZeRO-3
    shard holds an empty placeholder)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        flat = tensors[name].detach().reshape(-1)
        if flat.numel() == 0:
            return None
        n = min(SAMPLES, flat.numel())
        index = torch.arange(n, device=flat.device) * (flat.numel() // n)
        values = flat[index].to(torch.bfloat16).to(torch.float32).cpu()
        digest.update(f"{name}:{tuple(tensors[name].shape)}:".encode())
        digest.update(values.numpy().tobytes())
    return "sample-sha256:" + digest.hexdigest()[:32]


# -- the whole weights ------------------------------------------------------------------------------
#
# The sample above misses a change anywhere else (a fine-tune of the middle layers keeps it). The target
# record also holds a sha256 of every weight: of the safetensors files a local directory loads from, read
# in chunks ("files-sha256:..."), or, for a model that came from elsewhere, of every parameter's and
# buffer's bytes in memory ("params-<dtypes>-sha256:..."). Two records are compared on it only when both
# have one of the same kind; a record of either kind alone (an older checkpoint) falls back to the sample.

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_CHUNK = 1 << 24
_files_cache: dict[tuple, str] = {}


def weights_files(directory: str | Path) -> list[Path]:
    """The safetensors files a HF directory's weights load from: the shards its index names, else its
    model.safetensors; [] when it has neither (other formats, a hub id)."""
    if not str(directory):
        return []
    directory = Path(os.path.expanduser(str(directory)))
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{index}: not a safetensors index ({e})") from None
        return [
            confined(directory, shard, index, '"weight_map" entry', follow_links=False) for shard in shards
        ]
    single = directory / SINGLE_FILE
    return [single] if single.is_file() else []


def files_sha256(files: list[Path]) -> str | None:
    """ "files-sha256:<hex>" over `files`' names and bytes, streamed; None for no files. Kept per process
    by path, size and modification time: a run reads its target's record more than once."""
    if not files:
        return None
    stats = tuple((str(f), *_stat(f)) for f in files)
    if stats in _files_cache:
        return _files_cache[stats]
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{Path(f).name}\0".encode())
        with open(f, "rb") as stream:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
    _files_cache[stats] = value = "files-sha256:" + digest.hexdigest()
    return value


def _stat(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def tensors_sha256(module: torch.nn.Module) -> str | None:
    """ "params-<dtypes>-sha256:<hex>" over every parameter's and buffer's name, shape and bytes (each
    shared tensor once); None when one is not whole here (ZeRO-3) or not materialised (meta)."""
    digest, dtypes = hashlib.sha256(), set()
    seen: set[int] = set()
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    for name, tensor in sorted(named, key=lambda kv: kv[0]):
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        if tensor.is_meta or hasattr(tensor, "ds_id"):
            return None
        dtypes.add(str(tensor.dtype).removeprefix("torch."))
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}\0".encode())
        data = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return f"params-{'+'.join(sorted(dtypes))}-sha256:" + digest.hexdigest()


def same_kind(a: str, b: str) -> bool:
    """Whether two whole-weight hashes are of one kind (files, or parameters of the same dtypes)."""
    return a.rsplit(":", 1)[0] == b.rsplit(":", 1)[0]
