"""The mixture's order: exact per-batch shares, no repeat within a source's pass, resume on any world size."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workloads.data.reading.mixture import MixtureBatchSampler, MixtureShare, batch_counts, epoch_counts

PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mixtures(draw: st.DrawFn) -> tuple[list[list[int]], list[MixtureShare], int]:
    k = draw(st.integers(1, 4))
    shard_sizes = [draw(st.lists(st.integers(1, 12), min_size=1, max_size=5)) for _ in range(k)]
    shares = []
    for _ in range(k):
        kind = draw(st.sampled_from(["weight", "weight", "samples", "repeat"]))
        if kind == "weight":
            shares.append(MixtureShare(weight=draw(st.sampled_from([0.1, 0.3, 0.7, 1, 2.5]))))
        elif kind == "samples":
            shares.append(MixtureShare(samples=draw(st.integers(1, 40))))
        else:
            shares.append(MixtureShare(repeat=draw(st.sampled_from([0.5, 1, 1.5, 3]))))
    seed = draw(st.integers(0, 2**16))
    return shard_sizes, shares, seed


def _sampler(shard_sizes: list[list[int]], shares: list[MixtureShare], per_rank: int, world: int, rank: int = 0,
             seed: int = 0, **kw: object) -> MixtureBatchSampler:
    return MixtureBatchSampler(shard_sizes, shares, per_rank, seed=seed, rank=rank, world_size=world, **kw)


def _global_steps(shard_sizes: list[list[int]], shares: list[MixtureShare], per_rank: int, world: int, seed: int,
                  epoch: int, state: dict | None = None) -> list[list[int]]:
    """Every rank's batches of one iteration joined per step (what the job trains on, step by step)."""
    ranks = []
    for rank in range(world):
        sampler = _sampler(shard_sizes, shares, per_rank, world, rank, seed)
        sampler.set_epoch(epoch)
        if state is not None:
            sampler.load_state_dict(state)
        ranks.append(list(sampler))
    assert len({len(batches) for batches in ranks}) == 1
    return [[i for rank in ranks for i in rank[step]] for step in range(len(ranks[0]))]


def _flat(steps: list[list[int]]) -> list[int]:
    return [i for step in steps for i in step]


def _has_samples(shard_sizes: list[list[int]], shares: list[MixtureShare], world: int) -> bool:
    try:
        return sum(epoch_counts([sum(s) for s in shard_sizes], shares)) >= world
    except ValueError:
        return False


@PROPERTY
@given(mixtures(), st.integers(1, 4), st.integers(1, 9), st.integers(0, 3))
def test_each_batch_holds_every_share_within_one_sample(mix, world, per_rank, epoch) -> None:
    shard_sizes, shares, seed = mix
    if not _has_samples(shard_sizes, shares, world):
        return
    sampler = _sampler(shard_sizes, shares, per_rank, world, seed=seed)
    sampler.set_epoch(epoch)
    counts, total = sampler.counts, sum(sampler.counts)
    seen = np.zeros(len(counts), dtype=np.int64)
    steps = _global_steps(shard_sizes, shares, per_rank, world, seed, epoch)
    assert all(len(sources) == per_rank * world for sources in sampler.planned_sources()[:-1])
    planned = sampler.planned_sources()
    assert [i for step in steps for i in step] == sampler.epoch_order().tolist()  # the ranks read the plan
    assert sampler.source_of(sampler.epoch_order()).tolist() == np.concatenate(planned).tolist()
    for sources in planned:
        got = np.bincount(sources, minlength=len(counts))
        for k, count in enumerate(got):
            assert abs(Fraction(int(count)) - Fraction(len(sources) * counts[k], total)) < 1
        seen += got
    assert seen.tolist() == counts  # exactly each source's samples per epoch


@PROPERTY
@given(mixtures(), st.integers(1, 4), st.integers(1, 9))
def test_no_sample_twice_within_its_source_pass(mix, world, per_rank) -> None:
    shard_sizes, shares, seed = mix
    if not _has_samples(shard_sizes, shares, world):
        return
    sampler = _sampler(shard_sizes, shares, per_rank, world, seed=seed)
    streams: list[list[int]] = [[] for _ in shard_sizes]
    for epoch in range(3):
        order = np.concatenate(_global_steps(shard_sizes, shares, per_rank, world, seed, epoch) or [[]]).astype(int)
        for sample, source in zip(order, sampler.source_of(order), strict=True):
            streams[source].append(int(sample - sampler.starts[source]))
    for k, stream in enumerate(streams):
        size = sampler.sizes[k]
        for begin in range(0, len(stream), size):
            chunk = stream[begin : begin + size]
            assert len(set(chunk)) == len(chunk), f"source {k}: a sample twice within one pass"
            if len(chunk) == size:
                assert sorted(chunk) == list(range(size))


@PROPERTY
@given(mixtures(), st.integers(1, 4), st.integers(1, 4), st.integers(1, 2), st.integers(0, 2), st.data())
def test_resume_on_another_world_size_continues_the_same_global_order(mix, world, new_world, unit, epoch,
                                                                       data) -> None:
    shard_sizes, shares, seed = mix
    global_batch = 12 * unit  # divisible by every world size 1-4: the same global batch on each
    if not _has_samples(shard_sizes, shares, max(world, new_world)):
        return
    full = _global_steps(shard_sizes, shares, global_batch // world, world, seed, epoch)
    at = data.draw(st.integers(0, len(full)))
    saver = _sampler(shard_sizes, shares, global_batch // world, world, seed=seed)
    saver.set_epoch(epoch)
    state = saver.state_dict(at)
    resumed = _global_steps(shard_sizes, shares, global_batch // new_world, new_world, seed, epoch, state)
    # The same global batches (only a small last one may be merged on one world size and not on the other).
    assert _flat(resumed) == _flat(full[at:]) and resumed[:-2] == full[at:][: max(0, len(resumed) - 2)]
    # Resumed again, midway, on the first world size: still the same order.
    if resumed:
        again = data.draw(st.integers(0, len(resumed)))
        middle = _sampler(shard_sizes, shares, global_batch // new_world, new_world, seed=seed)
        middle.load_state_dict(state)
        assert _flat(_global_steps(shard_sizes, shares, global_batch // world, world, seed, epoch,
                                   middle.state_dict(again))) == _flat(resumed[again:])


@PROPERTY
@given(mixtures(), st.integers(1, 4), st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.data())
def test_resume_with_another_global_batch_reads_exactly_the_rest_in_each_source_order(mix, world, new_world, per_rank,
                                                                                       new_per_rank, data) -> None:
    shard_sizes, shares, seed = mix
    if not _has_samples(shard_sizes, shares, max(world, new_world)):
        return
    full = _global_steps(shard_sizes, shares, per_rank, world, seed, 1)
    at = data.draw(st.integers(0, len(full)))
    saver = _sampler(shard_sizes, shares, per_rank, world, seed=seed)
    saver.set_epoch(1)
    state = saver.state_dict(at)
    resumed = _global_steps(shard_sizes, shares, new_per_rank, new_world, seed, 1, state)
    before = np.asarray([i for step in full[:at] for i in step], dtype=np.int64)
    after = np.asarray([i for step in resumed for i in step], dtype=np.int64)
    whole = np.asarray([i for step in full for i in step], dtype=np.int64)
    for k in range(len(shard_sizes)):
        of = saver.source_of
        # Each source continues its own order exactly where it stopped.
        assert np.array_equal(np.concatenate([before[of(before) == k], after[of(after) == k]]), whole[of(whole) == k])
    remaining = [int(c) - int(s) for c, s in zip(saver.counts, state["consumed"], strict=True)]
    resumer = _sampler(shard_sizes, shares, new_per_rank, new_world, seed=seed)
    resumer.load_state_dict(state)
    for sources in resumer.planned_sources():
        got = np.bincount(sources, minlength=len(remaining))
        for k in range(len(remaining)):
            assert abs(Fraction(int(got[k])) - Fraction(len(sources) * remaining[k], sum(remaining))) < 1


def test_epoch_counts_weights_samples_repeat_and_cap() -> None:
    assert epoch_counts([100, 50], [MixtureShare(weight=0.7), MixtureShare(weight=0.3)]) == [105, 45]
    assert epoch_counts([100, 50], [MixtureShare(weight=7), MixtureShare(weight=3)], epoch_samples=10) == [7, 3]
    assert epoch_counts([100, 50], [MixtureShare(samples=30), MixtureShare(repeat=2, cap=80)]) == [30, 80]
    assert epoch_counts([10, 10, 10], [MixtureShare(), MixtureShare(), MixtureShare()], epoch_samples=10) == [4, 3, 3]
    with pytest.raises(ValueError, match=r"sources\[1\]: give one of weight, samples, repeat"):
        epoch_counts([1, 2], [MixtureShare(), MixtureShare(weight=1, samples=2)])
    with pytest.raises(ValueError, match=r"sources\[0\]\.weight: must be a positive"):
        epoch_counts([1], [MixtureShare(weight=-1)])
    with pytest.raises(ValueError, match=r"sources\[1\]: its share rounds to no samples"):
        epoch_counts([100, 100], [MixtureShare(weight=1000), MixtureShare(weight=1)], epoch_samples=10)


def test_batch_counts_spread_the_extras_and_add_up() -> None:
    rows = batch_counts([70, 30], 8)
    assert [sum(row) for row in rows] == [8] * 12 + [4]
    assert np.sum(rows, axis=0).tolist() == [70, 30]
    assert {row[1] for row in rows[:-1]} == {2, 3}
    extra = [number for number, row in enumerate(rows[:-1]) if row[1] == 3]
    assert max(extra) - min(extra) > len(extra)  # spread over the epoch, not bunched at its start


def test_a_small_last_batch_is_merged_without_changing_the_order() -> None:
    shares = [MixtureShare(weight=0.7), MixtureShare(weight=0.3)]
    one = MixtureBatchSampler([[50], [51]], shares, 8)
    four = [MixtureBatchSampler([[50], [51]], shares, 2, rank=r, world_size=4, min_rank_batch=2) for r in range(4)]
    steps = [[i for sampler in four for i in list(sampler)[n]] for n in range(len(four[0]))]
    assert len(steps) == len(one) - 1 and len(steps[-1]) == 8 + 5
    assert [i for step in steps for i in step] == one.epoch_order().tolist()


def test_state_from_another_mixture_is_refused() -> None:
    sampler = MixtureBatchSampler([[10], [5]], [MixtureShare(weight=1), MixtureShare(weight=1)], 4)
    other = MixtureBatchSampler([[10], [6]], [MixtureShare(weight=1), MixtureShare(weight=1)], 4)
    with pytest.raises(ValueError, match="^sources: the saved position was taken with sources"):
        other.load_state_dict(sampler.state_dict(1))
    reseeded = MixtureBatchSampler([[10], [5]], [MixtureShare(weight=1), MixtureShare(weight=1)], 4, seed=3)
    with pytest.raises(ValueError, match="^seed: the saved position"):
        reseeded.load_state_dict(sampler.state_dict(1))
