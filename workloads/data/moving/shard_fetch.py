"""Fetching a shard as parallel ranged GETs into a hidden temp file: the stager's transfer half (stage.py).

Parts wait in the fetcher's own queue, ordered by how soon the reader needs their shard, and at most `workers` of
them are downloading at once; the parts of an urgent shard (the one the reader waits for right now) go out at once
on extra connections. Each part is written with pwrite; the shard's sha256 is computed over the contiguous prefix of
finished parts as they land; the temp file is fsynced, checked against the manifest and only then renamed to its
final name. What to fetch, and when, is the stager's (stage.py); this module only moves bytes.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import ShardInfo, fsync_dir, sha256_file
from workloads.data.moving.metrics import StageMetrics
from workloads.data.moving.s3 import RetryPolicy, TransientError, with_retries

TEMP_SUFFIX = ".part"
_BODY_CHUNK = 1 << 20
_HASH_BLOCK = 8 << 20


@dataclass
class ShardFetch:
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
    urgent: bool = False  # the reader waits for this shard now: its parts take the extra connections
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



class PartFetcher:
    """The shards in flight: their temp files, the parts waiting for a connection and the futures of those under
    way (one thread pool, shared by every shard, that the stager owns and passes in)."""

    def __init__(self, client: Any, dest: Path, object_of: Callable[[str], tuple[str, str]], *, workers: int,
                 min_part_bytes: int, part_bytes: int, retry: RetryPolicy, metrics: StageMetrics) -> None:
        self.client = client
        self.dest = dest
        self.object_of = object_of  # a shard's bucket and key
        self.workers = workers
        self.min_part_bytes = min_part_bytes
        self.part_bytes = part_bytes  # set by the stager's run() from what may be in flight
        self.retry = retry
        self.metrics = metrics
        self.in_flight: dict[str, ShardFetch] = {}
        self.outstanding_parts = 0  # parts of shards in flight not finished yet (pending or submitted)
        self.pending: list[tuple[ShardFetch, int, int]] = []  # parts waiting for a connection
        self.submitted_parts = 0
        self.futures: dict[Future, tuple[str, ShardFetch]] = {}
        self.fetches: list[ShardFetch] = []
        self.bar_lock = threading.Lock()
        self.bar: tqdm | None = None
        self.aborted = threading.Event()

    @property
    def busy(self) -> bool:
        """Parts under way or waiting for a connection."""
        return bool(self.futures or self.pending)

    # -- pieces run in the pool -------------------------------------------------------------------------------
    def fetch_part(self, fetch: ShardFetch, start: int, end: int) -> int:
        bucket, key = self.object_of(fetch.info.path)
        expected = end - start + 1

        def attempt() -> int:
            if self.aborted.is_set():
                raise DataToolError(key, "cancelled after another part failed", runtime=True)
            response = self.client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")
            offset = start
            for chunk in response["Body"].iter_chunks(_BODY_CHUNK):
                if offset + len(chunk) > end + 1:
                    raise TransientError(f"server sent more than the {expected} bytes asked for")
                pwrite_all(fetch.fd, chunk, offset, fetch.temp)
                offset += len(chunk)
            if offset != end + 1:
                raise TransientError(f"short body: {offset - start} of {expected} bytes")
            return expected

        got = with_retries(attempt, f"s3://{bucket}/{key}", self.retry,
                           on_retry=self.metrics.retries.inc)
        self.metrics.bytes.inc(got)
        fetch.part_done(start, end + 1)
        if self.bar is not None:
            with self.bar_lock:
                self.bar.update(got)
        return got

    def finish(self, fetch: ShardFetch) -> bool:
        hashed, digest = fetch.sha256_when_hashed()  # before closing: the hashing thread reads through fd
        try:
            os.fsync(fetch.fd)
        except OSError as exc:
            raise named_error(exc, fetch.temp) from exc
        finally:
            os.close(fetch.fd)
            fetch.fd = -1
        if not hashed == fetch.info.bytes == fetch.temp.stat().st_size or digest != fetch.info.sha256:
            fetch.temp.unlink()
            return False
        final = self.dest / fetch.info.path
        os.replace(fetch.temp, final)
        fsync_dir(final.parent)
        return True

    def start(self, pool: ThreadPoolExecutor, info: ShardInfo, attempt: int, urgent: bool = False) -> None:
        """Create the temp file and queue the shard's parts. An urgent shard (the reader waits for it now) is split
        over every connection, down to min_part_bytes, so it arrives in the time of one small part."""
        final = self.dest / info.path  # a mixture's shards sit in one folder per source (mixture_stage.py)
        temp = final.parent / f".{final.name}.{os.getpid()}.{attempt}{TEMP_SUFFIX}"
        fd = os.open(temp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, info.bytes)
        except OSError as exc:
            os.close(fd)
            temp.unlink(missing_ok=True)
            raise named_error(exc, temp) from exc
        step = self.part_bytes
        if urgent:
            step = min(step, max(self.min_part_bytes, -(-info.bytes // self.workers)))
        ranges = [(start, min(start + step, info.bytes) - 1) for start in range(0, info.bytes, step)]
        fetch = ShardFetch(info=info, temp=temp, fd=fd, parts_left=len(ranges), attempt=attempt, urgent=urgent)
        self.fetches.append(fetch)
        self.in_flight[info.path] = fetch
        if not ranges:
            self.futures[pool.submit(self.finish, fetch)] = ("finish", fetch)
        self.pending.extend((fetch, start, end) for start, end in ranges)
        self.outstanding_parts += len(ranges)

    def submit_parts(self, pool: ThreadPoolExecutor, order: list[str]) -> None:
        """Hand waiting parts to the pool, those of the shard the reader needs first first: at most `workers` at
        once (the coordinator refills as each finishes), plus the parts of an urgent shard, which go out at once on
        the pool's other `workers` threads: a reader that just started, or caught up, does not wait for the parts
        already under way to finish."""
        if not self.pending:
            return
        rank = {name: index for index, name in enumerate(order)}
        self.pending.sort(key=lambda part: (not part[0].urgent, rank.get(part[0].info.path, len(rank)), part[1]))
        while self.pending and (self.pending[0][0].urgent or self.submitted_parts < self.workers):
            fetch, start, end = self.pending.pop(0)
            self.futures[pool.submit(self.fetch_part, fetch, start, end)] = ("part", fetch)
            self.submitted_parts += 0 if fetch.urgent else 1

    def discard_temps(self) -> None:
        for fetch in self.fetches:
            if fetch.fd >= 0:
                os.close(fetch.fd)
            fetch.temp.unlink(missing_ok=True)

    def settle(self, pool: ThreadPoolExecutor, future: Future) -> tuple[ShardFetch, bool] | None:
        """Account for a finished future: a part (None; the shard's last part queues its finish), or a shard's
        finish, (the fetch, whether it verified). A verified shard leaves in_flight; a failed one is the caller's."""
        kind, fetch = self.futures.pop(future)
        outcome = future.result()  # re-raises DataToolError from the part that gave up
        if kind == "part":
            self.outstanding_parts -= 1
            self.submitted_parts -= 0 if fetch.urgent else 1
            fetch.parts_left -= 1
            if fetch.parts_left == 0:
                self.futures[pool.submit(self.finish, fetch)] = ("finish", fetch)
            return None
        self.fetches.remove(fetch)
        if outcome:
            del self.in_flight[fetch.info.path]
        return fetch, bool(outcome)


def pwrite_all(fd: int, data: bytes, offset: int, path: Path) -> None:
    """pwrite may write less than asked (a file system close to full does); the next call then raises ENOSPC.
    An OSError names `path`."""
    view = memoryview(data)
    try:
        while view:
            written = os.pwrite(fd, view, offset)
            if written == 0:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            view = view[written:]
            offset += written
    except OSError as exc:
        raise named_error(exc, path) from exc


def named_error(exc: OSError, path: Path) -> OSError:
    """`exc` with the file it concerns (an fd-level call's error carries no file name)."""
    if exc.filename is not None:
        return exc
    return OSError(exc.errno, exc.strerror or str(exc), str(path))


def is_verified(path: Path, info: ShardInfo) -> bool:
    return path.is_file() and path.stat().st_size == info.bytes and sha256_file(path) == info.sha256


def remove_stale_temps(dest: Path, names: list[str]) -> None:
    """Temp files an earlier run left for the manifest's shards (`.<shard>.<pid>.<attempt>.part`); nothing else."""
    pattern = re.compile(r"^\.(.+)\.[0-9]+\.[0-9]+" + re.escape(TEMP_SUFFIX) + "$")
    shards = set(names)
    for entry in os.scandir(dest):
        match = pattern.match(entry.name)
        if match and match.group(1) in shards and not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.path)
