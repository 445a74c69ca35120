"""What `specheads eval` and `compare` do alike: load and place the target, share their prompts out over
several processes (core/processes.py), and hold their --out folder while they run. Each process decodes
every N-th prompt (or group, or conversation) by its number in the whole run, which decides its order and
seed, and process 0 merges the records back in order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

from specheads.core.processes import Processes
from specheads.core.run_folder import hold_folder, replacing
from specheads.core.target import FrozenTarget
from specheads.evaluate.peers import adapted_target
from specheads.evaluate.progress import PROGRESS_FILE, Progress, rank_file
from specheads.evaluate.prompts import apply_chat_options, read_template


def placed_target(target_path: str, options: Any, procs: Processes, heads: list[str]) -> FrozenTarget:
    """The target as the options (EvalOptions, CompareOptions) set it up: with `threads` torch threads;
    its tokenizer given `chat_template` (read first: a wrong path fails before the target loads) and
    `enable_thinking`; with the Medusa-2 adapter of the one directory in `heads` merged in, where it
    carries one (peers.adapted_target: the adapted target decodes, heads and baseline alike); then on
    `device` (each process of several on its own GPU, cuda:LOCAL_RANK, where `device` is cuda), or spread
    by `device_map` over this process's GPUs."""
    if options.threads is not None:
        torch.set_num_threads(options.threads)
    template = read_template(options)
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
    apply_chat_options(target.tokenizer, template, options)
    target = adapted_target(target, heads)
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


@contextmanager
def results_folder(
    out: Path, results: Iterable[str], command: str, header: dict[str, Any], options: Any, procs: Processes
) -> Iterator[tuple[Progress, Callable[[Any], None]]]:
    """The hold of a `specheads eval` or `compare` (`command`) on its folder `out` while it decodes into it:
    process 0 holds the folder (a second eval or compare on it stops at once) and, with `options.overwrite`,
    sets `results` and the progress files aside (core/run_folder.py: `replacing`); then each process opens
    its progress file (`open_progress`, with `header` and `options.resume`). Yields (that progress, `keep`):
    `keep(record)` appends a finished record, and once the first is kept the old results go. The block
    writes the results; leaving it without an error removes every process's progress file, and process 0
    lets the folder go once they all are."""
    with (
        hold_folder(out) if procs.main else nullcontext(),
        replacing(out, results, options.overwrite, also=progress_names(procs))
        if procs.main
        else nullcontext(NothingSetAside()) as old,
    ):
        procs.barrier()  # process 0 has set old results aside: the others' progress files start after that
        progress = open_progress(out, command, header, options.resume, procs)

        def keep(record: Any) -> None:
            progress.append(record)
            old.commit()  # the new run has kept a record: the old results go

        yield progress, keep
        procs.barrier()
        progress.remove()
        procs.barrier()  # process 0 lets the folder go once every progress file is gone
