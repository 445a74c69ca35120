"""Offline mode on the embedded tiny target: bytes stored per token, and tokens/s read back (JSON out).

For each method's layer set (Medusa/EAGLE: the last hidden state; EAGLE-3: three layers + the last)
and each storage dtype, builds a hidden-state cache of the first --rows tokenised rows of the
standard-library training data (the tiny target's own), then reads it back the way training does:
CachedRows + collate_cached through a DataLoader, in order, shuffled, and shuffled with every row
checked against the dataset's tokens. Also the checksum pass `CachedRows(verify=True)` makes.

    python benchmarks/bench_offline.py --rows 512 --out runs/bench-offline.json

Comparing the online step time with the target's forward is another benchmark's; speed is measured
here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from functools import partial
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from specheads.builders.tiny_target import ensure_tiny_target
from specheads.core.target import FrozenTarget
from specheads.data.chat_masks import tokenize_rows
from specheads.methods import method_named
from specheads.train.cached_rows import CachedRows, collate_cached
from specheads.train.hidden_cache import build_cache, cache_layers
from specheads.train.sources import stdlib_rows


def tiny_rows(tokenizer, rows: int, max_length: int, files: int):
    """The first `rows` max_length windows of the first `files` stdlib training files."""
    texts = stdlib_rows(heldout=False).select(range(files))
    tokens = tokenize_rows(texts, tokenizer, max_length=max_length, loss_on="all")
    if len(tokens) < rows:
        raise SystemExit(f"{files} files give {len(tokens)} rows, fewer than --rows {rows}: raise --files")
    return tokens.select(range(rows))


def read_rate(dataset, batch_size: int, pad_token_id: int, max_length: int, shuffle: bool) -> float:
    """Tokens per second through a DataLoader over the cache (one pass, main process)."""
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        generator=torch.Generator().manual_seed(0),
        collate_fn=partial(collate_cached, pad_token_id=pad_token_id, packing=False, max_length=max_length),
    )
    started, tokens = time.perf_counter(), 0
    for batch in loader:
        tokens += int((batch["attention_mask"] > 0).sum())
    return tokens / (time.perf_counter() - started)


def bench_one(target, rows, method, dtype, work: Path, args) -> dict:
    layers = cache_layers(
        method_named(method), target.num_layers
    )  # EAGLE-3: its default layers, (1, 2, 3) on the tiny target
    out = work / f"{method}-{dtype}"
    started = time.perf_counter()
    summary = build_cache(
        target,
        rows,
        layers,
        out,
        max_length=args.max_length,
        dtype=dtype,
        shard_tokens=args.shard_tokens,
        batch_size=args.batch_size,
        overwrite=True,
        progress=False,
    )
    build_seconds = time.perf_counter() - started
    started = time.perf_counter()
    CachedRows(out, verify=True)
    verify_seconds = time.perf_counter() - started
    plain, checked = CachedRows(out, verify=False), CachedRows(out, expected=rows, verify=False)
    pad = target.tokenizer.pad_token_id
    rate = partial(read_rate, batch_size=args.batch_size, pad_token_id=pad, max_length=args.max_length)
    itemsize = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return {
        "method": method,
        "layers": list(layers),
        "dtype": dtype,
        "tokens": summary["tokens"],
        "shards": summary["shards"],
        "bytes": summary["bytes"],
        "bytes_per_token": summary["bytes"] / summary["tokens"],
        "hidden_bytes_per_token": len(layers) * target.hidden_size * itemsize,
        "build_tokens_per_second": summary["tokens"] / build_seconds,
        "verify_megabytes_per_second": summary["bytes"] / 1e6 / verify_seconds,
        "read_tokens_per_second_in_order": max(rate(plain, shuffle=False) for _ in range(args.repeats)),
        "read_tokens_per_second_shuffled": max(rate(plain, shuffle=True) for _ in range(args.repeats)),
        "read_tokens_per_second_shuffled_checked": max(
            rate(checked, shuffle=True) for _ in range(args.repeats)
        ),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--files", type=int, default=64, help="stdlib training files to tokenise")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--shard-tokens", type=int, default=1 << 15)
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--methods", default="medusa,eagle3")
    p.add_argument("--repeats", type=int, default=2, help="read passes per figure (best is kept)")
    p.add_argument(
        "--work", type=Path, default=None, help="where the caches go (default: a temporary folder)"
    )
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: print)")
    args = p.parse_args()

    path, meta, _ = ensure_tiny_target()
    target = FrozenTarget.from_pretrained(str(path), dtype="float32")
    rows = tiny_rows(target.tokenizer, args.rows, args.max_length, args.files)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        results = [
            bench_one(target, rows, method, dtype, work, args)
            for method in args.methods.split(",")
            for dtype in args.dtypes.split(",")
        ]
    report = {
        "target": {
            "path": str(path),
            "hidden_size": target.hidden_size,
            "num_layers": target.num_layers,
            "vocab_size": target.vocab_size,
            "parameters": meta["parameters"],
        },
        "rows": args.rows,
        "max_length": args.max_length,
        "batch_size": args.batch_size,
        "results": results,
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
    }
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
