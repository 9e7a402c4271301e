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
