"""Where a recipe's rows come from: named built-in sources, or anything `data.load_rows` reads.

Built-in:
    stdlib            the pinned standard-library corpus (data/stdlib_corpus.py), split as the tiny target splits it: training
                      rows from its training files, evaluation rows from its held-out files (one text row
                      a file; tokenize_rows cuts long ones into max_length windows).
    stdlib-distilled  the recipe's target continuing stdlib text (self-distillation, data/distillation.py,
                      settings `distill.STDLIB_DISTILLED`): windows of 255 tokens of the training
                      files (shuffled, seed 0), each keeping its first 32 tokens and the target's
                      greedy continuation after them; one 256-token row each once tokenize_rows adds
                      the BOS. As many windows as one epoch of the run needs (max_steps x
                      batch_size x grad_accum x processes rows: 960 for a tiny recipe on one
                      process). Distilled once per target and size (29 s on 2 CPU cores for the
                      tiny target's 960) and cached; its evaluation rows are stdlib's held-out files.
    stdlib-chats      chat rows made from the corpus's documented functions (stdlib_corpus.function_chats,
                      STDLIB_CHATS_PER_FILE a file): the user gives a signature and docstring, the assistant
                      writes the function, in the target's own chat template. A chat sharing any 6-word
                      sequence with MT-Bench or Spec-Bench is left out (seed_prompts.touches_evaluation). Human text, no generation:
                      with `labels: target` (EAGLE always) the target labels it with its own distribution
                      in the training forward, so the data costs nothing to make (2,183 training rows,
                      ~160k tokens for SmolLM2). Evaluation rows from the held-out files.

Both are built once under the specheads cache (`SPECHEADS_CACHE`, else ~/.cache/specheads) and read
back from disk afterwards, so their `datasets` fingerprints are stable and tokenize_rows' cache hits
on every later run (an in-memory dataset is tokenised again each time):

    stdlib-rows/{train,heldout}-KEY/     KEY: the corpus's content key and the files
    stdlib-distilled/KEY/                KEY: the target, the distillation settings, the stdlib rows
    stdlib-chats/{train,heldout}-KEY/    KEY: as stdlib-rows, and the chats per file
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path

import datasets
import torch
from filelock import FileLock

from specheads import data as data_lib
from specheads.builders.named_targets import resolve_target
from specheads.builders.tiny_target import TinyTargetConfig, default_cache_dir
from specheads.core.atomic import replace_dir
from specheads.core.target import FrozenTarget
from specheads.data import distillation as distill
from specheads.data import stdlib_corpus
from specheads.data.distill_folder import is_complete
from specheads.data.readers import concatenate_rows
from specheads.data.seed_prompts import touches_evaluation
from specheads.train.config import TrainConfig

STDLIB_ROWS_VERSION = 1  # bump when the rows stdlib_rows gives change, to invalidate the cache
STDLIB_CHATS_PER_FILE = 8


def _stdlib_files(heldout: bool) -> tuple[stdlib_corpus.Corpus, list[str]]:
    corpus = stdlib_corpus.stdlib_corpus()
    train_files, heldout_files = stdlib_corpus.split_files(corpus.files, TinyTargetConfig.heldout_fraction)
    return corpus, heldout_files if heldout else train_files


def _built_once(kind: str, heldout: bool, salt: str, build) -> datasets.Dataset:
    """The dataset `build()` gives, saved under the cache once and read back from disk afterwards."""
    key = hashlib.sha256(salt.encode()).hexdigest()[:16]
    path = default_cache_dir() / kind / f"{'heldout' if heldout else 'train'}-{key}"
    if not (path / "dataset_info.json").is_file():
        _save_atomic(build(), path)
    return datasets.load_from_disk(str(path))


def stdlib_rows(heldout: bool) -> datasets.Dataset:
    """The stdlib's training (or held-out) files as text rows, built once and read from the cache."""
    corpus, files = _stdlib_files(heldout)
    return _built_once(
        "stdlib-rows",
        heldout,
        f"v{STDLIB_ROWS_VERSION}|{corpus.key}|{'|'.join(files)}",
        lambda: datasets.Dataset.from_dict({"text": [corpus.texts[f] for f in files]}),
    )


def stdlib_chat_rows(heldout: bool) -> datasets.Dataset:
    """`stdlib-chats`: the documented functions of the training (or held-out) files as chat rows."""
    corpus, files = _stdlib_files(heldout)
    per_file = STDLIB_CHATS_PER_FILE
    return _built_once(
        "stdlib-chats",
        heldout,
        f"v{STDLIB_ROWS_VERSION}|{corpus.key}|{per_file}|eval-6grams|{'|'.join(files)}",
        lambda: datasets.Dataset.from_dict(
            {
                "messages": [
                    chat
                    for f in files
                    for chat in stdlib_corpus.function_chats(corpus.texts[f], per_file)
                    if not touches_evaluation(turn["content"] for turn in chat)
                ]
            }
        ),
    )


def _save_atomic(dataset: datasets.Dataset, path: Path) -> None:
    """save_to_disk into a temporary folder renamed to `path`; another process's finished copy wins."""
    with replace_dir(path, keep_existing=True) as tmp:
        dataset.save_to_disk(str(tmp))


def epoch_rows(cfg: TrainConfig, num_processes: int | None = None) -> int:
    """Rows a run of `cfg` reads, over all its processes (WORLD_SIZE, set by `accelerate launch`, when
    not given): max_steps x batch_size x grad_accum x processes, as train/sampler.py draws them."""
    if num_processes is None:
        num_processes = int(os.environ.get("WORLD_SIZE", "1"))
    return cfg.max_steps * cfg.batch_size * cfg.grad_accum * num_processes


def stdlib_distilled_rows(target: str, num_rows: int, progress: bool = True) -> datasets.Dataset:
    """`stdlib-distilled` for `target` (a recipe's `target`): `num_rows` windows, distilled on first use."""

    path = resolve_target(target)
    cfg = dataclasses.replace(distill.STDLIB_DISTILLED, max_rows=num_rows)
    rows = stdlib_rows(heldout=False).shuffle(seed=0)
    record = _target_key(path)
    key = hashlib.sha256(json.dumps([record, distill.settings_of(cfg), rows._fingerprint]).encode())
    out = default_cache_dir() / "stdlib-distilled" / key.hexdigest()[:16]
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out) + ".lock"):  # one process distills, the others (accelerate launch) wait
        if not is_complete(out):
            model = FrozenTarget.from_pretrained(path, dtype="float32")
            distill.distill(rows, model, out, cfg, source="stdlib (shuffled, seed 0)", progress=progress)
    return data_lib.load_rows(out)


def _target_key(path: str) -> str:
    """What names a target for the distilled cache: its path and its config and weights files' stats."""
    parts = [str(Path(path).expanduser().resolve()) if os.path.isdir(path) else path]
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        f = Path(path) / name
        if f.is_file():
            parts.append(f"{name}:{f.stat().st_size}:{f.stat().st_mtime_ns}")
    return "|".join(parts)


def _load(source: str, cfg: TrainConfig, heldout: bool = False) -> datasets.Dataset:
    if source == "stdlib":
        return stdlib_rows(heldout)
    if source == "stdlib-distilled":
        return stdlib_rows(heldout=True) if heldout else stdlib_distilled_rows(cfg.target, epoch_rows(cfg))
    if source == "stdlib-chats":
        return stdlib_chat_rows(heldout)
    return data_lib.load_rows(source, max_bad_rows=cfg.max_bad_rows, include_capped=cfg.include_capped)


def rows_for(cfg: TrainConfig) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """(training rows, evaluation rows or None) for a recipe."""
    train = concatenate_rows([_load(s, cfg) for s in cfg.data])
    if cfg.eval_data:
        return train, concatenate_rows([_load(s, cfg, heldout=True) for s in cfg.eval_data])
    if cfg.data in (["stdlib"], ["stdlib-distilled"], ["stdlib-chats"]):
        return train, _load(cfg.data[0], cfg, heldout=True)
    if cfg.eval_fraction == 0 or len(train) < 2:
        return train, None
    keys = prompt_keys(train)
    if keys is None or len(set(keys)) in (1, len(keys)):  # one row a prompt (or one prompt): split the rows
        split = train.train_test_split(test_size=cfg.eval_fraction, seed=cfg.seed)
        return split["train"], split["test"]
    return split_by_prompt(train, keys, cfg.eval_fraction, cfg.seed)


def prompt_keys(rows: datasets.Dataset) -> list[str] | None:
    """Each conversation's prompt (its turns before the first answer), or None for text rows."""
    if "messages" not in rows.column_names:
        return None
    keys = []
    for messages in rows["messages"]:
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        keys.append(json.dumps(messages[:first], sort_keys=True, ensure_ascii=False))
    return keys


def split_by_prompt(
    rows: datasets.Dataset, keys: list[str], fraction: float, seed: int
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """Hold out `fraction` of the distinct prompts with every row that answers them.

    Data that answers each prompt several times (a greedy and a sampled distillation of the same prompts)
    would otherwise hold out rows whose prompt, answered another way, is trained on."""
    distinct = sorted(set(keys))
    order = torch.randperm(len(distinct), generator=torch.Generator().manual_seed(seed)).tolist()
    held = {distinct[i] for i in order[: max(1, math.ceil(fraction * len(distinct)))]}
    test = [i for i, k in enumerate(keys) if k in held]
    train = [i for i, k in enumerate(keys) if k not in held]
    return rows.select(train), rows.select(test)
