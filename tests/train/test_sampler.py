"""The epoch order: every sample once, the same for any nodes/ranks/workers, cache-friendly, sample-exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from workloads.data.reading.sampler import ElasticBatchSampler

UNEVEN_SHARDS = [50, 50, 50, 50, 50, 50, 50, 37]  # 387 samples, a short last shard, as pack writes them


def _ranks(shards: list[int], global_batch: int, nodes: int, per_node: int, **order: int) -> list[ElasticBatchSampler]:
    world = nodes * per_node
    assert global_batch % world == 0
    return [ElasticBatchSampler(shards, global_batch // world, rank=rank, world_size=world,
                                local_world_size=per_node, **order) for rank in range(world)]


def _consumed_order(samplers: list[ElasticBatchSampler]) -> list[int]:
    """What the ranks read together, step by step, in rank order: the order training sees."""
    per_rank = [list(sampler) for sampler in samplers]
    assert len({len(batches) for batches in per_rank}) == 1  # every rank steps the same number of times
    return [index for step in zip(*per_rank, strict=True) for batch in step for index in batch]


@pytest.mark.parametrize(("shards", "batch", "world"), [([100], 16, 1), (UNEVEN_SHARDS, 8, 4), ([7, 7, 3], 5, 2),
                                                        (UNEVEN_SHARDS, 100, 3), ([0, 30, 0, 30], 4, 2)])
def test_every_sample_exactly_once_per_epoch(shards: list[int], batch: int, world: int) -> None:
    samplers = [ElasticBatchSampler(shards, batch, seed=3, rank=r, world_size=world, canonical_nodes=2)
                for r in range(world)]
    for epoch in range(3):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        consumed = _consumed_order(samplers)
        assert sorted(consumed) == list(range(sum(shards)))
        assert all(len(batch_) > 0 for sampler in samplers for batch_ in sampler)


@pytest.mark.parametrize("per_node", [1, 2])
def test_the_order_is_the_same_for_1_2_and_4_nodes(per_node: int) -> None:
    orders = []
    for nodes in (1, 2, 4):
        samplers = _ranks(UNEVEN_SHARDS, 32, nodes, per_node, seed=7, canonical_nodes=4)
        for sampler in samplers:
            sampler.set_epoch(5)
        consumed = _consumed_order(samplers)
        assert consumed == samplers[0].epoch_order().tolist()
        orders.append(consumed)
    assert orders[0] == orders[1] == orders[2]
    assert sorted(orders[0]) == list(range(sum(UNEVEN_SHARDS)))


class _Indices(Dataset[int]):
    def __len__(self) -> int:
        return sum(UNEVEN_SHARDS)

    def __getitem__(self, index: int) -> int:
        return index


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_do_not_change_the_order(workers: int) -> None:
    sampler = ElasticBatchSampler(UNEVEN_SHARDS, 16, seed=2, canonical_nodes=2)
    sampler.set_epoch(1)
    loader = DataLoader(_Indices(), batch_sampler=sampler, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    assert torch.cat(list(loader)).tolist() == sampler.epoch_order().tolist()


def test_each_node_reads_only_its_own_streams_shards() -> None:
    shards = [40] * 16
    samplers = _ranks(shards, 16, nodes=4, per_node=2, seed=1, canonical_nodes=4)
    node_sets = [set(samplers[node * 2].node_shards()[0]) for node in range(4)]
    assert set().union(*node_sets) == set(range(16))
    assert sum(len(s) for s in node_sets) == 16  # 160 samples per stream = 4 whole shards: no shard is shared
    for node in range(4):  # both ranks of a node see the same node plan
        assert samplers[node * 2].node_shards() == samplers[node * 2 + 1].node_shards()
    uneven = _ranks(UNEVEN_SHARDS, 20, nodes=2, per_node=2, seed=1, canonical_nodes=2)
    first, second = (set(uneven[node * 2].node_shards()[0]) for node in range(2))
    assert len(first & second) <= 1  # only the shard on the cut between the two streams


def test_node_shards_first_use_order_and_last_use_match_the_batches() -> None:
    samplers = _ranks(UNEVEN_SHARDS, 24, nodes=2, per_node=2, seed=4, canonical_nodes=2, shuffle_shards=2)
    for sampler in samplers:
        sampler.set_epoch(2)
    node0 = [list(samplers[0]), list(samplers[1])]
    first_use: dict[int, int] = {}
    last_use: dict[int, int] = {}
    for number, step in enumerate(zip(*node0, strict=True)):
        for batch in step:
            for shard in samplers[0].shard_of(np.asarray(batch)).tolist():
                first_use.setdefault(shard, number)
                last_use[shard] = number
    order, first, last = samplers[0].node_shards()
    assert dict(zip(order, last, strict=True)) == last_use
    assert dict(zip(order, first, strict=True)) == first_use
    assert first == sorted(first)
    later, _, _ = samplers[0].node_shards(from_batch=3)
    assert set(later) == {s for s, end in last_use.items() if end >= 3}


def test_a_stream_reads_only_a_few_shards_at_a_time() -> None:
    shards = [64] * 32
    sampler = ElasticBatchSampler(shards, 16, seed=9, shuffle_shards=4)
    for batch in sampler:
        touched = set(sampler.shard_of(np.asarray(batch)).tolist())
        assert len(touched) <= 8  # one span of 4 shards, or two at the seam between spans


def test_shuffle_is_global_across_epochs_and_groups_change() -> None:
    shards = [64] * 16
    sampler = ElasticBatchSampler(shards, 32, seed=5, shuffle_shards=4, block_size=8)
    orders = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        orders.append(sampler.epoch_order())
    assert orders[0].tolist() != orders[1].tolist()
    first_shards = [sampler.shard_of(order[:64]) for order in orders]
    assert set(first_shards[0].tolist()) != set(first_shards[1].tolist())  # the shard order changes per epoch

    def pairs(order: np.ndarray) -> set[tuple[int, int]]:
        return {(int(a), int(b)) for a, b in zip(order[:-1], order[1:], strict=True)}

    def block_starts(order: np.ndarray) -> set[int]:
        return {int(order[i]) for i in range(len(order)) if i == 0 or order[i] != order[i - 1] + 1}

    starts = [block_starts(order) for order in orders]
    assert len(starts[0] & starts[1]) / len(starts[1]) < 0.4  # block boundaries move: other groups of 8 each epoch
    one_by_one = ElasticBatchSampler(shards, 32, seed=5, shuffle_shards=4)
    epoch0 = one_by_one.epoch_order()
    one_by_one.set_epoch(1)
    assert len(pairs(epoch0) & pairs(one_by_one.epoch_order())) / len(epoch0) < 0.05


def test_order_is_deterministic_per_seed_and_epoch() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        sampler = ElasticBatchSampler(UNEVEN_SHARDS, 10, seed=seed)
        sampler.set_epoch(epoch)
        return sampler.epoch_order().tolist()

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(2, 0)
    assert order(1, 0) != order(1, 1)
    unshuffled = ElasticBatchSampler(UNEVEN_SHARDS, 10, shuffle=False)
    assert unshuffled.epoch_order().tolist() == list(range(sum(UNEVEN_SHARDS)))


@pytest.mark.parametrize(("before", "after"), [((1, 2), (2, 2)), ((2, 2), (1, 1)), ((4, 1), (1, 3))])
def test_resume_continues_with_exactly_the_samples_not_yet_seen(before: tuple[int, int],
                                                                after: tuple[int, int]) -> None:
    shards = UNEVEN_SHARDS
    first = _ranks(shards, 24, *before, seed=8, canonical_nodes=4) if 24 % (before[0] * before[1]) == 0 else []
    for sampler in first:
        sampler.set_epoch(3)
    per_rank = [list(sampler) for sampler in first]
    done = 5
    seen = [i for step in list(zip(*per_rank, strict=True))[:done] for batch in step for i in batch]
    state = first[0].state_dict(done)
    assert all(sampler.state_dict(done) == state for sampler in first)  # every rank writes the same position
    nodes, per_node = after
    world = nodes * per_node
    resumed = [ElasticBatchSampler(shards, 6, seed=8, canonical_nodes=4, rank=r, world_size=world,
                                   local_world_size=per_node) for r in range(world)]
    for sampler in resumed:
        sampler.load_state_dict(state)
    rest = _consumed_order(resumed)
    assert sorted(seen + rest) == list(range(sum(shards)))
    assert not set(seen) & set(rest)
    assert resumed[0].epoch == 3


def test_resume_with_the_same_shape_continues_the_same_order() -> None:
    sampler = ElasticBatchSampler(UNEVEN_SHARDS, 16, seed=1)
    sampler.set_epoch(2)
    full = list(sampler)
    state = sampler.state_dict(4)
    again = ElasticBatchSampler(UNEVEN_SHARDS, 16, seed=1)
    again.load_state_dict(state)
    assert list(again) == full[4:]
    assert len(again) == len(full) - 4
    finished = sampler.state_dict(len(full))
    again.load_state_dict(finished)
    assert list(again) == []


@pytest.mark.parametrize(("field", "change"), [("seed", {"seed": 2}), ("shuffle_shards", {"shuffle_shards": 2}),
                                               ("block_size", {"block_size": 4}),
                                               ("canonical_nodes", {"canonical_nodes": 2})])
def test_a_position_from_another_order_is_refused(field: str, change: dict[str, int]) -> None:
    state = ElasticBatchSampler(UNEVEN_SHARDS, 8, seed=1).state_dict(3)
    with pytest.raises(ValueError, match=field):
        ElasticBatchSampler(UNEVEN_SHARDS, 8, **{"seed": 1, **change}).load_state_dict(state)
    with pytest.raises(ValueError, match="samples"):
        ElasticBatchSampler([10, 10], 8, seed=1).load_state_dict(state)
    broken = {**state, "offsets": [10**9]}
    with pytest.raises(ValueError, match="offsets"):
        ElasticBatchSampler(UNEVEN_SHARDS, 8, seed=1).load_state_dict(broken)
    for garbage in ({**state, "order": [1]}, {**state, "epoch": "x"}, {**state, "version": 99}, [state]):
        with pytest.raises(ValueError, match="loader state"):  # a damaged checkpoint: one line, no traceback
            ElasticBatchSampler(UNEVEN_SHARDS, 8, seed=1).load_state_dict(garbage)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kwargs", "field"), [({"batch_size": 0}, "batch_size"),
                                               ({"rank": 2, "world_size": 2}, "rank"),
                                               ({"world_size": 4, "local_world_size": 3}, "local_world_size"),
                                               ({"canonical_nodes": 64}, "canonical_nodes"),
                                               ({"shuffle_shards": 0}, "shuffle_shards")])
def test_bad_arguments_name_the_field(kwargs: dict[str, int], field: str) -> None:
    args = {"batch_size": 8, **kwargs}
    with pytest.raises(ValueError, match=field):
        ElasticBatchSampler(UNEVEN_SHARDS, **args)
    with pytest.raises(ValueError, match="shard_sizes"):
        ElasticBatchSampler([], 8)


def test_the_first_batch_needs_one_shard_per_stream() -> None:
    shards = [64] * 32
    for streams in (1, 2):
        sampler = ElasticBatchSampler(shards, 32, seed=3, shuffle_shards=4, canonical_nodes=streams)
        first = next(iter(sampler))
        assert len(set(sampler.shard_of(np.asarray(first)).tolist())) == streams
