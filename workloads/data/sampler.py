"""Block-shuffle batch sampler: random order at the granularity of blocks of consecutive samples.

Reading consecutive samples is what makes packed shards fast (one read per run), while shuffling blocks (and
the samples' blocks across batches) keeps batches mixed. Each epoch's order is a pure function of (seed,
epoch), so every rank computes the same permutation and takes its own disjoint slice, and a run can resume
mid-epoch by skipping the batches it has already consumed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


class BlockShuffleBatchSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of sample indices) for the current epoch.

    The epoch's order is the concatenation of the blocks [k*B, (k+1)*B) in a seeded random order. Ranks get
    contiguous, disjoint slices of equal length; like DistributedSampler, the order is padded with its own
    head when the sample count does not divide evenly (drop_last=False), or truncated (drop_last=True).
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        block_size: int = 32,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        drop_last: bool = False,
    ) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples: must be positive, got {num_samples}")
        if batch_size <= 0 or block_size <= 0:
            raise ValueError(f"batch_size/block_size: must be positive, got {batch_size}/{block_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: {rank} not in [0, {world_size})")
        if drop_last and num_samples < world_size:
            raise ValueError(f"num_samples: {num_samples} samples cannot feed {world_size} ranks")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.block_size = block_size
        self.seed = seed
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.drop_last = drop_last
        self.epoch = 0
        self.start_batch = 0

    @property
    def samples_per_rank(self) -> int:
        if self.drop_last:
            return self.num_samples // self.world_size
        return math.ceil(self.num_samples / self.world_size)

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(self.samples_per_rank / self.batch_size)

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch to iterate, skipping the first `start_batch` batches (resume mid-epoch)."""
        if not 0 <= start_batch <= self.batches_per_epoch:
            raise ValueError(f"start_batch: {start_batch} not in [0, {self.batches_per_epoch}]")
        self.epoch = epoch
        self.start_batch = start_batch

    def epoch_order(self) -> np.ndarray:
        """All sample indices in this epoch's order (identical on every rank)."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        num_blocks = math.ceil(self.num_samples / self.block_size)
        rng = np.random.default_rng([self.seed, self.epoch])
        blocks = rng.permutation(num_blocks)
        starts = blocks * self.block_size
        ends = np.minimum(starts + self.block_size, self.num_samples)
        return np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in zip(starts, ends, strict=True)])

    def rank_indices(self) -> np.ndarray:
        order = self.epoch_order()
        total = self.samples_per_rank * self.world_size
        if total > len(order):
            order = np.concatenate([order, np.resize(order, total - len(order))])
        share = self.samples_per_rank
        return order[self.rank * share : (self.rank + 1) * share]

    def __iter__(self) -> Iterator[list[int]]:
        indices = self.rank_indices()
        for start in range(self.start_batch * self.batch_size, len(indices), self.batch_size):
            yield indices[start : start + self.batch_size].tolist()

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch
