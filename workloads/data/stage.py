"""Stage a packed dataset from S3 (or an S3-compatible store) onto local disk.

Copy mode fetches every shard; window mode (window_bytes set) keeps at most that many bytes of shards in DEST,
fetching ahead in manifest order and deleting shards the reader has marked consumed (see window.py).

Every shard is fetched as parallel ranged GETs (one thread pool shared by all shards) written with pwrite into a
hidden temp file. Parts are sized from the bytes that may be in flight at once (the window, or the whole dataset in
copy mode), so a window of two shards, one of them being read, still spreads the next shard over several
connections; up to two parts per worker are queued, so no connection waits for its next request. The temp file is
fsynced, checked against the manifest's sha256 and only then renamed to its final name, so a partial or corrupt
file never carries a shard's name. Throttling (503 SlowDown) and connections dropped mid-body
are retried per part with exponential backoff and jitter; a checksum mismatch re-fetches the whole shard. A rerun
resumes: final files whose sha256 matches are kept, stale temp files are removed.

In copy mode manifest.json is written last (a local manifest means every shard is here); in window mode it is
written first, right after .window/stager.json, which then says which shards are present.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from tqdm import tqdm

from workloads.data.format import (
    MANIFEST_NAME,
    READER_STATE,
    WINDOW_DIR,
    Manifest,
    ShardInfo,
    atomic_write_bytes,
    fsync_dir,
    manifest_error,
)
from workloads.data.metrics import StageMetrics
from workloads.data.s3 import DataToolError, RetryPolicy, S3Uri, TransientError, with_retries
from workloads.data.verify import sha256_file
from workloads.data.window import StagerState, write_stager_state
from workloads.data.window import read_consumed as _read_consumed

TEMP_SUFFIX = ".part"
_BODY_CHUNK = 1 << 20
_HASH_BLOCK = 8 << 20


@dataclass(frozen=True)
class StageOptions:
    workers: int = 16
    part_bytes: int = 16 << 20  # the largest ranged GET; smaller when the window is small (see part_size)
    # The smallest ranged GET a small window may split shards into. Smaller parts keep more connections busy, but
    # every request costs a round trip and server work; 8 MiB is S3's own advice for ranged GETs, and on the local
    # benchmark path (moto reads the whole object for each ranged GET) 2 and 4 MiB parts lost to 8 MiB ones.
    min_part_bytes: int = 8 << 20
    window_bytes: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    shard_attempts: int = 3  # whole-shard fetches before a persistent checksum mismatch is fatal
    progress: bool = True
    poll_interval_s: float = 0.01  # window mode: how soon a consumed shard's space is refilled
    # Window mode: after every shard is staged, keep deleting consumed shards until interrupted (SIGINT, or SIGTERM
    # mapped to KeyboardInterrupt by the CLI) instead of exiting: a native sidecar that exits is restarted.
    linger: bool = False
    # Window mode: give up when the window is full and the reader has consumed nothing for this long (None: forever).
    wait_timeout_s: float | None = None
    # Where progress, window occupancy and retries are counted (the CLI serves them); None: a private registry.
    metrics: StageMetrics | None = None


@dataclass
class StageResult:
    manifest: Manifest
    fetched: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)  # already present and verified (resume)
    fetched_bytes: int = 0
    peak_window_bytes: int = 0  # most shard bytes (final + temp) held at once


def fetch_manifest(
    client: Any, source: S3Uri, retry: RetryPolicy, on_retry: Callable[[], None] | None = None
) -> tuple[Manifest, bytes]:
    where = f"s3://{source.bucket}/{source.key(MANIFEST_NAME)}"

    def get() -> bytes:
        return client.get_object(Bucket=source.bucket, Key=source.key(MANIFEST_NAME))["Body"].read()

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


@dataclass
class _ShardFetch:
    """One download of one shard; its sha256 is computed over the contiguous prefix of finished parts as they land,
    so hashing overlaps the transfer instead of re-reading the whole file at the end."""

    info: ShardInfo
    temp: Path
    fd: int
    parts_left: int
    attempt: int
    lock: threading.Condition = field(default_factory=threading.Condition)
    digest: Any = field(default_factory=hashlib.sha256)
    hashed_to: int = 0
    finished_parts: dict[int, int] = field(default_factory=dict)  # start -> end (exclusive) of parts not yet hashed
    hashing: bool = False

    def part_done(self, start: int, end: int) -> None:
        """Record a finished part; the first thread to find the prefix extended hashes it, others return at once."""
        with self.lock:
            self.finished_parts[start] = end
            if self.hashing:
                return
            self.hashing = True
        while True:
            with self.lock:
                stop = self.finished_parts.pop(self.hashed_to, None)
                if stop is None:
                    self.hashing = False
                    self.lock.notify_all()
                    return
                begin = self.hashed_to
            for offset in range(begin, stop, _HASH_BLOCK):
                self.digest.update(os.pread(self.fd, min(_HASH_BLOCK, stop - offset), offset))
            with self.lock:
                self.hashed_to = stop

    def sha256_when_hashed(self) -> tuple[int, str]:
        """(bytes hashed, hex digest) once no thread is still hashing; call after every part has finished."""
        with self.lock:
            self.lock.wait_for(lambda: not self.hashing)
            return self.hashed_to, self.digest.hexdigest()


def part_size(options: StageOptions, in_flight_bytes: int) -> int:
    """The ranged-GET size for a transfer that may have `in_flight_bytes` downloading at once.

    Two parts per worker: one being fetched, one queued behind it. A smaller window means smaller parts rather
    than idle connections; never below min_part_bytes, never above part_bytes.
    """
    spread = -(-in_flight_bytes // (2 * max(1, options.workers)))
    return max(1, min(options.part_bytes, max(options.min_part_bytes, spread)))


class _Stager:
    def __init__(self, client: Any, source: S3Uri, dest: Path, manifest: Manifest, options: StageOptions) -> None:
        self.client = client
        self.source = source
        self.dest = dest
        self.manifest = manifest
        self.options = options
        self.windowed = options.window_bytes is not None
        self.result = StageResult(manifest=manifest)
        self._bytes_of = {s.path: s.bytes for s in manifest.shards}
        self.ready: list[str] = []
        self.deleted: set[str] = set()
        self.held_bytes = 0
        self.outstanding_parts = 0
        self.part_bytes = options.part_bytes  # set by run() from what may be in flight
        self.futures: dict[Future, tuple[str, _ShardFetch]] = {}
        self.fetches: list[_ShardFetch] = []
        self.bar_lock = threading.Lock()
        self.bar: tqdm | None = None
        self.aborted = threading.Event()
        self.finished = False
        self.metrics = options.metrics or StageMetrics()
        self.metrics.dataset(len(manifest.shards), sum(s.bytes for s in manifest.shards), options.window_bytes)

    # -- pieces run in the pool -------------------------------------------------------------------------------
    def _fetch_part(self, fetch: _ShardFetch, start: int, end: int) -> int:
        key = self.source.key(fetch.info.path)
        expected = end - start + 1

        def attempt() -> int:
            if self.aborted.is_set():
                raise DataToolError(key, "cancelled after another part failed")
            response = self.client.get_object(Bucket=self.source.bucket, Key=key, Range=f"bytes={start}-{end}")
            offset = start
            for chunk in response["Body"].iter_chunks(_BODY_CHUNK):
                if offset + len(chunk) > end + 1:
                    raise TransientError(f"server sent more than the {expected} bytes asked for")
                _pwrite_all(fetch.fd, chunk, offset)
                offset += len(chunk)
            if offset != end + 1:
                raise TransientError(f"short body: {offset - start} of {expected} bytes")
            return expected

        got = with_retries(attempt, f"s3://{self.source.bucket}/{key}", self.options.retry,
                           on_retry=self.metrics.retries.inc)
        self.metrics.bytes.inc(got)
        fetch.part_done(start, end + 1)
        if self.bar is not None:
            with self.bar_lock:
                self.bar.update(got)
        return got

    def _finish(self, fetch: _ShardFetch) -> bool:
        hashed, digest = fetch.sha256_when_hashed()  # before closing: the hashing thread reads through fd
        os.fsync(fetch.fd)
        os.close(fetch.fd)
        fetch.fd = -1
        if not hashed == fetch.info.bytes == fetch.temp.stat().st_size or digest != fetch.info.sha256:
            fetch.temp.unlink()
            return False
        os.replace(fetch.temp, self.dest / fetch.info.path)
        fsync_dir(self.dest)
        return True

    # -- coordination (main thread only) ----------------------------------------------------------------------
    def _start_fetch(self, pool: ThreadPoolExecutor, info: ShardInfo, attempt: int) -> None:
        temp = self.dest / f".{info.path}.{os.getpid()}.{attempt}{TEMP_SUFFIX}"
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, info.bytes)
        step = self.part_bytes
        ranges = [(start, min(start + step, info.bytes) - 1) for start in range(0, info.bytes, step)]
        fetch = _ShardFetch(info=info, temp=temp, fd=fd, parts_left=len(ranges), attempt=attempt)
        self.fetches.append(fetch)
        if not ranges:
            self.futures[pool.submit(self._finish, fetch)] = ("finish", fetch)
        for start, end in ranges:
            self.futures[pool.submit(self._fetch_part, fetch, start, end)] = ("part", fetch)
        self.outstanding_parts += len(ranges)

    def publish(self, done: bool = False, error: str | None = None) -> None:
        self.finished = done
        self._report()
        if self.windowed:
            write_stager_state(self.dest, StagerState(order=[s.path for s in self.manifest.shards],
                                                      ready=list(self.ready), done=done, error=error))

    def _report(self) -> None:
        on_disk = set(self.ready) - self.deleted
        self.metrics.state(ready=len(on_disk), consumed=len(self.deleted), held_bytes=self.held_bytes,
                           done=self.finished)

    _waiting_since: float | None = None

    def _wait_for_reader(self, next_shard: ShardInfo | None) -> None:
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
            consumed = len(self.deleted)
            print(f"stage: window full ({self.held_bytes} of {self.options.window_bytes} bytes); waiting for the "
                  f"reader to mark shards consumed in {self.dest / WINDOW_DIR / READER_STATE} before fetching "
                  f"{next_shard.path if next_shard else 'more'} ({consumed} consumed so far)",
                  file=sys.stderr, flush=True)
        timeout = self.options.wait_timeout_s
        if timeout is not None and now - self._waiting_since > timeout:
            raise DataToolError(str(self.dest / WINDOW_DIR / READER_STATE),
                                f"the reader consumed no shard for {timeout:g}s while the window was full "
                                f"(--wait-timeout); is the training container reading {self.dest}?")
        time.sleep(self.options.poll_interval_s)

    def _release_consumed(self) -> None:
        for name in sorted((read_consumed(self.dest) & set(self.ready)) - self.deleted):
            self._waiting_since = None
            (self.dest / name).unlink(missing_ok=True)
            self.deleted.add(name)
            self.held_bytes -= self._bytes_of[name]
            self._report()

    def _fits(self, info: ShardInfo) -> bool:
        if self.outstanding_parts >= 2 * self.options.workers:
            return False
        return not self.windowed or self.held_bytes + info.bytes <= (self.options.window_bytes or 0)

    def run(self, pending: list[ShardInfo]) -> StageResult:
        queue = list(pending)
        in_flight = self.options.window_bytes if self.windowed else sum(s.bytes for s in pending)
        self.part_bytes = part_size(self.options, in_flight or 0)
        self.publish()
        bar = tqdm(total=sum(s.bytes for s in pending), unit="B", unit_scale=True, desc="stage",
                   disable=None if self.options.progress else True)
        with ThreadPoolExecutor(max_workers=self.options.workers, thread_name_prefix="stage") as pool, bar:
            self.bar = bar
            try:
                while queue or self.futures:
                    if self.windowed:
                        self._release_consumed()
                    while queue and self._fits(queue[0]):
                        info = queue.pop(0)
                        self.held_bytes += info.bytes
                        self.result.peak_window_bytes = max(self.result.peak_window_bytes, self.held_bytes)
                        self._start_fetch(pool, info, attempt=1)
                    if not self.futures:
                        self._wait_for_reader(queue[0] if queue else None)  # the window is full, nothing consumed
                        continue
                    self._waiting_since = None
                    timeout = self.options.poll_interval_s if self.windowed else None
                    finished, _ = wait(list(self.futures), timeout=timeout, return_when=FIRST_COMPLETED)
                    for future in finished:
                        self._settle(pool, future)
            except BaseException as exc:
                self.aborted.set()
                pool.shutdown(wait=True, cancel_futures=True)
                self._discard_temps()
                self.publish(error=str(exc) if isinstance(exc, DataToolError) else f"{type(exc).__name__}: {exc}")
                raise
        self.publish(done=True)
        if self.windowed and self.options.linger:
            try:
                while True:
                    self._release_consumed()
                    time.sleep(self.options.poll_interval_s)
            except KeyboardInterrupt:
                pass
        return self.result

    def _settle(self, pool: ThreadPoolExecutor, future: Future) -> None:
        kind, fetch = self.futures.pop(future)
        outcome = future.result()  # re-raises DataToolError from the part that gave up
        if kind == "part":
            self.outstanding_parts -= 1
            fetch.parts_left -= 1
            if fetch.parts_left == 0:
                self.futures[pool.submit(self._finish, fetch)] = ("finish", fetch)
            return
        self.fetches.remove(fetch)
        name = fetch.info.path
        if outcome:
            self.ready.append(name)
            self.result.fetched.append(name)
            self.result.fetched_bytes += fetch.info.bytes
            self.metrics.shards_staged.inc()
            self.publish()
            return
        if fetch.attempt >= self.options.shard_attempts:
            raise DataToolError(f"s3://{self.source.bucket}/{self.source.key(name)}",
                                f"sha256 does not match the manifest after {fetch.attempt} downloads")
        self.metrics.mismatches.inc()
        self._start_fetch(pool, fetch.info, attempt=fetch.attempt + 1)

    def _discard_temps(self) -> None:
        for fetch in self.fetches:
            if fetch.fd >= 0:
                os.close(fetch.fd)
            fetch.temp.unlink(missing_ok=True)


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """pwrite may write less than asked (a file system close to full does); the next call then raises ENOSPC."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[written:]
        offset += written


def read_consumed(dest: Path) -> set[str]:
    """The reader's consumed list; a broken reader.json is a one-line error, not a traceback."""
    try:
        return _read_consumed(dest)
    except ValueError as exc:
        where, _, why = str(exc).partition(": ")
        raise DataToolError(where, why or str(exc)) from exc


def _is_verified(path: Path, info: ShardInfo) -> bool:
    return path.is_file() and path.stat().st_size == info.bytes and sha256_file(path) == info.sha256


def stage(client: Any, source: S3Uri, dest: Path, options: StageOptions) -> StageResult:
    metrics = options.metrics or StageMetrics()
    options = replace(options, metrics=metrics)
    manifest, manifest_bytes = fetch_manifest(client, source, options.retry, metrics.retries.inc)
    if options.window_bytes is not None:
        largest = max(manifest.shards, key=lambda s: s.bytes, default=None)
        if largest is not None and largest.bytes > options.window_bytes:
            raise DataToolError("--window", f"{options.window_bytes} bytes cannot hold {largest.path} "
                                            f"({largest.bytes} bytes); use a window of at least the largest shard")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        for stale in dest.glob(f".*{TEMP_SUFFIX}"):
            stale.unlink()
        if options.window_bytes is None:
            (dest / MANIFEST_NAME).unlink(missing_ok=True)  # copy mode: a local manifest means "all shards here"
    except OSError as exc:
        raise DataToolError(str(dest), f"cannot prepare the staging directory: {exc.strerror}") from exc

    # reader.json is written by another container: only names this manifest gives may ever be deleted.
    names = {s.path for s in manifest.shards}
    consumed = read_consumed(dest) & names if options.window_bytes is not None else set()
    stager = _Stager(client, source, dest, manifest, options)
    todo = [s for s in manifest.shards if s.path not in consumed]
    for name in consumed:
        (dest / name).unlink(missing_ok=True)
    with ThreadPoolExecutor(max_workers=options.workers) as pool:  # resume: hash what is already here in parallel
        verified = list(pool.map(lambda s: _is_verified(dest / s.path, s), todo))
    pending: list[ShardInfo] = []
    for info, ok in zip(todo, verified, strict=True):
        if ok:
            stager.ready.append(info.path)
            stager.result.kept.append(info.path)
            stager.held_bytes += info.bytes
        else:
            (dest / info.path).unlink(missing_ok=True)
            pending.append(info)
    stager.deleted |= consumed
    if options.window_bytes is not None:
        # The reader needs the manifest to start; in window mode stager.json, written first, says what is present.
        stager.publish()
        atomic_write_bytes(dest / MANIFEST_NAME, manifest_bytes)
    result = stager.run(pending)
    if options.window_bytes is None:
        atomic_write_bytes(dest / MANIFEST_NAME, manifest_bytes)
    return result
