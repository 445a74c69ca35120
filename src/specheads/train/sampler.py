"""Training batches that shard over processes and resume at any batch.

Every process walks the same sequence of *global* batches and takes its own slice of each:

    epoch e        the n training rows shuffled by a generator seeded with `seed`; the generator runs on
                   from one epoch to the next, so epoch e's order is its (e+1)-th shuffle
    global batch   rows order[j·G : (j+1)·G] of the epoch, G = batch_size × num_processes; the tail of
                   fewer than G rows is left out of that epoch (processes step together)
    process r      takes rows r·batch_size .. (r+1)·batch_size of each global batch

So one process with batch 4 sees exactly the global batches that two processes with batch 2 see between
them, and the position in the data is one number, the global batches drawn so far: a run resumed at
position p draws what an uninterrupted run draws from p on. (One process with fewer rows than a batch
takes them all, as a DataLoader without drop_last would.)

Each epoch's shuffle draws from the generator what torch's DataLoader with a shuffling sampler draws:
one int64 as the epoch starts (its workers' base seed), the order, and a second order it throws away
as the epoch ends (RandomSampler's tail of `num_samples % n` rows). So the orders are those of
`DataLoader(rows, batch_size, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(seed))`,
the loader earlier single-process runs used, and their pinned losses stand.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class EpochBatches(Sampler[list[int]]):
    """An endless batch sampler over `num_rows` rows: this process's share of each global batch.

    Args:
        num_rows: rows in the training set.
        batch_size: rows per process per batch.
        num_processes, rank: the data-parallel world and this process's place in it.
        seed: seeds the shuffling generator (the same on every process).
        start: global batches already drawn (a resumed run's position).
    """

    def __init__(
        self,
        num_rows: int,
        batch_size: int,
        *,
        num_processes: int = 1,
        rank: int = 0,
        seed: int = 0,
        start: int = 0,
    ):
        if batch_size < 1 or num_processes < 1 or not 0 <= rank < num_processes or start < 0:
            raise ValueError(
                f"bad sampler arguments: batch_size={batch_size}, num_processes={num_processes}, rank={rank}, "
                f"start={start}"
            )
        self.num_rows, self.batch_size, self.rank, self.seed, self.start = (
            num_rows,
            batch_size,
            rank,
            seed,
            start,
        )
        self.global_batch_size = batch_size * num_processes
        if num_rows < self.global_batch_size and num_processes == 1 and num_rows > 0:
            self.global_batch_size = num_rows
        self.batches_per_epoch = num_rows // self.global_batch_size
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"the training data has {num_rows} rows, fewer than one global batch "
                f"({batch_size} per process x {num_processes} processes)"
            )

    def epoch_orders(self) -> Iterator[torch.Tensor]:
        """(num_rows,) row order of epoch 0, 1, 2, ..."""
        generator = torch.Generator().manual_seed(self.seed)
        while True:
            torch.empty((), dtype=torch.int64).random_(generator=generator)  # DataLoader: base seed
            order = torch.randperm(self.num_rows, generator=generator)
            torch.randperm(self.num_rows, generator=generator)  # RandomSampler: the empty tail
            yield order

    def __iter__(self) -> Iterator[list[int]]:
        orders = self.epoch_orders()
        epoch, batch = divmod(self.start, self.batches_per_epoch)
        for _ in range(epoch):
            next(orders)
        G, B = self.global_batch_size, self.batch_size
        while True:
            order = next(orders)
            for j in range(batch, self.batches_per_epoch):
                yield order[j * G : (j + 1) * G][self.rank * B : (self.rank + 1) * B].tolist()
            batch = 0
