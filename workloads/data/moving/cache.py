"""Both sides of the staging-cache protocol between `stage` and the training reader on one node.

The stager keeps a set of verified shards in DEST, at most `budget` bytes of them (no bound: the whole dataset),
fetching them in the order the reader says it will read them and evicting the ones it will not need soonest. The
two sides agree through two small JSON files in DEST/.cache/ (see workloads/data/format/manifest.py), each written
by exactly one side with an atomic rename:

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

import contextlib
import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from workloads.data.format.manifest import CACHE_DIR, HEARTBEAT, PLAN_STATE, STAGER_STATE
from workloads.safeio import StateFile, StateFileError, atomic_write_in, open_dir
from workloads.safeio import field as typed

SHARD_WAIT_S = 3600.0  # how long a reader waits for one shard by default
HEARTBEAT_INTERVAL_S = 1.0  # how often a serving stager touches its heartbeat file
HEARTBEAT_TIMEOUT_S = 60.0  # a heartbeat older than this: no stager is running (killed, OOM, never started)
_FIRST_NOTICE_S = 10.0  # a wait this long is logged (what the reader waits for), then every _NOTICE_EVERY_S
_NOTICE_EVERY_S = 60.0


class CacheStagerError(RuntimeError):
    """The stager reported a failure, stopped, or published a state that cannot be served: the shard will never
    become ready from this stager (a new pod, with a new stager, may succeed)."""


@dataclass(frozen=True)
class StagerState:
    budget: int | None = None
    ready: list[str] = field(default_factory=list)
    done: bool = False
    error: str | None = None


@dataclass(frozen=True)
class ReadPlan:
    """The trainer's read plan (plan.json): the shards in the order it will read them; `done` once it has read all."""

    order: list[str] = field(default_factory=list)
    done: bool = False


def cache_dir(dest: str | os.PathLike[str]) -> Path:
    return Path(dest) / CACHE_DIR


def _parse_stager_state(raw: dict[str, Any], where: str) -> StagerState:
    return StagerState(budget=typed(raw, "budget", "int>0|null", where, None),
                       ready=list(typed(raw, "ready", "list[str]", where, [])),
                       done=typed(raw, "done", "bool", where, False),
                       error=typed(raw, "error", "str|null", where, None))


def _parse_plan(raw: dict[str, Any], where: str) -> ReadPlan:
    return ReadPlan(order=list(typed(raw, "order", "list[str]", where, [])),
                    done=typed(raw, "done", "bool", where, False))


def stager_state_file(dest: str | os.PathLike[str]) -> StateFile:
    """stager.json, read as untrusted input and parsed again only when it changed."""
    return StateFile(cache_dir(dest), STAGER_STATE, _parse_stager_state)


def plan_file(dest: str | os.PathLike[str]) -> StateFile:
    """plan.json, read as untrusted input and parsed again only when it changed."""
    return StateFile(cache_dir(dest), PLAN_STATE, _parse_plan)


def _write_json(dest: str | os.PathLike[str], name: str, payload: dict) -> None:
    atomic_write_in(cache_dir(dest), name, (json.dumps(payload, sort_keys=True) + "\n").encode())


def read_stager_state(dest: str | os.PathLike[str]) -> StagerState | None:
    """stager.json (None while there is none); StateFileError (a ValueError) for anything but a valid one."""
    return stager_state_file(dest).read()


def write_stager_state(dest: str | os.PathLike[str], state: StagerState) -> None:
    _write_json(dest, STAGER_STATE, {"budget": state.budget, "ready": state.ready, "done": state.done,
                                     "error": state.error})


def read_plan(dest: str | os.PathLike[str]) -> ReadPlan | None:
    return plan_file(dest).read()


def write_plan(dest: str | os.PathLike[str], plan: ReadPlan) -> None:
    _write_json(dest, PLAN_STATE, {"order": plan.order, "done": plan.done})


def is_cached(dest: str | os.PathLike[str]) -> bool:
    """Whether DEST is served by a staging cache (a stager has published its state there)."""
    return os.path.lexists(cache_dir(dest) / STAGER_STATE)


def touch_heartbeat(dest: str | os.PathLike[str]) -> None:
    """The stager is alive: create or touch DEST/.cache/stager.heartbeat (never through a link)."""
    dir_fd = open_dir(cache_dir(dest), create=True)
    try:
        fd = os.open(HEARTBEAT, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK, 0o666,
                     dir_fd=dir_fd)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)


def heartbeat_age(dest: str | os.PathLike[str], now: float | None = None) -> float | None:
    """Seconds since the stager's last heartbeat; None when there is none (or it is not a regular file)."""
    try:
        st = os.lstat(cache_dir(dest) / HEARTBEAT)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return max(0.0, (time.time() if now is None else now) - st.st_mtime)


class Heartbeat:
    """A thread that touches the heartbeat file every `interval_s` while the stager runs (even while it hashes a
    resumed cache or waits on the network), so a reader can tell a slow stager from a dead one."""

    def __init__(self, dest: str | os.PathLike[str], interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.dest = dest
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stager-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        touch_heartbeat(self.dest)  # before anything is published: a reader never sees a state without one
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            # The main loop reports what is wrong with DEST; a reader sees the heartbeat go stale.
            with contextlib.suppress(OSError, StateFileError):
                touch_heartbeat(self.dest)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=max(1.0, 2 * self.interval_s))


class CacheReader:
    """The reader's side: wait for a shard to be staged, and say which shards come next.

    Every wait has a deadline and re-checks what it waits for: the stager's state (re-read only when it changed),
    the shard's file, and the stager's heartbeat. It fails at once, with one line naming the shard, when the state
    says the shard is ready (or everything is done) but its file is missing, when the stager reported an error, or
    when no stager is running (no heartbeat for `heartbeat_timeout_s`); and it says what it is waiting for while
    it waits."""

    def __init__(self, dest: str | os.PathLike[str], poll_interval_s: float = 0.01,
                 heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
                 notify: Callable[[str], None] | None = None, notice_after_s: float = _FIRST_NOTICE_S) -> None:
        self.dest = Path(dest)
        self.notice_after_s = notice_after_s
        self.poll_interval_s = poll_interval_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.notify = notify or (lambda line: print(line, file=sys.stderr, flush=True))
        self._state = stager_state_file(self.dest)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["notify"] = None  # a lambda does not pickle; a worker prints its own notices
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.notify is None:
            self.notify = lambda line: print(line, file=sys.stderr, flush=True)

    def state(self) -> StagerState | None:
        return self._state.read()

    def ready(self) -> set[str]:
        """Shards present now; an empty set while no stager has published anything."""
        state = self.state()
        return set(state.ready) if state else set()

    def _file_present(self, name: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self.dest / name).st_mode)
        except OSError:
            return False

    def is_ready(self, name: str) -> bool:
        """Whether the shard can be read now. CacheStagerError when it never will be from this stager."""
        state = self.state()
        if state is None:
            return self._file_present(name)
        if state.error:
            raise CacheStagerError(f"{self.dest}: stager failed: {state.error}")
        present = self._file_present(name)
        if name in state.ready:
            if not present:
                raise CacheStagerError(f"{self.dest / name}: the stager lists it as ready ({self._state.path}) but "
                                       "the file is missing or not a regular file")
            return True
        if state.done and state.budget is None:
            raise CacheStagerError(f"{self.dest / name}: the stager is done ({self._state.path}) but did not stage "
                                   "it (missing or not a regular file)")
        return False

    def _check_alive(self, name: str, waited: float) -> None:
        age = heartbeat_age(self.dest)
        if age is None:
            age = waited  # no heartbeat at all: count from the start of this wait
        if age > self.heartbeat_timeout_s:
            raise CacheStagerError(
                f"{self.dest / name}: no stager is running (no heartbeat in {cache_dir(self.dest) / HEARTBEAT} for "
                f"{age:.0f}s; killed, out of memory, or never started?)")

    def wait_ready(self, name: str, timeout: float | None = SHARD_WAIT_S) -> Path:
        """Block until the shard is staged and verified; return its local path.

        Raises TimeoutError after `timeout` seconds (None: SHARD_WAIT_S; every wait has a deadline) and
        CacheStagerError when the stager failed, stopped, or contradicts the files in DEST."""
        timeout = SHARD_WAIT_S if timeout is None else timeout
        started = time.monotonic()
        deadline = started + timeout
        next_notice = started + self.notice_after_s
        while not self.is_ready(name):
            now = time.monotonic()
            waited = now - started
            self._check_alive(name, waited)
            if now >= deadline:
                state = self.state()
                budget = f" (cache budget {state.budget} bytes)" if state and state.budget else ""
                raise TimeoutError(f"{self.dest / name}: not staged after {timeout:g}s{budget}; is the stager "
                                   f"running and its plan ({cache_dir(self.dest) / PLAN_STATE}) up to date?")
            if now >= next_notice:
                state = self.state()
                held = f"{len(state.ready)} shards ready" if state else "no stager state yet"
                self.notify(f"waiting for the stager to stage {self.dest / name} ({held}; {waited:.0f}s of "
                            f"{timeout:g}s)")
                next_notice = now + _NOTICE_EVERY_S
            time.sleep(self.poll_interval_s)
        return self.dest / name

    def write_plan(self, order: Sequence[str], done: bool = False) -> None:
        write_plan(self.dest, ReadPlan(order=list(order), done=done))


class NodeOrder(Protocol):
    """What the feeder needs from the sampler (workloads/data/reading/sampler.py ElasticBatchSampler)."""

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
