"""The epoch's sample order: global, cache-friendly, the same for any number of nodes, ranks and workers.

An epoch's order is a pure function of (seed, epoch) and the dataset's shard sizes, built in three steps:

1. Shards are permuted (seeded by seed and epoch), and their samples laid end to end in that order.
2. That sequence is cut into `canonical_nodes` contiguous, near-equal streams. A node reads only its own streams,
   so it needs only the shards those streams cover (a shard on a cut is read by both neighbours).
3. Each stream is split into spans of `shuffle_shards` consecutive shards, and the samples of each span are
   shuffled (one by one, or in blocks of `block_size` consecutive samples whose boundaries move every epoch). The
   reader therefore works on a few shards at a time, which is what lets a bounded staging cache fetch them in
   order, while two samples of one shard land in the same batch no more often than chance within the span. The
   first spans of a stream are shorter (1 shard, then 2, doubling up to `shuffle_shards`): an epoch's first batch
   needs one shard per stream, so training starts as soon as that one is local.

Training consumes the streams in steps: a global batch of `batch_size * world_size` samples takes its share from
every stream (near-equal chunks), and is split into `world_size` contiguous pieces, one per rank; ranks of one node
are consecutive, so with `canonical_nodes` a multiple of the node count each node's pieces come from its own
streams. The concatenation of every step's global batch (the epoch order) depends on the global batch size but not
on how it is split: 1, 2 or 4 nodes of any ranks and any number of DataLoader workers (they only load the batches
this sampler yields) see the same order. Every sample is seen exactly once per epoch: nothing is padded or
dropped; the last step is smaller (merged into the step before when it would leave a rank with fewer than
`min_rank_batch` samples: the trainer asks for 2, as BatchNorm cannot train on a batch of one).

Resume is sample-exact: `state_dict(batches)` records how far each stream has been consumed, and
`load_state_dict` continues from there, even with another world size or batch size (the remaining samples are
exactly those not yet seen).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from torch.utils.data import Sampler

STATE_VERSION = 1


@dataclass(frozen=True)
class SpanOrder:
    """What fixes the order within a stream: the seed, and how its spans of shards are shuffled (a mixture's
    sources each read one stream in such an order)."""

    seed: int = 0
    shuffle: bool = True
    shuffle_shards: int = 4
    block_size: int = 1


@dataclass(frozen=True)
class OrderConfig(SpanOrder):
    """What fixes an epoch's order (besides the global batch size, which only changes how it is stepped)."""

    canonical_nodes: int = 1


def checked_local_world_size(rank: int, world_size: int, local_world_size: int | None) -> int:
    """The ranks per node (None: all on one), after checking that `rank` is one of `world_size` and that the
    nodes' ranks divide it."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} not in [0, {world_size})")
    local = local_world_size or world_size
    if local <= 0 or world_size % local:
        raise ValueError(f"local_world_size: {local} does not divide the world size {world_size}")
    return local


def check_saved_order(saved: Any, order: SpanOrder) -> None:
    """A saved position continues only with the order it was taken with: ValueError naming the first field that
    differs."""
    if not isinstance(saved, dict):
        raise ValueError(f"loader state: order must be a mapping, got {type(saved).__name__}")
    for name, now in asdict(order).items():
        if saved.get(name) != now:
            raise ValueError(f"{name}: the saved position was taken with {name} {saved.get(name)!r}, "
                             f"this sampler has {now!r}; the remaining samples would differ")


@dataclass(frozen=True)
class _Step:
    batch: np.ndarray  # the global batch's sample indices, in order
    offsets: tuple[int, ...]  # how far each stream has been consumed after this step
    stream_ends: tuple[int, ...] | None  # where each stream's part of `batch` ends; None once merged


class ElasticBatchSampler(Sampler[list[int]]):
    """Yields this rank's batches (lists of sample indices) for the current epoch, from the current position."""

    def __init__(
        self,
        shard_sizes: Sequence[int],
        batch_size: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_shards: int = 4,
        block_size: int = 1,
        canonical_nodes: int = 1,
        rank: int = 0,
        world_size: int = 1,
        local_world_size: int | None = None,
        min_rank_batch: int = 1,
    ) -> None:
        sizes = [int(size) for size in shard_sizes]
        if not sizes or min(sizes) < 0 or sum(sizes) <= 0:
            raise ValueError(f"shard_sizes: must be non-negative and add up to a positive count, got {sizes[:8]}")
        for name, value in (("batch_size", batch_size), ("shuffle_shards", shuffle_shards),
                            ("block_size", block_size), ("canonical_nodes", canonical_nodes),
                            ("world_size", world_size)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: must be a positive integer, got {value!r}")
        local = checked_local_world_size(rank, world_size, local_world_size)
        if not isinstance(min_rank_batch, int) or min_rank_batch <= 0:
            raise ValueError(f"min_rank_batch: must be a positive integer, got {min_rank_batch!r}")
        min_rank_batch = min(min_rank_batch, batch_size)
        if sum(sizes) < world_size * min_rank_batch:
            raise ValueError(f"shard_sizes: {sum(sizes)} samples cannot give each of {world_size} ranks "
                             f"{min_rank_batch}")
        if batch_size * world_size < canonical_nodes:
            raise ValueError(f"canonical_nodes: {canonical_nodes} streams need a global batch of at least as many "
                             f"samples, got {batch_size} x {world_size} ranks")
        self.shard_sizes = sizes
        self.shard_starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.num_samples = int(sum(sizes))
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.local_world_size = local
        self.min_rank_batch = min_rank_batch
        self.order = OrderConfig(seed=seed, shuffle=shuffle, shuffle_shards=shuffle_shards,
                                 block_size=block_size, canonical_nodes=canonical_nodes)
        self.epoch = 0
        self.start: tuple[int, ...] | None = None  # stream offsets to continue from; None: the epoch's start
        # The last two orders computed: the current epoch's and the next one's (the cache feeder asks for both).
        self._steps_cache: dict[Any, list[_Step]] = {}

    # -- the order ----------------------------------------------------------------------------------------------
    @property
    def canonical_nodes(self) -> int:
        return self.order.canonical_nodes

    def set_canonical_nodes(self, canonical_nodes: int) -> None:
        """Use another stream count (a resumed run keeps the one its order was made with)."""
        if not isinstance(canonical_nodes, int) or not 0 < canonical_nodes <= self.batch_size * self.world_size:
            raise ValueError(f"canonical_nodes: must be in [1, {self.batch_size * self.world_size}] (the global "
                             f"batch), got {canonical_nodes!r}")
        self.order = replace(self.order, canonical_nodes=canonical_nodes)

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    def streams(self, epoch: int) -> list[np.ndarray]:
        """Each canonical stream's samples for `epoch`, in reading order."""
        order = self.order
        shard_order = (np.random.default_rng([order.seed, epoch]).permutation(len(self.shard_sizes))
                       if order.shuffle else np.arange(len(self.shard_sizes)))
        sequence = np.concatenate([np.arange(self.shard_starts[s], self.shard_starts[s] + self.shard_sizes[s],
                                             dtype=np.int64) for s in shard_order])
        pieces = np.array_split(sequence, order.canonical_nodes)
        return [self._shuffle_stream(piece, epoch, number) for number, piece in enumerate(pieces)]

    def _shuffle_stream(self, samples: np.ndarray, epoch: int, stream: int) -> np.ndarray:
        order = self.order
        if not order.shuffle or len(samples) == 0:
            return samples
        shard_of = self.shard_of(samples)
        segment_starts = np.concatenate([[0], np.flatnonzero(np.diff(shard_of)) + 1])
        span_starts = segment_starts[_span_firsts(len(segment_starts), order.shuffle_shards)].tolist()
        out = []
        for number, (begin, end) in enumerate(zip(span_starts, [*span_starts[1:], len(samples)], strict=True)):
            rng = np.random.default_rng([order.seed, epoch, stream, number])
            span = samples[begin:end]
            if order.block_size == 1:
                out.append(rng.permutation(span))
                continue
            phase = int(rng.integers(order.block_size))  # block boundaries move every epoch
            cuts = list(range(phase or order.block_size, len(span), order.block_size))
            blocks = np.split(span, cuts)
            out.extend(blocks[i] for i in rng.permutation(len(blocks)))
        return np.concatenate(out)

    def shard_of(self, samples: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.shard_starts, samples, side="right") - 1

    def _steps(self) -> list[_Step]:
        """Every global batch of the current epoch from the current position."""
        key = (self.epoch, self.start, self.batch_size, self.world_size, self.order)
        if key in self._steps_cache:
            return self._steps_cache[key]
        streams = self.streams(self.epoch)
        global_batch = self.batch_size * self.world_size
        chunk = [len(part) for part in np.array_split(np.empty(global_batch), len(streams))]
        offsets = list(self.start) if self.start is not None else [0] * len(streams)
        steps: list[_Step] = []
        while any(offset < len(stream) for offset, stream in zip(offsets, streams, strict=True)):
            parts = []
            for number, stream in enumerate(streams):
                parts.append(stream[offsets[number] : offsets[number] + chunk[number]])
                offsets[number] = min(len(stream), offsets[number] + chunk[number])
            ends = tuple(np.cumsum([len(part) for part in parts]).tolist())
            steps.append(_Step(np.concatenate(parts), tuple(offsets), ends))
        if len(steps) >= 2 and len(steps[-1].batch) < self.world_size * self.min_rank_batch:
            # A rank would get fewer than min_rank_batch samples (BatchNorm cannot train on one): the step before
            # takes these samples too (appended, so the order is the same as without merging, whatever the world
            # size).
            last = steps.pop()
            steps[-1] = _Step(np.concatenate([steps[-1].batch, last.batch]), last.offsets, None)
        if len(self._steps_cache) >= 2:
            self._steps_cache.pop(next(iter(self._steps_cache)))
        self._steps_cache[key] = steps
        return steps

    def _pieces(self, step: _Step) -> list[np.ndarray]:
        """The step's global batch cut into one contiguous piece per rank. When the nodes divide the streams
        evenly, each node's pieces are exactly its own streams' parts (so it reads only its streams' shards);
        otherwise, and for a merged last step, near-equal pieces."""
        nodes = self.world_size // self.local_world_size
        streams = self.canonical_nodes
        if step.stream_ends is not None and streams % nodes == 0:
            per_node = streams // nodes
            bounds = [0, *step.stream_ends]
            pieces = [piece for node in range(nodes)
                      for piece in np.array_split(step.batch[bounds[node * per_node] : bounds[(node + 1) * per_node]],
                                                  self.local_world_size)]
            if all(len(piece) >= min(self.min_rank_batch, len(step.batch) // self.world_size) for piece in pieces) \
                    and all(len(piece) for piece in pieces):
                return pieces
        return np.array_split(step.batch, self.world_size)

    def _piece(self, step: _Step, rank: int) -> np.ndarray:
        return self._pieces(step)[rank]

    # -- epochs and positions -----------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Iterate `epoch` from its start."""
        self.epoch = epoch
        self.start = None

    def state_dict(self, batches: int = 0) -> dict[str, Any]:
        """The position after this rank (and so every rank: they step together) consumed `batches` batches of the
        current iteration: enough to continue sample-exact with any world size or batch size."""
        steps = self._steps()
        if not 0 <= batches <= len(steps):
            raise ValueError(f"batches: {batches} not in [0, {len(steps)}]")
        if batches:
            offsets = list(steps[batches - 1].offsets)
        else:
            offsets = list(self.start) if self.start is not None else [0] * self.canonical_nodes
        return {"version": STATE_VERSION, "epoch": self.epoch, "offsets": offsets,
                "num_samples": self.num_samples, "order": asdict(self.order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where `state_dict` left off; ValueError (naming the field) when the order would differ."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state: version {state.get('version') if isinstance(state, dict) else None!r}"
                             f" is not {STATE_VERSION}")
        if state.get("num_samples") != self.num_samples:
            raise ValueError(f"loader state: written for {state.get('num_samples')} samples, "
                             f"the dataset has {self.num_samples}")
        check_saved_order(state.get("order"), self.order)
        offsets = state.get("offsets")
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"loader state: epoch must be a non-negative integer, got {epoch!r}")
        lengths = [len(stream) for stream in self.streams(epoch)]
        if (not isinstance(offsets, list) or len(offsets) != len(lengths)
                or not all(isinstance(o, int) and 0 <= o <= n for o, n in zip(offsets, lengths, strict=True))):
            raise ValueError(f"loader state: offsets {offsets!r} do not fit streams of {lengths} samples")
        self.epoch = epoch
        self.start = tuple(offsets)

    def __iter__(self) -> Iterator[list[int]]:
        for step in self._steps():
            yield self._piece(step, self.rank).tolist()

    def __len__(self) -> int:
        return len(self._steps())

    @property
    def batches_per_epoch(self) -> int:
        """Batches left in the current iteration (the whole epoch after set_epoch)."""
        return len(self)

    def epoch_order(self) -> np.ndarray:
        """Every sample of the current iteration in global order (all ranks' batches, step by step)."""
        steps = self._steps()
        return np.concatenate([step.batch for step in steps]) if steps else np.empty(0, dtype=np.int64)

    # -- what this node reads, for the staging cache ------------------------------------------------------------
    def node_shards(self, from_batch: int = 0) -> tuple[list[int], list[int], list[int]]:
        """The shards this node's ranks read from batch `from_batch` of the current iteration on: distinct shard
        indices in order of first use, and for each the first and the last batch that uses it."""
        steps = self._steps()[from_batch:]
        first_rank = self.node * self.local_world_size
        samples, batch_of = [], []
        for number, step in enumerate(steps, start=from_batch):
            node_samples = np.concatenate(self._pieces(step)[first_rank : first_rank + self.local_world_size])
            samples.append(node_samples)
            batch_of.append(np.full(len(node_samples), number, dtype=np.int64))
        if not samples:
            return [], [], []
        shards = self.shard_of(np.concatenate(samples))
        batches = np.concatenate(batch_of)
        distinct, first_seen = np.unique(shards, return_index=True)
        by_first_use = distinct[np.argsort(first_seen, kind="stable")]
        last_batch = np.zeros(len(self.shard_sizes), dtype=np.int64)
        last_batch[shards] = batches  # later assignments win: batches are in increasing order
        first_batch = np.zeros(len(self.shard_sizes), dtype=np.int64)
        first_batch[shards[::-1]] = batches[::-1]  # earlier ones win
        return (by_first_use.tolist(), [int(first_batch[s]) for s in by_first_use],
                [int(last_batch[s]) for s in by_first_use])

    def next_epoch_shards(self) -> list[int]:
        """The shards this node reads in the next epoch, in order of first use (for prefetching across epochs)."""
        saved = (self.epoch, self.start)
        self.set_epoch(self.epoch + 1)
        try:
            return self.node_shards()[0]
        finally:
            self.epoch, self.start = saved


def _span_firsts(segments: int, span: int) -> list[int]:
    """Indices of the segments (shards, in stream order) that begin a span: spans of 1, 2, 4... up to `span`."""
    firsts, position, length = [], 0, 1
    while position < segments:
        firsts.append(position)
        position += min(length, span)
        length *= 2
    return firsts
