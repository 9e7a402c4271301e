"""The pack engine: what every local pack does with the shards its writer produces, whatever they hold.

A pack (pack.py: image folders, format version 1; records_pack.py and records_slices.pack_tables: typed records,
version 2) decides what goes in each shard and writes it with its shard writer; the engine does the rest, the same
for all: one pack at a time per OUT (flock), an old dataset in OUT replaced only with --force and only its own shards
deleted, each shard written to a hidden temporary file, named (never a name the old dataset, a user's file or,
remotely, the current manifest uses for other bytes), optionally handed to a background upload as soon as it
closes (`pack --upload`), and published only when every shard is complete: the shards renamed into place, the
manifest in one atomic rename (with an upload: the remote manifest first), then the pack report. An interrupted
pack therefore leaves nothing that looks like a dataset.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workloads.data.format.errors import DataToolError, is_runtime_oserror
from workloads.data.format.manifest import (
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    atomic_write_bytes,
    fsync_dir,
    load_manifest,
    manifest_bytes,
    shard_name,
    write_manifest,
)
from workloads.data.format.verify import sha256_file

if TYPE_CHECKING:
    from workloads.data.moving.upload import ShardStream

REPORT_NAME = "pack-report.json"
TEMP_SUFFIX = ".partial"


def report_bytes(report: dict[str, Any]) -> bytes:
    """The pack report as written (OUT/pack-report.json, or the bucket's copy): indented JSON and a newline."""
    return (json.dumps(report, indent=2) + "\n").encode()


def prepare_output(out: Path, force: bool) -> set[str]:
    """Create OUT; refuse an existing dataset unless `force`. Returns the shard names the old manifest owns (the only
    files, besides pack's own temporaries, that a pack may ever delete)."""
    if out.exists() and not out.is_dir():
        raise DataToolError(str(out), "exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise DataToolError(str(out), "a parent path is a file, not a directory") from exc
    except NotADirectoryError as exc:
        raise DataToolError(str(out), "a parent path is a file, not a directory") from exc
    manifest = out / MANIFEST_NAME
    old: set[str] = set()
    if manifest.exists() or manifest.is_symlink():
        if not force:
            raise DataToolError(str(out), "already holds a packed dataset (manifest.json); pass --force to replace")
        try:  # the old dataset stays intact and valid until the new manifest replaces it
            old = {shard.path for shard in load_manifest(manifest).shards}
        except (OSError, ValueError):
            old = set()  # unreadable or invalid: its shards are not known, so none is deleted
    return old


def free_name(out: Path, index: int, taken: set[str], usable: Callable[[str], bool] = lambda name: True) -> str:
    """shard-NNNNN.h5, or when that name is in use (an old dataset, a user's file; with --upload also a name the
    remote manifest uses for other bytes: `usable` says no) shard-NNNNN-rK.h5."""
    name, k = shard_name(index), 0
    while name in taken or os.path.lexists(out / name) or not usable(name):
        k += 1
        name = f"shard-{index:05d}-r{k}.h5"
    taken.add(name)
    return name


def write_error(where: Path, exc: OSError) -> DataToolError:
    """The one-line error for a failed write into OUT (runtime when the errno is one of errors.RUNTIME_ERRNOS)."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return DataToolError(str(where), f"cannot write: {why}", runtime=is_runtime_oserror(exc))


def lock_output(out: Path) -> int:
    """One pack at a time per OUT (flock on the directory itself, so no lock file is left behind): a second pack
    would delete the first's temporaries and mix shards."""
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise DataToolError(str(out), "another pack is writing into this directory; wait for it to finish") from exc
    return fd


class ShardSink:
    """Where a pack's shards go: temporary files in OUT, named and (with a stream) uploaded as they close, published
    together by `publish`, removed by `discard` when the pack fails."""

    def __init__(self, out: Path, stream: ShardStream | None = None) -> None:
        self.out = out
        self.stream = stream
        self.keep_local = stream is None or stream.keep_local
        self.shards: list[ShardInfo] = []
        self.first_index = 0  # samples in the shards so far
        self._taken: set[str] = set()
        self._temps: list[Path] = []
        self._published: list[Path] = []

    def add(self, index: int, count: int, write: Callable[[Path], None]) -> ShardInfo:
        """Planned shard `index` of `count` samples: `write` (the pack's shard writer) writes it to a temporary
        file, which is hashed, given its final name and, with a stream, sent."""
        temp = self.out / f".{shard_name(index)}{TEMP_SUFFIX}"
        self._temps.append(temp)
        try:
            write(temp)
        except OSError as exc:
            raise write_error(temp, exc) from exc
        size = temp.stat().st_size
        stream = self.stream
        sha, md5 = stream.hashes(temp) if stream is not None else (sha256_file(temp), "")
        # The final name is fixed now (with --upload it is the object's key): never one the old dataset, a user's
        # file or, remotely, the current manifest uses for other bytes.
        name = free_name(self.out, index, self._taken, (lambda n: stream.usable(n, sha, size)) if stream is not None
                         else (lambda n: True))
        info = ShardInfo(path=name, num_samples=count, first_index=self.first_index, bytes=size, sha256=sha)
        self.shards.append(info)
        if stream is not None:
            stream.send(temp, name, sha, md5, size)  # returns at once unless the uploads in flight are all busy
        self.first_index += count
        return info

    def publish(self, manifest: Manifest, report: dict[str, Any]) -> None:
        """Every shard confirmed (with a stream), renamed into place, then the manifest (remote first), then the
        report. From the manifest's rename on, the new dataset is the dataset."""
        if self.stream is not None:
            self.stream.finish()  # every shard object confirmed in the bucket, or the upload's error
        if self.keep_local:
            for temp, info in zip(self._temps, self.shards, strict=True):
                os.rename(temp, self.out / info.path)
                self._published.append(self.out / info.path)
        try:
            if self.stream is None:
                write_manifest(self.out, manifest)
            else:
                payload = manifest_bytes(manifest)
                self.stream.publish(payload)  # the remote dataset is now the new one
                atomic_write_bytes(self.out / MANIFEST_NAME, payload)  # OUT's record of it
        except OSError as exc:
            raise write_error(self.out / MANIFEST_NAME, exc) from exc
        self._published = []
        fsync_dir(self.out)
        try:
            atomic_write_bytes(self.out / REPORT_NAME, report_bytes(report))
        except OSError as exc:
            raise write_error(self.out / REPORT_NAME, exc) from exc

    def discard(self) -> None:
        """After a failure: no upload reads a temporary any more, and nothing of this pack is left in OUT."""
        if self.stream is not None:
            self.stream.close()
        for temp in self._temps:
            temp.unlink(missing_ok=True)
        for path in self._published:
            path.unlink(missing_ok=True)


def run_pack(out: Path, force: bool, fill: Callable[[ShardSink], tuple[Manifest, dict[str, Any]]],
             stream: ShardStream | None = None) -> Manifest:
    """Pack into OUT: `fill` writes the shards into the sink and returns the manifest and the report; the engine
    publishes them, then deletes the old dataset's shards the new manifest does not name (without --keep-local,
    every one: no new shard is in OUT)."""
    old_names = prepare_output(out, force)
    lock = lock_output(out)
    try:
        for stale in out.glob(f".shard-*{TEMP_SUFFIX}"):  # pack's own temporaries from an interrupted run
            stale.unlink()
        sink = ShardSink(out, stream)
        try:
            manifest, report = fill(sink)
            sink.publish(manifest, report)
        except BaseException:
            sink.discard()
            raise
        names = {info.path for info in manifest.shards}
        for name in sorted(old_names - (names if sink.keep_local else set())):
            (out / name).unlink(missing_ok=True)
        if stream is not None:
            stream.remove_stale(names)
        return manifest
    finally:
        os.close(lock)
