"""The processes a command was launched as: `accelerate launch --num_processes N` or `torchrun` start N
copies of a command, each with RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR / MASTER_PORT) in its
environment. Commands that share their work out over them (`specheads cache`, `eval`) take a `Processes`:

    procs = launched()                 # one process unless the launcher started several
    mine = procs.share(range(100))     # this process's items: every N-th, from its rank on
    everyone = procs.gather(result)    # [rank 0's, rank 1's, ...] on every process
    procs.barrier()

The processes talk over gloo, which needs no accelerator (CUDA tensors never pass through it: only small
Python objects do). One process (`Processes()`) does everything itself, with no process group.

Placement: each process decodes or caches on `device()` (cuda:LOCAL_RANK where there are GPUs, else the
CPU); a target too large for one device is spread by transformers' `device_map="auto"` over the GPUs of this
process's share (`max_memory()`: the machine's GPUs split evenly between the processes on it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class Processes:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def share(self, items: Sequence[T]) -> list[T]:
        """This process's items: items[rank], items[rank + world], ... (a split that keeps every item's
        index, so that results merge back in order)."""
        return list(items[self.rank :: self.world])

    def owns(self, index: int) -> bool:
        return index % self.world == self.rank

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """Every process's `obj`, by rank, on every process."""
        if self.world == 1:
            return [obj]
        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every process."""
        if self.world == 1:
            return obj
        box = [obj if self.main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def agree(self, error: BaseException | None) -> None:
        """Raise on every process when any one of them failed (`error`), so that none waits forever for
        the others at the next collective; the message names the rank that failed."""
        failures = self.gather(None if error is None else f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        for rank, failure in enumerate(failures):
            if failure is not None:
                raise RuntimeError(f"process {rank} of {self.world} failed: {failure}")

    def device(self) -> torch.device:
        """cuda:LOCAL_RANK where there are GPUs, else the CPU."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    def max_memory(self) -> dict[int | str, int] | None:
        """For device_map="auto": only this process's GPUs (the machine's split evenly between its
        processes) may hold weights; None (all of them) for one process or none."""
        if not torch.cuda.is_available() or self.local_world == 1:
            return None
        count = torch.cuda.device_count()
        if count < self.local_world:
            raise ValueError(
                f"--device-map auto with {self.local_world} processes on a machine of {count} GPUs: each "
                "process needs at least one; launch at most one process per GPU"
            )
        per = count // self.local_world
        mine = range(self.local_rank * per, (self.local_rank + 1) * per)
        return {
            i: (torch.cuda.get_device_properties(i).total_memory if i in mine else 0) for i in range(count)
        }


def launched() -> Processes:
    """The processes this one belongs to, from the launcher's environment; joins (once) their gloo
    process group when there are several."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Processes()
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return Processes(
        rank=dist.get_rank(),
        world=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
    )
