"""Block-shuffle batch sampler: random order at the granularity of blocks of consecutive samples.

Reading consecutive samples is what makes packed shards fast (one read per run), while shuffling blocks keeps
batches mixed. Each epoch's order is a pure function of (seed, epoch), so every rank computes the same order and
takes its own disjoint share, and a run can resume mid-epoch by skipping the batches it has already consumed.

Rolling-window datasets (staged a few shards at a time, see workloads/data/window.py) are read window by
window: `shard_sizes` + `window_shards` split the dataset into windows of consecutive shards, blocks are
shuffled within each window, every rank takes its share of each window in turn, and `window_end_batches` says
after which batch a window is finished, so its shards can be released.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


class BlockShuffleBatchSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of sample indices) for the current epoch.

    Within each window (the whole dataset unless windowed), the order is the window's blocks of `block_size`
    consecutive samples in a seeded random order. Ranks get contiguous, disjoint slices of equal length of each
    window; like DistributedSampler, a window's order is padded with its own head when it does not divide
    evenly (drop_last=False), or truncated (drop_last=True). Batches never span two windows.
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
        shard_sizes: Sequence[int] | None = None,
        window_shards: int | None = None,
    ) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples: must be positive, got {num_samples}")
        if batch_size <= 0 or block_size <= 0:
            raise ValueError(f"batch_size/block_size: must be positive, got {batch_size}/{block_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: {rank} not in [0, {world_size})")
        self.windows = _windows(num_samples, shard_sizes, window_shards)
        if drop_last and min(end - start for start, end in self.windows) < world_size:
            raise ValueError(f"num_samples: a window has fewer samples than the {world_size} ranks")
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

    def _share_size(self, window_samples: int) -> int:
        if self.drop_last:
            return window_samples // self.world_size
        return math.ceil(window_samples / self.world_size)

    @property
    def samples_per_rank(self) -> int:
        return sum(self._share_size(end - start) for start, end in self.windows)

    @property
    def window_end_batches(self) -> list[int]:
        """For each window, the number of this epoch's batches after which it is finished (on every rank)."""
        ends, total = [], 0
        for start, end in self.windows:
            total += math.ceil(self._share_size(end - start) / self.batch_size)
            ends.append(total)
        return ends

    @property
    def batches_per_epoch(self) -> int:
        return self.window_end_batches[-1]

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch to iterate, skipping the first `start_batch` batches (resume mid-epoch)."""
        if not 0 <= start_batch <= self.batches_per_epoch:
            raise ValueError(f"start_batch: {start_batch} not in [0, {self.batches_per_epoch}]")
        self.epoch = epoch
        self.start_batch = start_batch

    def _window_order(self, number: int) -> np.ndarray:
        start, end = self.windows[number]
        if not self.shuffle:
            return np.arange(start, end, dtype=np.int64)
        rng = np.random.default_rng([self.seed, self.epoch, number])
        starts = start + rng.permutation(math.ceil((end - start) / self.block_size)) * self.block_size
        return np.concatenate([np.arange(s, min(s + self.block_size, end), dtype=np.int64) for s in starts])

    def _window_share(self, number: int) -> np.ndarray:
        order = self._window_order(number)
        share = self._share_size(len(order))
        if share * self.world_size > len(order):
            order = np.concatenate([order, np.resize(order, share * self.world_size - len(order))])
        return order[self.rank * share : (self.rank + 1) * share]

    def epoch_order(self) -> np.ndarray:
        """All sample indices in this epoch's order, before the split between ranks."""
        return np.concatenate([self._window_order(number) for number in range(len(self.windows))])

    def rank_indices(self) -> np.ndarray:
        return np.concatenate([self._window_share(number) for number in range(len(self.windows))])

    def batches(self) -> list[list[int]]:
        """Every batch of this rank's epoch, windows in order."""
        out: list[list[int]] = []
        for number in range(len(self.windows)):
            share = self._window_share(number)
            out.extend(share[i : i + self.batch_size].tolist() for i in range(0, len(share), self.batch_size))
        return out

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()[self.start_batch :]

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch


def _windows(num_samples: int, shard_sizes: Sequence[int] | None, window_shards: int | None) -> list[tuple[int, int]]:
    """[(first sample, end)] of each window: consecutive groups of `window_shards` shards, or one window."""
    if window_shards is None:
        return [(0, num_samples)]
    if window_shards <= 0:
        raise ValueError(f"window_shards: must be positive, got {window_shards}")
    if shard_sizes is None or sum(shard_sizes) != num_samples:
        raise ValueError("shard_sizes: must be given and add up to num_samples for a windowed order")
    bounds = np.concatenate([[0], np.cumsum(shard_sizes)]).astype(int).tolist()
    windows = []
    for first in range(0, len(shard_sizes), window_shards):
        start, end = bounds[first], bounds[min(first + window_shards, len(shard_sizes))]
        if end > start:
            windows.append((start, end))
    return windows
