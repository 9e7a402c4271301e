from __future__ import annotations

import numpy as np
import pytest

from workloads.data.sampler import BlockShuffleBatchSampler


def _flat(sampler: BlockShuffleBatchSampler) -> list[int]:
    return [index for batch in sampler for index in batch]


@pytest.mark.parametrize(("num_samples", "block_size"), [(100, 8), (97, 10), (5, 32)])
def test_one_rank_sees_every_sample_once_per_epoch(num_samples: int, block_size: int) -> None:
    sampler = BlockShuffleBatchSampler(num_samples, 16, block_size=block_size, seed=1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sorted(_flat(sampler)) == list(range(num_samples))
        assert len(list(sampler)) == len(sampler) == -(-num_samples // 16)


def test_order_is_made_of_consecutive_blocks() -> None:
    sampler = BlockShuffleBatchSampler(96, 12, block_size=8, seed=4)
    order = _flat(sampler)
    for start in range(0, 96, 8):
        block = order[start : start + 8]
        assert block[0] % 8 == 0 and block == list(range(block[0], block[0] + 8))
    assert order != sorted(order)


def test_order_is_deterministic_per_seed_and_epoch() -> None:
    first = BlockShuffleBatchSampler(200, 10, block_size=4, seed=9)
    second = BlockShuffleBatchSampler(200, 10, block_size=4, seed=9)
    other_seed = BlockShuffleBatchSampler(200, 10, block_size=4, seed=10)
    assert _flat(first) == _flat(second)
    assert _flat(first) != _flat(other_seed)
    epoch0 = _flat(first)
    first.set_epoch(1)
    assert _flat(first) != epoch0


def test_resume_skips_exactly_the_consumed_batches() -> None:
    sampler = BlockShuffleBatchSampler(100, 7, block_size=5, seed=2)
    sampler.set_epoch(3)
    full = list(sampler)
    sampler.set_epoch(3, start_batch=4)
    assert list(sampler) == full[4:]
    assert len(sampler) == len(full) - 4
    with pytest.raises(ValueError, match="start_batch"):
        sampler.set_epoch(3, start_batch=len(full) + 1)


@pytest.mark.parametrize("num_samples", [120, 121, 123])
def test_ranks_get_disjoint_equal_shares(num_samples: int) -> None:
    world = 4
    shares = []
    for rank in range(world):
        sampler = BlockShuffleBatchSampler(num_samples, 8, block_size=6, seed=5, rank=rank, world_size=world)
        sampler.set_epoch(2)
        shares.append(_flat(sampler))
    assert len({len(share) for share in shares}) == 1
    combined = np.concatenate(shares)
    assert set(combined.tolist()) == set(range(num_samples))
    padding = len(combined) - num_samples
    assert padding == (-num_samples) % world
    _, counts = np.unique(combined, return_counts=True)
    assert counts.sum() - len(counts) == padding  # only the padding repeats samples


def test_drop_last_shares_are_strictly_disjoint() -> None:
    shares = [
        _flat(BlockShuffleBatchSampler(123, 8, seed=5, rank=rank, world_size=4, drop_last=True)) for rank in range(4)
    ]
    combined = [index for share in shares for index in share]
    assert len(combined) == len(set(combined)) == 120


def test_invalid_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="rank"):
        BlockShuffleBatchSampler(10, 2, rank=2, world_size=2)
    with pytest.raises(ValueError, match="num_samples"):
        BlockShuffleBatchSampler(0, 2)


def test_windowed_order_stays_inside_each_window_and_covers_it() -> None:
    shard_sizes = [10, 7, 12, 5, 9]  # windows of 2 shards: [0, 17), [17, 34), [34, 43)
    sampler = BlockShuffleBatchSampler(43, 4, block_size=3, seed=1, shard_sizes=shard_sizes, window_shards=2)
    assert sampler.windows == [(0, 17), (17, 34), (34, 43)]
    batches = list(sampler)
    ends = sampler.window_end_batches
    assert ends == [5, 10, 13] and len(batches) == ends[-1] == sampler.batches_per_epoch
    bounds = [(0, 0, 17), (5, 17, 34), (10, 34, 43)]
    for (first_batch, start, end), last_batch in zip(bounds, ends, strict=True):
        window = [index for batch in batches[first_batch:last_batch] for index in batch]
        assert sorted(window) == list(range(start, end))  # no batch spans two windows


def test_windowed_ranks_share_every_window_disjointly() -> None:
    shard_sizes = [10, 7, 12, 5, 9]
    ranks = [
        BlockShuffleBatchSampler(
            43, 4, block_size=3, seed=1, rank=rank, world_size=2, shard_sizes=shard_sizes, window_shards=2
        )
        for rank in range(2)
    ]
    assert ranks[0].window_end_batches == ranks[1].window_end_batches  # lockstep: same batches per window
    shares = [set(sampler.rank_indices().tolist()) for sampler in ranks]
    assert shares[0] | shares[1] == set(range(43))
    # windows of 17, 17 and 9 samples: one padded sample each for the odd ones, nothing else repeats
    assert len(shares[0] & shares[1]) <= 3


def test_windowed_order_needs_consistent_shard_sizes() -> None:
    with pytest.raises(ValueError, match="shard_sizes"):
        BlockShuffleBatchSampler(40, 4, shard_sizes=[10, 10], window_shards=1)
