"""What a training run is set up from before its first step (train/loop.py): the frozen target, the heads,
the training rows and their batches, and the learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from specheads import data as data_lib
from specheads.core.target import FrozenTarget, TargetRecord
from specheads.data.chat_masks import read_chat_template, set_chat_template
from specheads.data.checks import check_label_tokens
from specheads.heads.method import Method
from specheads.train.cached_rows import CachedRows, collate_cached
from specheads.train.config import TrainConfig
from specheads.train.distributed import is_partitioned
from specheads.train.eagle_losses import count_label_tokens
from specheads.train.hidden_cache import cache_layers
from specheads.train.offline_target import OfflineTarget
from specheads.train.sampler import EpochBatches
from specheads.train.sources import rows_for


def load_target(cfg: TrainConfig, path: str, device: torch.device) -> FrozenTarget | OfflineTarget:
    """The frozen target; every process loads it at once (under ZeRO-3 loading is a collective).
    Offline, only its embedding, final norm and lm_head: the cache holds its hidden states."""
    template = read_chat_template(cfg.chat_template) if cfg.chat_template else ""  # before the target loads
    trust = cfg.trust_remote_code
    if cfg.mode == "offline":
        target = OfflineTarget.from_pretrained(
            path, dtype=cfg.target_dtype, device=device, trust_remote_code=trust
        )
    else:
        target = FrozenTarget.from_pretrained(
            path, dtype=cfg.target_dtype, attn_implementation=cfg.attn_implementation, trust_remote_code=trust
        )
    if not is_partitioned(target.model):  # a ZeRO-3 target is placed by its engine (shard_target)
        target.model.to(device)
    if target.tokenizer is None:
        raise ValueError(f"target {cfg.target!r} has no tokenizer; training needs one")
    set_chat_template(target.tokenizer, template, cfg.enable_thinking)  # chat_template, enable_thinking
    return target


def token_rows(rows):
    """The tokenised rows behind `rows`: offline, the rows the cache was built from (tokens and loss
    masks, for what reads only those: EAGLE-3's draft vocabulary, the label counts)."""
    return rows.expected if isinstance(rows, CachedRows) else rows


def build_heads(
    cfg: TrainConfig,
    method: Method,
    target: FrozenTarget,
    train_rows=None,
    label_counts: torch.Tensor | None = None,
) -> tuple[nn.Module, dict]:
    """The heads `method` (`cfg.method`'s entry in the method table) builds, on the target's device, and
    notes for the training record. `label_counts`: the rows' (`label_counts_of`), when counted already."""
    if label_counts is None:
        label_counts = label_counts_of(train_rows or [], target)
    return method.build_heads(cfg, target, label_counts)


def label_counts_of(train_rows, target: FrozenTarget) -> torch.Tensor:
    """(V,) how often each token is a label in the training rows: EAGLE-3's draft vocabulary is the most
    frequent, and every checkpoint saves them (checkpoint.py). One pass over the rows, once a run."""
    return count_label_tokens(token_rows(train_rows), target.vocab_size)


def lr_lambda(step: int, cfg: TrainConfig) -> float:
    """The lr factor of optimizer step `step` (0-based): linear warm-up to 1 over `cfg.warmup` steps, then
    `cfg.lr_schedule`: cosine decay to 0.1 at max_steps, or linear decay to 0 at max_steps."""
    warmup = cfg.warmup
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, cfg.max_steps - warmup))
    if cfg.lr_schedule == "linear":
        return 1.0 - progress
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def data_seed(cfg: TrainConfig) -> int:
    """The seed of the training rows' order: data_seed, or seed when it is -1."""
    return cfg.seed if cfg.data_seed < 0 else cfg.data_seed


def make_data(
    cfg: TrainConfig,
    tokenizer,
    target: TargetRecord | None = None,
    verify: bool = True,
    method: Method | None = None,
) -> tuple:
    """(training rows, the collate function, the held-out DataLoader or None).

    Online, the rows are the tokenised data. Offline, they are the cache's rows (`cache_dir/train`,
    `cache_dir/eval`), each checked against the tokenised row it stands for, and the cache against
    `target` and the layers `method` (`cfg.method`'s entry, needed offline) reads; `verify` also checksums
    every shard first.
    """
    train_rows, eval_rows = rows_for(cfg)
    tokenize = partial(
        data_lib.tokenize_rows,
        tokenizer=tokenizer,
        max_length=cfg.max_length,
        loss_on=cfg.loss_on,
        max_bad_rows=cfg.max_bad_rows,
        reasoning=cfg.reasoning,
    )
    layout = dict(pad_token_id=tokenizer.pad_token_id, packing=cfg.packing, max_length=cfg.max_length)
    collate = partial(data_lib.collate, **layout)
    train_ds = tokenize(train_rows)
    if len(train_ds) == 0:
        raise ValueError(f"training data {cfg.data} gave no rows")
    check_label_tokens(
        train_ds, cfg.min_label_tokens, cfg.min_label_tokens_per_row, f"training data {cfg.data}", cfg.loss_on
    )
    eval_ds = tokenize(eval_rows) if eval_rows is not None else None
    if cfg.mode == "offline":
        collate = partial(collate_cached, **layout)
        if method is None:
            raise ValueError("offline training data needs the method's entry (make_data's `method`)")
        layers = cache_layers(method, target.num_layers, cfg.chosen_layers)  # what the heads read
        cached = partial(CachedRows, target=target, layers=layers, verify=verify)
        train_ds = cached(Path(cfg.cache_dir) / "train", expected=train_ds)
        if eval_ds is not None:
            eval_ds = cached(Path(cfg.cache_dir) / "eval", expected=eval_ds)
    evaluate = None
    if eval_ds is not None:
        evaluate = DataLoader(eval_ds, batch_size=cfg.batch_size, collate_fn=collate)
    return train_ds, collate, evaluate


def train_batches(cfg: TrainConfig, dataset, collate, accelerator, start: int) -> Iterator[dict]:
    """This process's share of every global batch from position `start` on, endlessly, on its device."""
    sampler = EpochBatches(
        len(dataset),
        cfg.batch_size,
        num_processes=accelerator.num_processes,
        rank=accelerator.process_index,
        seed=data_seed(cfg),
        start=start,
    )
    # The generator only seeds worker processes; without one the loader would draw on the global RNG.
    # On a GPU the batch is copied from page-locked memory without waiting: a blocking copy would make
    # the host wait for the previous step's queued work before it queues this one.
    cuda = torch.device(accelerator.device).type == "cuda"
    loader = DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=cfg.num_workers,
        generator=torch.Generator().manual_seed(data_seed(cfg)),
        pin_memory=cuda,
    )
    for batch in loader:
        yield {k: v.to(accelerator.device, non_blocking=cuda) for k, v in batch.items()}
