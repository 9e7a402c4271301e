"""The epoch order of a mixture of K packed datasets: weighted, exact per batch, resumable on any world size.

Each source k has N_k samples and takes n_k of them per epoch, fixed by its share (`MixtureShare`): a weight (the
weighted sources split the epoch's samples in proportion: by default as many as they hold together, or
`epoch_samples` less the fixed ones), a fixed number of `samples`, or `repeat` (n_k = repeat x N_k, rounded), each
optionally capped (`cap`). The split is largest-remainder apportionment in exact arithmetic, so n_k is a pure
function of the shares and the sizes.

Every source reads its own endless stream: pass 0 of its samples, then pass 1, ..., each pass the single-dataset
order of that source (reading/sampler.py with one stream: shards permuted, spans of `shuffle_shards` shards
shuffled; seeded by (seed, k) and the pass number). Epoch e of the mixture takes positions [e n_k, (e + 1) n_k) of
source k's stream: a source smaller than its share cycles through passes, a larger one goes through a pass over
several epochs; either way no sample appears twice within a pass of its source.

The epoch's global batches (B = batch_size x world_size samples) hold each source's share to within one sample:
source k gets floor(b n_k / n) or its ceiling in a batch of b samples (n = sum n_k), and exactly n_k over the epoch.
The last batch is smaller (and merged into the one before when a rank would get fewer than `min_rank_batch`
samples: the two planned batches are then read as one step, so the order is the same on every world size). Which
batches get a source's extra sample is spread over the epoch (a wrap-around assignment over a strided batch
order). Inside a batch the sources' samples are interleaved by their ideal positions, so each rank's contiguous
piece holds near-proportional shares too. A sample is named by its global index: source k's sample i is
`starts[k] + i` (the sources' samples laid end to end).

Resume: `state_dict(batches)` records how many samples of each source this epoch has consumed, and where the current
batch plan began. `load_state_dict` continues the same plan (the same global batches, whatever the split into
ranks) when the global batch size is the one the plan was made with; with another global batch size the rest of the
epoch is apportioned afresh over the samples not yet read (each source's order is unchanged: only the interleaving
differs). Either way the samples that follow are exactly those not yet seen, in each source's own order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from workloads.data.reading.sampler import (
    ElasticBatchSampler,
    SpanOrder,
    check_saved_order,
    checked_local_world_size,
)

STATE_VERSION = 1
STATE_KIND = "mixture"
_GOLDEN = (5 ** 0.5 - 1) / 2


@dataclass(frozen=True)
class MixtureShare:
    """One source's share of an epoch: exactly one of weight, samples or repeat (none: weight 1), and an optional
    cap on its samples per epoch."""

    weight: float | None = None
    samples: int | None = None
    repeat: float | None = None
    cap: int | None = None

    def check(self, where: str) -> None:
        given = [name for name in ("weight", "samples", "repeat") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"{where}: give one of weight, samples, repeat, not {' and '.join(given)}")
        for name in ("weight", "repeat"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or
                                      not value > 0 or value != value or value == float("inf")):
                raise ValueError(f"{where}.{name}: must be a positive finite number, got {value!r}")
        for name in ("samples", "cap"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{where}.{name}: must be a positive integer, got {value!r}")


def _largest_remainder(total: int, weights: Sequence[Fraction]) -> list[int]:
    """`total` split in proportion to `weights` (floors, then +1 to the largest remainders; ties: lower index)."""
    whole = sum(weights)
    quotas = [total * w / whole for w in weights]
    counts = [int(q) for q in quotas]  # floor: quotas are non-negative
    left = total - sum(counts)
    by_remainder = sorted(range(len(weights)), key=lambda k: (-(quotas[k] - counts[k]), k))
    for k in by_remainder[:left]:
        counts[k] += 1
    return counts


def epoch_counts(sizes: Sequence[int], shares: Sequence[MixtureShare], epoch_samples: int | None = None) -> list[int]:
    """Samples each source contributes to every epoch (see the module docstring)."""
    if len(sizes) != len(shares) or not sizes:
        raise ValueError(f"sources: {len(sizes)} sizes for {len(shares)} shares; a mixture needs at least one source")
    for k, share in enumerate(shares):
        share.check(f"sources[{k}]")
    if epoch_samples is not None and (isinstance(epoch_samples, bool) or not isinstance(epoch_samples, int)
                                      or epoch_samples <= 0):
        raise ValueError(f"epoch_samples: must be a positive integer, got {epoch_samples!r}")
    counts: list[int | None] = [None] * len(sizes)
    for k, (size, share) in enumerate(zip(sizes, shares, strict=True)):
        if share.samples is not None:
            counts[k] = share.samples
        elif share.repeat is not None:
            counts[k] = int(Fraction(share.repeat) * size + Fraction(1, 2))
    weighted = [k for k in range(len(sizes)) if counts[k] is None]
    if weighted:
        fixed = sum(c for c in counts if c is not None)
        pool = sum(sizes[k] for k in weighted) if epoch_samples is None else epoch_samples - fixed
        if pool <= 0:
            raise ValueError(f"epoch_samples: {epoch_samples} leaves no samples for the weighted sources "
                             f"(the fixed ones take {fixed})")
        weights = [Fraction(shares[k].weight or 1) for k in weighted]
        for k, count in zip(weighted, _largest_remainder(pool, weights), strict=True):
            counts[k] = count
    out = [min(int(c or 0), share.cap) if share.cap is not None else int(c or 0)
           for c, share in zip(counts, shares, strict=True)]
    for k, count in enumerate(out):
        if count <= 0:
            raise ValueError(f"sources[{k}]: its share rounds to no samples per epoch; raise its weight or the "
                             "epoch's samples")
    return out


@dataclass(frozen=True)
class _Step:
    batch: np.ndarray  # global sample indices, in order
    sources: np.ndarray  # the source of each
    consumed: tuple[int, ...]  # samples of each source read this epoch after this step


def batch_counts(remaining: Sequence[int], global_batch: int) -> list[list[int]]:
    """Per global batch, how many samples each source gives, for the `remaining` samples of each source: every batch
    of b samples gives source k floor(b r_k / r) or that plus one (r = sum r_k), and the columns add up to r_k."""
    total = sum(remaining)
    if total == 0:
        return []
    full, tail = divmod(total, global_batch)
    # The tail batch: largest remainder.
    tail_counts = [tail * r // total for r in remaining]
    order = sorted(range(len(remaining)), key=lambda k: (-((tail * remaining[k]) % total), k))
    for k in order[: tail - sum(tail_counts)]:
        tail_counts[k] += 1
    rows = [[global_batch * r // total for r in remaining] for _ in range(full)]
    if full:
        extras = [remaining[k] - tail_counts[k] - full * rows[0][k] for k in range(len(remaining))]
        if any(e < 0 or e > full for e in extras) or sum(extras) % full:
            raise AssertionError(f"mixture plan: extras {extras} do not fit {full} batches")
        # McNaughton's wrap-around: source k's extras take consecutive slots q of a cycle over the batches, batch
        # (q mod full) in a strided order, so no batch gets two extras of one source and each gets the same number.
        stride = _coprime_stride(full)
        q = 0
        for k, extra in enumerate(extras):
            for slot in range(q, q + extra):
                rows[((slot % full) * stride) % full][k] += 1
            q += extra
    if tail:
        rows.append(tail_counts)
    return rows


def _coprime_stride(n: int) -> int:
    """A step coprime to n near n x 0.618 (its multiples mod n spread evenly)."""
    if n <= 2:
        return 1
    start = max(1, round(n * _GOLDEN))
    for delta in range(n):
        for candidate in (start + delta, start - delta):
            if 0 < candidate < n and np.gcd(candidate, n) == 1:
                return candidate
    return 1


def _interleave(counts: Sequence[int]) -> np.ndarray:
    """The source of each slot of a batch: source k's j-th sample sits at its ideal position (j + 0.5) / c_k."""
    keys = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c] or [np.empty(0)])
    owners = np.concatenate([np.full(c, k, dtype=np.int64) for k, c in enumerate(counts) if c]
                            or [np.empty(0, dtype=np.int64)])
    return owners[np.argsort(keys, kind="stable")]


class MixtureBatchSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of global sample indices) of a mixture for the current epoch."""

    def __init__(self, source_shard_sizes: Sequence[Sequence[int]], shares: Sequence[MixtureShare],
                 batch_size: int, *, epoch_samples: int | None = None, seed: int = 0, shuffle: bool = True,
                 shuffle_shards: int = 4, block_size: int = 1, rank: int = 0, world_size: int = 1,
                 local_world_size: int | None = None, min_rank_batch: int = 1) -> None:
        for name, value in (("batch_size", batch_size), ("world_size", world_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        local = checked_local_world_size(rank, world_size, local_world_size)
        self.order = SpanOrder(seed=seed, shuffle=shuffle, shuffle_shards=shuffle_shards, block_size=block_size)
        # One single-stream sampler per source gives that source's pass orders (it checks the shard sizes).
        self.sources = [ElasticBatchSampler(sizes, 1, seed=_source_seed(seed, k), shuffle=shuffle,
                                            shuffle_shards=shuffle_shards, block_size=block_size)
                        for k, sizes in enumerate(source_shard_sizes)]
        self.sizes = [s.num_samples for s in self.sources]
        self.counts = epoch_counts(self.sizes, shares, epoch_samples)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.shard_starts = np.concatenate([s.shard_starts + base for s, base in zip(self.sources, self.starts,
                                                                                      strict=True)])
        self.num_samples = int(sum(self.sizes))
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.local_world_size = local
        self.min_rank_batch = min(min_rank_batch, batch_size)
        if not isinstance(min_rank_batch, int) or min_rank_batch <= 0:
            raise ValueError(f"min_rank_batch: must be a positive integer, got {min_rank_batch!r}")
        if sum(self.counts) < world_size * self.min_rank_batch:
            raise ValueError(f"sources: {sum(self.counts)} samples per epoch cannot give each of {world_size} ranks "
                             f"{self.min_rank_batch}")
        self.epoch = 0
        self.plan_start: tuple[int, ...] = (0,) * len(self.sizes)  # consumed counts where the batch plan began
        self.plan_batch = batch_size * world_size  # the global batch the plan was made with
        self.skip = 0  # steps of the plan already consumed
        self._pass_cache: dict[tuple[int, int], np.ndarray] = {}
        self._steps_cache: dict[Any, list[_Step]] = {}

    # -- the order ----------------------------------------------------------------------------------------------
    @property
    def epoch_samples(self) -> int:
        return sum(self.counts)

    def _pass(self, source: int, number: int) -> np.ndarray:
        key = (source, number)
        if key not in self._pass_cache:
            if len(self._pass_cache) >= 4 * len(self.sizes):
                self._pass_cache.pop(next(iter(self._pass_cache)))
            self._pass_cache[key] = self.sources[source].streams(number)[0]
        return self._pass_cache[key]

    def source_order(self, source: int, begin: int, end: int) -> np.ndarray:
        """Positions [begin, end) of a source's endless stream (its local sample indices, pass after pass)."""
        size, out = self.sizes[source], []
        position = begin
        while position < end:
            number, offset = divmod(position, size)
            take = min(end - position, size - offset)
            out.append(self._pass(source, number)[offset : offset + take])
            position += take
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)

    def _plan(self, epoch: int, start: tuple[int, ...], global_batch: int) -> list[_Step]:
        key = (epoch, start, global_batch)
        if key in self._steps_cache:
            return self._steps_cache[key]
        remaining = [n - s for n, s in zip(self.counts, start, strict=True)]
        rows = batch_counts(remaining, global_batch)
        taken = [self.source_order(k, epoch * n + s, (epoch + 1) * n) + self.starts[k]
                 for k, (n, s) in enumerate(zip(self.counts, start, strict=True))]
        used = list(start)
        offsets = [0] * len(self.sizes)
        steps = []
        for row in rows:
            owners = _interleave(row)
            batch = np.empty(len(owners), dtype=np.int64)
            for k, count in enumerate(row):
                if count:
                    batch[owners == k] = taken[k][offsets[k] : offsets[k] + count]
                    offsets[k] += count
                    used[k] += count
            steps.append(_Step(batch, owners, tuple(used)))
        if len(self._steps_cache) >= 2:
            self._steps_cache.pop(next(iter(self._steps_cache)))
        self._steps_cache[key] = steps
        return steps

    def _steps(self) -> list[_Step]:
        """The global batches from the current position: the plan's, with a last one too small to give every rank
        `min_rank_batch` samples merged into the one before (appended: the order is the same on any world size)."""
        steps = self._plan(self.epoch, self.plan_start, self.plan_batch)[self.skip :]
        if len(steps) >= 2 and len(steps[-1].batch) < self.world_size * self.min_rank_batch:
            last, before = steps[-1], steps[-2]
            steps = [*steps[:-2], _Step(np.concatenate([before.batch, last.batch]),
                                        np.concatenate([before.sources, last.sources]), last.consumed)]
        return steps

    def planned_sources(self) -> list[np.ndarray]:
        """The source of each sample of every planned global batch from the current position (before a small
        last batch is merged): each holds every source's share to within one sample."""
        return [step.sources for step in self._plan(self.epoch, self.plan_start, self.plan_batch)[self.skip :]]

    def _pieces(self, step: _Step) -> list[np.ndarray]:
        return np.array_split(np.arange(len(step.batch)), self.world_size)

    # -- epochs and positions -----------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Iterate `epoch` from its start."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch: must be a non-negative integer, got {epoch!r}")
        self.epoch = epoch
        self.plan_start = (0,) * len(self.sizes)
        self.plan_batch = self.batch_size * self.world_size
        self.skip = 0

    def state_dict(self, batches: int = 0) -> dict[str, Any]:
        """The position after `batches` batches of the current iteration: any world size continues from it."""
        steps = self._steps()
        if not 0 <= batches <= len(steps):
            raise ValueError(f"batches: {batches} not in [0, {len(steps)}]")
        plan = self._plan(self.epoch, self.plan_start, self.plan_batch)
        consumed = steps[batches - 1].consumed if batches else (plan[self.skip - 1].consumed if self.skip
                                                                else self.plan_start)
        return {"version": STATE_VERSION, "kind": STATE_KIND, "epoch": self.epoch, "consumed": list(consumed),
                "plan": {"start": list(self.plan_start), "global_batch": self.plan_batch},
                "sources": [{"num_samples": n, "epoch_samples": c} for n, c in zip(self.sizes, self.counts,
                                                                                      strict=True)],
                "order": asdict(self.order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state_dict` left off; ValueError (naming the field) when the order would differ."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or state.get("kind") != STATE_KIND:
            raise ValueError("loader state: not a mixture position (version "
                             f"{state.get('version') if isinstance(state, dict) else None!r})")
        expected = [{"num_samples": n, "epoch_samples": c} for n, c in zip(self.sizes, self.counts, strict=True)]
        if state.get("sources") != expected:
            raise ValueError(f"sources: the saved position was taken with sources {state.get('sources')!r}, this "
                             f"mixture has {expected}; the remaining samples would differ")
        check_saved_order(state.get("order"), self.order)
        epoch, consumed, plan = state.get("epoch"), state.get("consumed"), state.get("plan")
        consumed_list: list[int] = consumed if isinstance(consumed, list) else []
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"loader state: epoch must be a non-negative integer, got {epoch!r}")
        if not _counts_fit(consumed, self.counts):
            raise ValueError(f"loader state: consumed {consumed!r} does not fit {self.counts} samples per epoch")
        start = plan.get("start") if isinstance(plan, dict) else None
        global_batch = plan.get("global_batch") if isinstance(plan, dict) else None
        if not _counts_fit(start, self.counts) or not isinstance(global_batch, int) or global_batch <= 0:
            raise ValueError(f"loader state: plan {plan!r} is not a start per source and a global batch")
        self.epoch = epoch
        begin: tuple[int, ...] = tuple(start) if isinstance(start, list) else ()
        if global_batch == self.batch_size * self.world_size:
            steps = self._plan(epoch, begin, global_batch)
            boundaries = [begin] + [step.consumed for step in steps]
            if tuple(consumed_list) in boundaries:
                self.plan_start, self.plan_batch = begin, global_batch
                self.skip = boundaries.index(tuple(consumed_list))
                return
        # Another global batch (or a position between this plan's batches): the rest is planned afresh.
        self.plan_start, self.plan_batch, self.skip = tuple(consumed_list), self.batch_size * self.world_size, 0

    def __iter__(self) -> Iterator[list[int]]:
        for step in self._steps():
            yield step.batch[self._pieces(step)[self.rank]].tolist()

    def __len__(self) -> int:
        return len(self._steps())

    def epoch_order(self) -> np.ndarray:
        """Every sample of the current iteration in global order (all ranks' batches, step by step)."""
        steps = self._steps()
        return np.concatenate([step.batch for step in steps]) if steps else np.empty(0, dtype=np.int64)

    def source_of(self, samples: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.starts, samples, side="right") - 1

    # -- what this node reads, for the staging cache ------------------------------------------------------------
    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    def node_shards(self, from_batch: int = 0) -> tuple[list[int], list[int], list[int]]:
        """The shards (numbered across the sources: source k's shard s is `sum of earlier shard counts + s`) this
        node reads from batch `from_batch` on: in order of first use, with each one's first and last batch."""
        steps = self._steps()[from_batch:]
        first_rank = self.node * self.local_world_size
        shards_out: list[np.ndarray] = []
        batch_of: list[np.ndarray] = []
        for number, step in enumerate(steps, start=from_batch):
            pieces = self._pieces(step)[first_rank : first_rank + self.local_world_size]
            node = step.batch[np.concatenate(pieces)]
            shards_out.append(np.searchsorted(self.shard_starts, node, side="right") - 1)
            batch_of.append(np.full(len(node), number, dtype=np.int64))
        if not shards_out:
            return [], [], []
        shards, batches = np.concatenate(shards_out), np.concatenate(batch_of)
        distinct, first_seen = np.unique(shards, return_index=True)
        by_first_use = distinct[np.argsort(first_seen, kind="stable")]
        last = np.zeros(len(self.shard_starts), dtype=np.int64)
        last[shards] = batches
        first = np.zeros(len(self.shard_starts), dtype=np.int64)
        first[shards[::-1]] = batches[::-1]
        return by_first_use.tolist(), [int(first[s]) for s in by_first_use], [int(last[s]) for s in by_first_use]

    def next_epoch_shards(self) -> list[int]:
        saved = (self.epoch, self.plan_start, self.plan_batch, self.skip)
        self.set_epoch(self.epoch + 1)
        try:
            return self.node_shards()[0]
        finally:
            self.epoch, self.plan_start, self.plan_batch, self.skip = saved


def _counts_fit(value: Any, counts: Sequence[int]) -> bool:
    return (isinstance(value, list) and len(value) == len(counts)
            and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= n
                    for v, n in zip(value, counts, strict=True)))


def _source_seed(seed: int, source: int) -> int:
    """Each source's own seed, a pure function of (seed, source)."""
    return int(np.random.SeedSequence([seed, source]).generate_state(1)[0])
