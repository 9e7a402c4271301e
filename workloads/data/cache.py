"""Both sides of the staging-cache protocol between `stage` and the training reader on one node.

The stager keeps a set of verified shards in DEST, at most `budget` bytes of them (no bound: the whole dataset),
fetching them in the order the reader says it will read them and evicting the ones it will not need soonest. The
two sides agree through two small JSON files in DEST/.cache/ (see workloads/data/format.py), each written by exactly
one side with an atomic rename:

    stager.json  {"budget": int | null, "ready": [...], "done": bool, "error": str | null}   written by the stager
    plan.json    {"order": [...], "done": bool}                                              written by the reader

Shard names are manifest paths ("shard-00000.h5"), relative to DEST.
- "ready" lists the shards present right now: each was downloaded, checked against the manifest's sha256 and
  renamed into place by this stager run. A shard leaves "ready" before it is deleted.
- "order" is the node's future reads, distinct shards in the order of their first use from the reader's current
  position on: the rest of this epoch, then the next epoch. The stager keeps the longest prefix of it that fits the
  budget and evicts everything else, so a shard still being read (it stays at the front until the reader is past
  its last use) is never evicted, and when the budget holds the dataset nothing is evicted or fetched twice.
  Without a plan the stager fetches in manifest order (copy mode, or a reader that has not started yet).
- "done" (plan): the reader will read nothing more; a stager without --linger may exit.
- "error" carries the stager's one-line failure so a waiting reader fails fast instead of timing out.

Reader API (the HDF5 Dataset waits; the node's local rank 0 writes the plan, see CacheFeeder):

    cache = CacheReader(dest)
    path = cache.wait_ready("shard-00003.h5", timeout=600)   # -> Path to the verified local file
    cache.write_plan(["shard-00003.h5", "shard-00007.h5", ...])

Deleting an evicted shard is safe while a reader still holds it open (POSIX unlink); readers close handles of
shards that left "ready" (their blocks count against the node's disk until closed).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from workloads.data.format import CACHE_DIR, PLAN_STATE, STAGER_STATE, atomic_write_bytes


class CacheStagerError(RuntimeError):
    """The stager reported a failure; the shard will never become ready."""


@dataclass(frozen=True)
class StagerState:
    budget: int | None = None
    ready: list[str] = field(default_factory=list)
    done: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Plan:
    order: list[str] = field(default_factory=list)
    done: bool = False


def cache_dir(dest: str | os.PathLike[str]) -> Path:
    return Path(dest) / CACHE_DIR


def _read_json(path: Path) -> dict | None:
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, OSError, RecursionError) as exc:  # bad JSON or UTF-8, a directory, nested too deep
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:200]
        raise ValueError(f"{path}: unreadable cache state: {why or type(exc).__name__}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: unreadable cache state: not a JSON object")
    return raw


def _names(raw: dict, key: str, path: Path) -> list[str]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"{path}: {key}: must be a list of shard names")
    return list(value)


def _write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, (json.dumps(payload, sort_keys=True) + "\n").encode())


def read_stager_state(dest: str | os.PathLike[str]) -> StagerState | None:
    path = cache_dir(dest) / STAGER_STATE
    raw = _read_json(path)
    if raw is None:
        return None
    budget = raw.get("budget")
    if budget is not None and (not isinstance(budget, int) or budget <= 0):
        raise ValueError(f"{path}: budget: must be a positive number of bytes or null")
    error = raw.get("error")
    return StagerState(budget=budget, ready=_names(raw, "ready", path), done=bool(raw.get("done", False)),
                       error=str(error) if error is not None else None)


def write_stager_state(dest: str | os.PathLike[str], state: StagerState) -> None:
    _write_json(cache_dir(dest) / STAGER_STATE, {"budget": state.budget, "ready": state.ready,
                                                 "done": state.done, "error": state.error})


def read_plan(dest: str | os.PathLike[str]) -> Plan | None:
    path = cache_dir(dest) / PLAN_STATE
    raw = _read_json(path)
    if raw is None:
        return None
    return Plan(order=_names(raw, "order", path), done=bool(raw.get("done", False)))


def write_plan(dest: str | os.PathLike[str], plan: Plan) -> None:
    _write_json(cache_dir(dest) / PLAN_STATE, {"order": plan.order, "done": plan.done})


def is_cached(dest: str | os.PathLike[str]) -> bool:
    """Whether DEST is served by a staging cache (a stager has published its state there)."""
    return (cache_dir(dest) / STAGER_STATE).exists()


class CacheReader:
    """The reader's side: wait for a shard to be staged, and say which shards come next."""

    def __init__(self, dest: str | os.PathLike[str], poll_interval_s: float = 0.01) -> None:
        self.dest = Path(dest)
        self.poll_interval_s = poll_interval_s

    def state(self) -> StagerState | None:
        return read_stager_state(self.dest)

    def ready(self) -> set[str]:
        """Shards present now; an empty set while no stager has published anything."""
        state = self.state()
        return set(state.ready) if state else set()

    def is_ready(self, name: str) -> bool:
        state = self.state()
        if state is None:
            return (self.dest / name).is_file()
        if state.error:
            raise CacheStagerError(f"{self.dest}: stager failed: {state.error}")
        return name in state.ready and (self.dest / name).is_file()

    def wait_ready(self, name: str, timeout: float | None = None) -> Path:
        """Block until the shard is staged and verified; return its local path.

        Raises TimeoutError after `timeout` seconds (None waits forever) and CacheStagerError when the stager
        reported a failure.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_ready(name):
            if deadline is not None and time.monotonic() >= deadline:
                state = self.state()
                budget = f" (cache budget {state.budget} bytes)" if state and state.budget else ""
                raise TimeoutError(f"{self.dest / name}: not staged after {timeout:g}s{budget}; is the stager "
                                   f"running and its plan ({cache_dir(self.dest) / PLAN_STATE}) up to date?")
            time.sleep(self.poll_interval_s)
        return self.dest / name

    def write_plan(self, order: Sequence[str], done: bool = False) -> None:
        write_plan(self.dest, Plan(order=list(order), done=done))


class NodeOrder(Protocol):
    """What the feeder needs from the sampler (workloads/data/sampler.py ElasticBatchSampler)."""

    def node_shards(self, from_batch: int = 0) -> tuple[list[int], list[int], list[int]]: ...

    def next_epoch_shards(self) -> list[int]: ...


class CacheTooSmall(ValueError):
    """The node must hold more shards at once than the cache's budget allows: the reader would wait forever."""


def working_set_bytes(shard_bytes: Sequence[int], order: Sequence[int], first: Sequence[int],
                      last: Sequence[int]) -> int:
    """The most bytes of shards in use at once: a shard is in use from its first to its last batch."""
    events = sorted([(begin, size) for begin, size in zip(first, (shard_bytes[s] for s in order), strict=True)]
                    + [(end + 1, -shard_bytes[s]) for end, s in zip(last, order, strict=True)],
                    key=lambda event: (event[0], event[1]))
    held = peak = 0
    for _, change in events:
        held += change
        peak = max(peak, held)
    return peak


class CacheFeeder:
    """Keeps a node's plan up to date as training advances; run by one process per node (local rank 0).

    Ranks step together (DDP all-reduces every step), so once this rank has finished batch k every rank of the node
    has loaded its batch k: a shard whose last use is batch k is no longer needed this epoch. The plan is the
    node's remaining shards of this epoch in order of first use, then the next epoch's, so the stager fetches
    across the epoch boundary and keeps the shards both epochs share.
    """

    def __init__(self, reader: CacheReader, shard_names: Sequence[str], shard_bytes: Sequence[int],
                 order: NodeOrder) -> None:
        self.reader = reader
        self.shard_names = list(shard_names)
        self.shard_bytes = list(shard_bytes)
        self.order = order
        self._current: list[int] = []
        self._last_use: list[int] = []
        self._next: list[int] = []
        self._written: list[str] | None = None
        self._changes_after = -1  # the plan changes only once training is past this batch

    def start_epoch(self, last_epoch: bool) -> None:
        """Call after the sampler is positioned (set_epoch or load_state_dict), before iterating.

        Raises CacheTooSmall when the stager's budget cannot hold the shards this epoch reads at once."""
        self._current, first_use, self._last_use = self.order.node_shards()
        state = self.reader.state()
        needed = working_set_bytes(self.shard_bytes, self._current, first_use, self._last_use)
        if state is not None and state.budget is not None and needed > state.budget:
            raise CacheTooSmall(
                f"--shuffle-shards: this node reads shards worth {needed} bytes at once, but the staging cache in "
                f"{self.reader.dest} holds {state.budget} bytes: use fewer --shuffle-shards (or more canonical "
                "nodes per node), smaller shards, or a larger cache budget")
        self._next = [] if last_epoch else self.order.next_epoch_shards()
        self._changes_after = -1
        self.advance(0)

    def advance(self, batches_done: int) -> None:
        """`batches_done` batches of the current iteration are finished on this node."""
        if self._written is not None and batches_done <= self._changes_after:
            return  # called every step: nothing leaves the plan before a shard's last batch is done
        still_used = [(s, last) for s, last in zip(self._current, self._last_use, strict=True) if last >= batches_done]
        remaining = [s for s, _ in still_used]
        self._changes_after = min((last for _, last in still_used), default=-1)
        seen = set(remaining)
        order = [self.shard_names[s] for s in [*remaining, *(s for s in self._next if s not in seen)]]
        if order != self._written:
            self.reader.write_plan(order)
            self._written = order

    def finish(self) -> None:
        """Nothing more will be read: the stager may stop (or, lingering, keep what it has)."""
        self.reader.write_plan([], done=True)
        self._written = []
