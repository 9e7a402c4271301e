"""--global-batch-size: each rank takes its share of a fixed global batch, so an elastic gang that runs on fewer or
more nodes keeps the epoch order (the sampler's order depends on the global batch only) and the number of steps."""

from __future__ import annotations

import pytest

from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.train.__main__ import parse_args
from workloads.train.loop import ConfigError, rank_batch_size


def test_the_option_is_parsed_and_each_rank_takes_its_share() -> None:
    config = parse_args(["--data", "/data", "--global-batch-size", "96"])
    assert config.global_batch_size == 96
    assert parse_args(["--data", "/data"]).global_batch_size is None
    assert [rank_batch_size(96, world) for world in (1, 2, 3, 4, 8)] == [96, 48, 32, 24, 12]
    with pytest.raises(ConfigError, match="--global-batch-size: 96 is not divisible by the world size 5"):
        rank_batch_size(96, 5)


def _epoch(world: int, global_batch: int) -> tuple[list[int], int]:
    """The epoch's samples in training order (every step's global batch, rank by rank) and its step count."""
    samplers = [ElasticBatchSampler([40, 40, 16], rank_batch_size(global_batch, world), seed=3, canonical_nodes=2,
                                    rank=rank, world_size=world) for rank in range(world)]
    steps = list(zip(*(list(sampler) for sampler in samplers), strict=True))
    return [sample for step in steps for piece in step for sample in piece], len(steps)


def test_one_two_or_four_ranks_train_the_same_order_in_the_same_steps() -> None:
    order, steps = _epoch(2, 16)
    assert sorted(order) == list(range(96))
    for world in (1, 4):
        assert _epoch(world, 16) == (order, steps)
