"""Stage a packed dataset from S3 (or an S3-compatible store) onto local disk: a whole copy, or a staging cache.

Copy mode (no budget, no linger) fetches every shard in manifest order and writes manifest.json last: a local
manifest means every shard is here.

Cache mode (a budget, or linger) serves a training reader on the same node through DEST/.cache/ (the protocol is
workloads/data/moving/cache.py). stager.json is written first, then manifest.json (the reader needs it to start). The
stager re-reads the reader's plan.json every poll interval; the shards it wants are the longest prefix of the plan's
distinct shards whose bytes fit the budget (no budget: every shard, the plan's first; no plan yet: manifest order).
It starts downloads for wanted shards in plan order while the bytes it holds (verified shards plus downloads in
flight, counted at full size from the moment they start) plus the next shard fit the budget. Only when a wanted
shard needs space does it evict resident shards the plan does not want (those the plan does not name first, then
the ones it names last): out of "ready", stager.json published, then unlinked. So the shard being read (first in the
plan) is never evicted, and a budget that holds the dataset evicts nothing and fetches nothing twice across epochs.
Without linger it exits once the plan is done (no budget: once every shard is here); with linger it serves until
interrupted (SIGTERM, mapped to KeyboardInterrupt by the CLI). A failure is published as stager.json's "error", so a
waiting reader fails at once.

Every shard is fetched as parallel ranged GETs (one thread pool shared by all shards) written with pwrite into a
hidden temp file. Parts are sized from the bytes that may be in flight at once (the budget, or the whole dataset),
so a budget of two shards, one of them being read, still spreads the next shard over several connections. Parts
wait in the stager's own queue, ordered by how soon the reader needs their shard, and at most `workers` of them are
downloading at once. The shard the reader waits for right now (the plan's first, when it is missing: at the start,
or when the reader caught up) is urgent: it is split over every connection and its parts go out at once on extra
connections, instead of waiting for the parts under way to finish. The temp file is fsynced, checked against
the manifest's sha256 and only then renamed to its final name, so a partial or corrupt file never carries a shard's
name. Throttling (503 SlowDown) and connections dropped mid-body are retried per part with exponential backoff and
jitter; a checksum mismatch re-fetches the whole shard. A rerun resumes: final files whose sha256 matches are kept
(in plan order, up to the budget), stale temp files of the manifest's shards are removed, and a file the manifest
does not name is never touched.
"""


from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tqdm import tqdm

from workloads.data.format.errors import DataToolError, is_runtime_oserror
from workloads.data.format.manifest import (
    MANIFEST_MAX_BYTES,
    MANIFEST_NAME,
    STAGER_STATE,
    Manifest,
    atomic_write_bytes,
    manifest_error,
)
from workloads.data.moving.cache import Heartbeat, ReadPlan, StagerState, cache_dir, write_stager_state
from workloads.data.moving.metrics import StageMetrics
from workloads.data.moving.reader_watch import ReaderWatch, read_checked_plan
from workloads.data.moving.s3 import RetryPolicy, S3Uri, with_retries
from workloads.data.moving.shard_fetch import (
    TEMP_SUFFIX,
    PartFetcher,
    is_verified,
    remove_stale_temps,
)
from workloads.safeio import StateFileError, open_dir

__all__ = ["TEMP_SUFFIX", "ShardStager", "StageOptions", "StageResult", "fetch_manifest", "part_size",
           "read_checked_plan", "run_stager", "stage"]


@dataclass(frozen=True)
class StageOptions:
    workers: int = 16
    part_bytes: int = 16 << 20  # the largest ranged GET; smaller when the budget is small (see part_size)
    # The smallest ranged GET a small budget may split shards into. A budget of a few shards holds one shard being
    # read and one or two arriving: only parts of about budget / (2 x workers) keep every connection busy, and a
    # connection left idle costs more than the extra round trips (S3 answers a range in the time of the range;
    # 8-16 MiB, its advice for large transfers, is what part_bytes gives whenever the budget allows).
    min_part_bytes: int = 1 << 20
    # The staging cache's bound on shard bytes in DEST (verified plus in flight); None: no bound, the whole dataset
    # may stay. A budget (or linger) makes the stager serve the reader's plan (see the module docstring).
    budget_bytes: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    shard_attempts: int = 3  # whole-shard fetches before a persistent checksum mismatch is fatal
    progress: bool = True
    poll_interval_s: float = 0.01  # cache mode: how often the plan is read again and freed space refilled
    # Cache mode: how long to wait for the reader's first plan before fetching in manifest order. Shards fetched
    # before the plan delay the ones the reader needs first (they share the connections) and, with a budget, are
    # mostly evicted unread; a trainer writes its plan seconds after it starts.
    first_plan_wait_s: float = 10.0
    # Serve the plan until interrupted (SIGINT, or SIGTERM mapped to KeyboardInterrupt by the CLI) instead of exiting
    # when the plan is done: a Kubernetes native sidecar that exits is restarted. Without a budget: a whole copy,
    # fetched in plan order, served to the reader as it arrives.
    linger: bool = False
    # Cache mode: give up when the cache is full of shards the reader needs first, the next one waits for space and
    # the plan has not changed for this long (None: wait forever, logging what it waits for).
    wait_timeout_s: float | None = None
    # Cache mode: how often the stager touches DEST/.cache/stager.heartbeat (a reader that sees no heartbeat for a
    # while knows no stager is running, instead of waiting for a shard that will never come).
    heartbeat_interval_s: float = 1.0
    # Where progress, cache occupancy and retries are counted (the CLI serves them); None: a private registry.
    metrics: StageMetrics | None = None


@dataclass
class StageResult:
    manifest: Manifest
    fetched: list[str] = field(default_factory=list)  # every completed download, in order (a shard may repeat)
    kept: list[str] = field(default_factory=list)  # already present and verified (resume)
    evicted: list[str] = field(default_factory=list)  # every eviction, in order
    fetched_bytes: int = 0
    peak_held_bytes: int = 0  # most shard bytes (verified + in flight) held at once


def fetch_manifest(
    client: Any, source: S3Uri, retry: RetryPolicy, on_retry: Callable[[], None] | None = None
) -> tuple[Manifest, bytes]:
    where = f"s3://{source.bucket}/{source.key(MANIFEST_NAME)}"

    def get() -> bytes:
        payload = client.get_object(Bucket=source.bucket, Key=source.key(MANIFEST_NAME))["Body"].read(
            MANIFEST_MAX_BYTES + 1)
        if len(payload) > MANIFEST_MAX_BYTES:
            raise DataToolError(where, f"larger than {MANIFEST_MAX_BYTES} bytes: not a dataset manifest")
        return bytes(payload)

    try:
        payload = with_retries(get, where, retry, on_retry)
    except DataToolError as exc:
        if exc.why == "object not found":
            raise DataToolError(where, "not found: nothing uploaded here, or the upload has not finished") from exc
        raise
    try:
        return Manifest.model_validate_json(payload), payload
    except ValidationError as exc:
        raise DataToolError(where, f"not a dataset manifest: {manifest_error(exc)}") from exc




def part_size(options: StageOptions, in_flight_bytes: int) -> int:
    """The ranged-GET size for a transfer that may have `in_flight_bytes` downloading at once.

    Two parts per worker: one being fetched, one queued behind it. A smaller budget means smaller parts rather
    than idle connections; never below min_part_bytes, never above part_bytes.
    """
    spread = -(-in_flight_bytes // (2 * max(1, options.workers)))
    return max(1, min(options.part_bytes, max(options.min_part_bytes, spread)))


class ShardStager:
    """Fetches a manifest's shards into DEST (see the module docstring); `run_stager` runs it. The stager decides
    what to hold (the budget, the plan's order, evictions) and publishes it; its PartFetcher moves the bytes and its
    ReaderWatch reads the reader's plan and bounds the waits on it."""

    def __init__(self, client: Any, source: S3Uri, dest: Path, manifest: Manifest, options: StageOptions) -> None:
        self.client = client
        self.source = source
        self.dest = dest
        self.manifest = manifest
        self.options = options
        self.budget = options.budget_bytes
        self.serving = self.budget is not None or options.linger
        self.result = StageResult(manifest=manifest)
        self.info = {s.path: s for s in manifest.shards}
        self.names = [s.path for s in manifest.shards]
        self.ready: list[str] = []  # verified and in place, oldest first
        self.held_bytes = 0  # ready plus in flight, at full shard size
        self.finished = False
        self.metrics = options.metrics or StageMetrics()
        self.metrics.dataset(len(manifest.shards), sum(s.bytes for s in manifest.shards), self.budget)
        self.fetcher = PartFetcher(client, dest, self.object_of, workers=options.workers,
                                   min_part_bytes=options.min_part_bytes, part_bytes=options.part_bytes,
                                   retry=options.retry, metrics=self.metrics)
        self.watch = ReaderWatch(dest, self.info, serving=self.serving, poll_interval_s=options.poll_interval_s,
                                 first_plan_wait_s=options.first_plan_wait_s, wait_timeout_s=options.wait_timeout_s)

    @property
    def plan(self) -> ReadPlan | None:
        return self.watch.plan

    def object_of(self, name: str) -> tuple[str, str]:
        """The bucket and key a shard is fetched from."""
        return self.source.bucket, self.source.key(name)

    def publish(self, done: bool = False, error: str | None = None) -> None:
        self.finished = done
        self.metrics.state(ready=len(self.ready), held_bytes=self.held_bytes, done=done)
        if not self.serving:
            return
        try:
            write_stager_state(self.dest, StagerState(budget=self.budget, ready=list(self.ready), done=done,
                                                      error=error))
        except StateFileError as exc:  # DEST/.cache is a link or not a directory: never written through
            raise DataToolError(exc.where, f"cannot hold the cache state: {exc.why}") from exc
        except OSError as exc:
            raise DataToolError(str(cache_dir(self.dest) / STAGER_STATE),
                                f"cannot write the cache state: {exc.strerror or exc}") from exc

    def fail(self, exc: BaseException) -> None:
        """Tell a waiting reader why nothing more will come (best effort: the original error is what counts)."""
        if isinstance(exc, KeyboardInterrupt):
            why = "stopped by SIGTERM or SIGINT"
        else:
            why = str(exc) if isinstance(exc, DataToolError) else f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(DataToolError):
            self.publish(error=why.splitlines()[0] if why else type(exc).__name__)

    def refresh_plan(self, force: bool = False) -> None:
        self.watch.refresh(force)

    def order(self) -> list[str]:
        """Shards in the order the reader will need them: the plan's distinct shards (no plan, or copy mode: the
        manifest's); without a budget every shard the plan does not name follows, in manifest order."""
        if self.plan is None:
            return list(self.names)
        order = list(dict.fromkeys(self.plan.order))
        if self.budget is None:
            named = set(order)
            order += [name for name in self.names if name not in named]
        return order

    def wanted(self, order: list[str]) -> list[str]:
        """The longest prefix of `order` whose bytes fit the budget."""
        if self.budget is None:
            return order
        wanted, used = [], 0
        for name in order:
            used += self.info[name].bytes
            if used > self.budget:
                break
            wanted.append(name)
        return wanted

    def _evict_for(self, size: int, wanted: set[str], order: list[str]) -> None:
        """Evict resident shards outside `wanted` until `size` more bytes fit: first those the plan does not name,
        then the ones it names last (needed latest). Out of "ready" and published before the files go."""
        assert self.budget is not None
        position = {name: index for index, name in enumerate(order)}
        candidates = sorted((name for name in self.ready if name not in wanted),
                            key=lambda name: -position.get(name, len(order)))
        victims, freed = [], 0
        for name in candidates:
            if self.held_bytes - freed + size <= self.budget:
                break
            victims.append(name)
            freed += self.info[name].bytes
        if not victims:
            return
        for name in victims:
            self.ready.remove(name)
        self.publish()
        for name in victims:
            (self.dest / name).unlink(missing_ok=True)
            self.held_bytes -= self.info[name].bytes
            self.result.evicted.append(name)
            self.metrics.shards_evicted.inc()
        # The reader's view did not change since the publish above: only the gauges need the freed bytes.
        self.metrics.state(ready=len(self.ready), held_bytes=self.held_bytes, done=self.finished)

    def step(self, pool: ThreadPoolExecutor, order: list[str]) -> str | None:
        """Evict and start downloads as the plan and the budget allow. Returns the shard that waits for space while
        the cache holds only shards the reader needs first (None: nothing waits, or something is in flight)."""
        if self.plan is not None and self.plan.done:
            return None  # the reader will read nothing more
        if self.watch.starting():
            return None  # the reader is starting: its plan says which shard it needs first
        wanted = self.wanted(order)
        here = set(self.ready) | set(self.fetcher.in_flight)
        first_missing = True
        for name in wanted:
            if name in here:
                continue
            # Enough parts waiting: start no more shards, except the first one the reader lacks (its parts go first).
            if self.fetcher.outstanding_parts >= 2 * self.options.workers and not first_missing:
                return None
            first_missing = False
            size = self.info[name].bytes
            if self.budget is not None and self.held_bytes + size > self.budget:
                self._evict_for(size, set(wanted), order)
                if self.held_bytes + size > self.budget:
                    return name  # in flight downloads hold the space; they finish and are evicted then
            self.held_bytes += size
            self.result.peak_held_bytes = max(self.result.peak_held_bytes, self.held_bytes)
            # The plan's first shard is the one the reader blocks on (at the start, or when it caught up).
            self.fetcher.start(pool, self.info[name], attempt=1, urgent=self.plan is not None and name == order[0])
        if len(wanted) == len(order):
            return None
        following = order[len(wanted)]  # beyond the budget: it waits until the reader moves on
        return None if following in self.ready or following in self.fetcher.in_flight else following

    def is_finished(self) -> bool:
        if self.fetcher.busy:
            return False
        everything = len(self.ready) == len(self.names)
        if not self.serving:
            return everything
        if self.options.linger:
            return False
        return everything if self.budget is None else self.plan is not None and self.plan.done

    def idle_done(self) -> bool:
        """Nothing in flight and nothing more to fetch unless the plan changes (what stager.json's done says)."""
        if self.fetcher.busy:
            return False
        if self.budget is None:
            return len(self.ready) == len(self.names)
        return self.plan is not None and self.plan.done


    def waits_for_reader(self) -> bool:
        """Nothing in flight and nothing to fetch, but the reader has not said it is done: serving, the stager waits
        for the plan to move on (or for a first plan, from a reader that may never come)."""
        return self.serving and not self.fetcher.busy and not (self.plan is not None and self.plan.done)

    def run(self) -> StageResult:
        missing = sum(s.bytes for s in self.manifest.shards if s.path not in self.ready)
        self.fetcher.part_bytes = part_size(self.options, self.budget if self.budget is not None else missing)
        self.result.peak_held_bytes = max(self.result.peak_held_bytes, self.held_bytes)
        bar = tqdm(total=missing if self.budget is None else None, unit="B", unit_scale=True, desc="stage",
                   disable=None if self.options.progress else True)
        poll = self.options.poll_interval_s
        # Twice the workers: the second half carries only urgent parts (see PartFetcher.submit_parts).
        with ThreadPoolExecutor(max_workers=2 * self.options.workers, thread_name_prefix="stage") as pool, bar:
            self.fetcher.bar = bar
            try:
                while True:
                    self.refresh_plan()
                    order = self.order()
                    waiting = self.step(pool, order)
                    self.fetcher.submit_parts(pool, order)
                    if self.is_finished():
                        break
                    if self.fetcher.futures:
                        self.watch.not_waiting()
                        finished, _ = wait(list(self.fetcher.futures), timeout=poll if self.serving else None,
                                           return_when=FIRST_COMPLETED)
                        for future in finished:
                            self._settle(pool, future)
                        continue
                    if waiting is not None:
                        self.watch.wait_for_space(waiting, self.held_bytes, self.budget)
                    elif self.waits_for_reader():
                        self.watch.wait_for_reader()
                    else:
                        self.watch.not_waiting()
                    if self.idle_done() != self.finished:
                        self.publish(done=self.idle_done())
                    time.sleep(poll)
            except BaseException as exc:
                self.fetcher.aborted.set()
                pool.shutdown(wait=True, cancel_futures=True)
                self.fetcher.discard_temps()
                self.fail(exc)
                if not (isinstance(exc, KeyboardInterrupt) and self.options.linger):
                    raise
                return self.result  # a lingering sidecar is stopped this way when its pod ends
        self.publish(done=True)
        return self.result

    def _settle(self, pool: ThreadPoolExecutor, future: Future) -> None:
        settled = self.fetcher.settle(pool, future)
        if settled is None:
            return
        fetch, verified = settled
        name = fetch.info.path
        if verified:
            self.ready.append(name)
            self.result.fetched.append(name)
            self.result.fetched_bytes += fetch.info.bytes
            self.metrics.shards_staged.inc()
            self.publish()
            return
        if fetch.attempt >= self.options.shard_attempts:
            raise DataToolError("s3://{}/{}".format(*self.object_of(name)),
                                f"sha256 does not match the manifest after {fetch.attempt} downloads", runtime=True)
        self.metrics.mismatches.inc()
        self.fetcher.start(pool, fetch.info, attempt=fetch.attempt + 1)

    # -- resume ---------------------------------------------------------------------------------------------------
    def resume(self) -> None:
        """Keep verified shards already in DEST, in the order the reader needs them, up to the budget; remove the
        others the manifest names. The plan is read first, so the shards kept are the ones it wants."""
        self.refresh_plan(force=True)
        order = list(dict.fromkeys(self.order() + self.names))
        present = [self.info[name] for name in order if (self.dest / name).is_file()]
        with ThreadPoolExecutor(max_workers=self.options.workers) as pool:  # hash in parallel
            verified = list(pool.map(lambda s: is_verified(self.dest / s.path, s), present))
        for info, ok in zip(present, verified, strict=True):
            if ok and (self.budget is None or self.held_bytes + info.bytes <= self.budget):
                self.ready.append(info.path)
                self.result.kept.append(info.path)
                self.held_bytes += info.bytes
            else:
                (self.dest / info.path).unlink(missing_ok=True)


def stage(client: Any, source: S3Uri, dest: Path, options: StageOptions) -> StageResult:
    metrics = options.metrics or StageMetrics()
    options = replace(options, metrics=metrics)
    manifest, manifest_bytes = fetch_manifest(client, source, options.retry, metrics.retries.inc)
    check_budget(manifest, options.budget_bytes)
    return run_stager(ShardStager(client, source, dest, manifest, options), {MANIFEST_NAME: manifest_bytes})


def run_stager(stager: ShardStager, manifests: dict[str, bytes]) -> StageResult:
    """Run a stager in its DEST: copy mode, or cache mode with a heartbeat; `manifests` (paths relative to DEST ->
    bytes) are written once every shard is here (copy) or once the kept shards are published (cache). One stager
    per DEST: a second one (another pod's, or a second PackedData.open on the node) is refused with one line while
    the first holds DEST's lock (flock, released when its process ends, however it ends)."""
    with _only_stager(stager.dest):
        return _run_stager(stager, manifests)


@contextlib.contextmanager
def _only_stager(dest: Path) -> Iterator[None]:
    import fcntl

    try:
        dest.mkdir(parents=True, exist_ok=True)
        fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise DataToolError(str(dest), f"cannot prepare the staging directory: {exc.strerror}",
                            runtime=is_runtime_oserror(exc)) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DataToolError(str(dest), "another stager is staging into this folder (one stager per folder: "
                                           "two would evict and publish each other's shards)") from None
        yield
    finally:
        os.close(fd)


def _run_stager(stager: ShardStager, manifests: dict[str, bytes]) -> StageResult:
    dest, options = stager.dest, stager.options
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for folder in sorted({str(Path(name).parent) for name in stager.names}):
            (dest / folder).mkdir(parents=True, exist_ok=True)
            remove_stale_temps(dest / folder, [Path(name).name for name in stager.names
                                                if str(Path(name).parent) == folder])
        if not stager.serving:
            for name in manifests:  # copy mode: a local manifest means "all shards here"
                (dest / name).unlink(missing_ok=True)
            _remove_cache_state(dest)  # nor may a reader trust the ready list of an earlier cache run
    except StateFileError as exc:
        raise DataToolError(exc.where, f"cannot hold the cache state: {exc.why}") from exc
    except OSError as exc:
        raise DataToolError(str(dest), f"cannot prepare the staging directory: {exc.strerror}",
                            runtime=is_runtime_oserror(exc)) from exc
    if not stager.serving:
        stager.resume()
        result = stager.run()
        for name, payload in manifests.items():
            atomic_write_bytes(dest / name, payload)
        return result
    try:
        heartbeat = Heartbeat(dest, options.heartbeat_interval_s).__enter__()
    except StateFileError as exc:
        raise DataToolError(exc.where, f"cannot hold the cache state: {exc.why}") from exc
    except OSError as exc:
        raise DataToolError(str(cache_dir(dest)), f"cannot write the stager's heartbeat: {exc.strerror or exc}",
                            runtime=is_runtime_oserror(exc)) from exc
    try:
        try:
            # First of all: nothing is ready (a stale stager.json, or a copy's manifest.json without one, must not let
            # a reader start on files this run has not verified yet).
            stager.publish()
            stager.resume()
            # The reader needs the manifest to start; stager.json, written first, says which shards are present.
            stager.publish()
            for name, payload in manifests.items():
                atomic_write_bytes(dest / name, payload)
        except BaseException as exc:
            stager.fail(exc)
            raise
        return stager.run()
    finally:
        heartbeat.__exit__(None, None, None)


def _remove_cache_state(dest: Path) -> None:
    """Remove DEST/.cache/stager.json of an earlier cache run, never through a link (`.cache` must be a directory
    in DEST, or absent)."""
    try:
        dir_fd = open_dir(cache_dir(dest))
    except FileNotFoundError:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(STAGER_STATE, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def check_budget(manifest: Manifest, budget: int | None) -> None:
    """A budget must hold the largest shard (--budget names what it cannot hold)."""
    if budget is not None:
        largest = max(manifest.shards, key=lambda s: s.bytes, default=None)
        if largest is not None and largest.bytes > budget:
            raise DataToolError("--budget", f"{budget} bytes cannot hold {largest.path} "
                                            f"({largest.bytes} bytes); use a budget of at least the largest shard")
