"""`specheads cache RECIPE.yaml [key=value ...] [--out DIR]`: precompute the target's hidden states for offline
training (train/recipe_cache.py, train/hidden_cache.py). `accelerate launch --num_processes N -m specheads
cache ...` (or torchrun) shares the shards out over N processes; the cache is the same as one process's."""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

from specheads.cli.target_flags import add_device_map_argument, add_trust_remote_code_argument
from specheads.cli.threads import add_threads_argument
from specheads.core.processes import launched
from specheads.core.run_folder import check_writable, hold_folder
from specheads.methods import method_named, methods
from specheads.train import host_memory
from specheads.train.recipe import load_config
from specheads.train.recipe_cache import cache_recipe


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", type=Path, help="YAML recipe (recipes/...)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="recipe values to override")
    p.add_argument("--out", type=Path, default=None, help="cache directory (default: the recipe's cache_dir)")
    p.add_argument("--dtype", default="bfloat16", help="storage dtype: bfloat16 (default), float16, float32")
    p.add_argument("--shard-tokens", type=int, default=1 << 15, help="tokens per shard file")
    p.add_argument("--batch-size", type=int, default=None, help="rows per target forward (default: recipe's)")
    p.add_argument("--overwrite", action="store_true", help="replace a cache built with other settings")
    add_trust_remote_code_argument(p)
    add_device_map_argument(p)
    p.add_argument("--no-progress", action="store_true")
    add_threads_argument(p)


def run(args: argparse.Namespace) -> int:
    procs = launched()  # one process unless started by accelerate launch / torchrun
    cfg = load_config(args.recipe, args.overrides, methods=methods())
    cfg.trust_remote_code |= args.trust_remote_code
    out = args.out or getattr(cfg, "cache_dir", None)
    if not out:
        raise SystemExit(
            "specheads cache: error: no cache directory: pass --out DIR or set cache_dir in the recipe"
        )
    check_writable(out, "cache folder")  # before the target loads
    # a second cache into the folder stops at once, naming this one (process 0 holds it for all); the
    # target's forwards free and allocate the same large activations every batch, so glibc keeps them as in
    # training (the recipe's keep_host_memory)
    held = hold_folder(out, "cache folder") if procs.main else nullcontext()
    with held, host_memory.keep_freed_memory(cfg.keep_host_memory):
        summaries = cache_recipe(
            cfg,
            method_named(cfg.method),
            Path(out),
            dtype=args.dtype,
            shard_tokens=args.shard_tokens,
            batch_size=args.batch_size,
            overwrite=args.overwrite,
            progress=not args.no_progress,
            device_map=args.device_map,
            processes=procs,
        )
    if not procs.main:
        return 0
    for split, s in summaries.items():
        print(
            f"{split}: {s['tokens']} tokens in {s['shards']} shards ({s['written']} written, {s['skipped']} "
            f"already there), {s['bytes'] / max(s['tokens'], 1):.0f} bytes/token -> {s['dir']}"
        )
    return 0
