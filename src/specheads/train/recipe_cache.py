"""`specheads cache RECIPE.yaml [key=value ...]`: run the frozen target once over a recipe's data and
store the hidden states its heads read, for offline training.

    specheads cache recipes/tiny/eagle3.yaml --out cache/tiny-eagle3
    specheads train recipes/tiny/eagle3.yaml mode=offline cache_dir=cache/tiny-eagle3

The recipe decides everything the cache must agree with: target and its dtype, data, max_length,
loss_on, packing (pre-packed rows are cached as they are), and the method, which decides the layers
(`hidden_cache.cache_layers`). Writes `OUT/train/` and, when the recipe has evaluation rows, `OUT/eval/`
(each an index.json + shard-*.safetensors). An interrupted run resumes where it stopped.

Several processes share the shards (`build_cache`, "Several processes"), each with a whole copy of the
target on its own device, or, with `device_map="auto"`, the target spread over its share of the machine's
GPUs (a 70B target in bf16 over 2 or 4 GPUs):

    accelerate launch --num_processes 8 -m specheads cache recipes/llama-3.1-8b/eagle3.yaml --out cache/l8
    accelerate launch --num_processes 2 -m specheads cache recipes/llama-3.3-70b/eagle3.yaml \
        --device-map auto --out cache/l70                    # 8 GPUs: each process's target on 4 of them

The cache is the same, byte for byte, whatever the number of processes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from specheads.builders.named_targets import resolve_target
from specheads.core.processes import Processes
from specheads.core.target import FrozenTarget
from specheads.heads.method import Method
from specheads.train import prepare
from specheads.train.hidden_cache import build_cache, cache_layers


def cache_recipe(
    cfg,
    method: Method,
    out: Path,
    *,
    dtype: str = "bfloat16",
    shard_tokens: int = 1 << 15,
    batch_size: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    device_map: str | None = None,
    processes: Processes | None = None,
) -> dict[str, dict]:
    """Build the cache of each split of `cfg`'s data under `out` ({split: build_cache summary}); `method` is
    `cfg.method`'s entry in the method table. `device_map`: "auto" spreads the target over this process's
    GPUs (transformers' device_map; None: the whole target on one device). `processes`: those sharing the
    work (core/processes.py; None: this one alone)."""
    procs = processes or Processes()
    why = method.online_only
    if why:
        raise ValueError(f"method {cfg.method!r} {why}: it trains online, and has nothing to cache")
    if getattr(cfg, "mode", "online") != "online":
        cfg = dataclasses.replace(cfg, mode="online")  # the rows come from the data, not from a cache
    if device_map is None:
        target = prepare.load_target(cfg, resolve_target(cfg.target), procs.device())
    else:
        target = load_spread_target(cfg, resolve_target(cfg.target), device_map, procs)
    layers = cache_layers(method, target.num_layers, [target.layer_id(i) for i in cfg.chosen_layers])
    train_rows, _, eval_loader = prepare.make_data(cfg, target.tokenizer)  # the rows training tokenises
    splits = {"train": train_rows, "eval": eval_loader.dataset if eval_loader is not None else None}
    summaries = {}
    for split, rows in splits.items():
        if rows is None:
            continue
        summaries[split] = build_cache(
            target,
            rows,
            layers,
            out / split,
            max_length=cfg.max_length,
            dtype=dtype,
            shard_tokens=shard_tokens,
            batch_size=batch_size or cfg.batch_size,
            overwrite=overwrite,
            progress=progress,
            processes=procs,
        )
    return summaries


def load_spread_target(cfg, path: str, device_map: str, procs: Processes) -> FrozenTarget:
    """The frozen target placed by transformers' `device_map` (over this process's GPUs: `max_memory`)."""
    target = FrozenTarget.from_pretrained(
        path,
        dtype=cfg.target_dtype,
        attn_implementation=cfg.attn_implementation,
        device_map=device_map,
        max_memory=procs.max_memory(),
        trust_remote_code=cfg.trust_remote_code,
    )
    if target.tokenizer is None:
        raise ValueError(f"target {cfg.target!r} has no tokenizer; the cache needs one")
    return target
