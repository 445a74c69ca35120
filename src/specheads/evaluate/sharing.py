"""How `specheads eval` and `compare` share their prompts out over several processes (core/processes.py),
and place the target: each process decodes every N-th prompt (or group, or conversation) by its number in
the whole run, which decides its order and seed, and process 0 merges the records back in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specheads.core.processes import Processes
from specheads.core.target import FrozenTarget
from specheads.evaluate.progress import PROGRESS_FILE, Progress, rank_file


def placed_target(
    target_path: str, options: Any, procs: Processes, adapt: Callable[[FrozenTarget], FrozenTarget]
) -> FrozenTarget:
    """The target as the options (EvalOptions, CompareOptions) place it, after `adapt` (a Medusa-2
    adapter merged in): on `device` (each process of several on its own GPU, cuda:LOCAL_RANK, where
    `device` is cuda), or spread by `device_map` over this process's GPUs."""
    spread = {}
    if options.device_map is not None:
        spread = {"device_map": options.device_map, "max_memory": procs.max_memory()}
    target = FrozenTarget.from_pretrained(
        target_path,
        dtype=options.dtype,
        attn_implementation=options.attn,
        trust_remote_code=options.trust_remote_code,
        **spread,
    )
    target = adapt(target)
    if options.device_map is None:
        device = options.device
        if procs.world > 1 and device.startswith("cuda"):
            device = str(procs.device())
        target.model.to(device)
    return target


def process_share(
    count: int, batch_size: int, procs: Processes, what: str = "prompts"
) -> tuple[list[int], list[int]]:
    """(the numbers of this process's prompts, the numbers of its groups of `batch_size`): every N-th
    prompt, or with batch_size > 1 every N-th group of consecutive prompts, from its rank on."""
    groups = [list(range(i, min(i + batch_size, count))) for i in range(0, count, batch_size)]
    if len(groups) < procs.world:
        unit = what if batch_size == 1 else f"groups of --batch-size {batch_size}"
        raise ValueError(
            f"{len(groups)} {unit} for {procs.world} processes: each process needs at least one; "
            f"launch at most {len(groups)} processes, or take more {what}"
        )
    mine = procs.share(range(len(groups)))
    return [j for g in mine for j in groups[g]], mine


def merged_records(procs: Processes, numbers: list[int], records: list[Any], count: int) -> list[Any]:
    """Every process's records, in the prompts' order (one process: its own)."""
    if procs.world == 1:
        return records
    merged: list[Any] = [None] * count
    for theirs, their_records in procs.gather((numbers, records)):
        for j, record in zip(theirs, their_records):
            merged[j] = record
    return merged


class NothingSetAside:
    """What the processes other than 0 hold in place of `replacing`'s old results: process 0 drops them."""

    def commit(self) -> None:
        pass


def progress_names(procs: Processes) -> tuple[str, ...]:
    """The progress files a run of `procs` keeps (one, or one a process): what --overwrite sets aside."""
    return (PROGRESS_FILE,) if procs.world == 1 else (PROGRESS_FILE, *map(rank_file, range(procs.world)))


def open_progress(out, command: str, header: dict[str, Any], resume: bool, procs: Processes) -> Progress:
    """This process's progress file: the run's one, or its own (`rank_file`) among several, whose header
    also says which process of how many wrote it."""
    if procs.world > 1:
        header["processes"] = {"rank": procs.rank, "of": procs.world}
    file = PROGRESS_FILE if procs.world == 1 else rank_file(procs.rank)
    return Progress(out, command, header, resume=resume, file=file)
