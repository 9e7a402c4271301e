"""Pack an image folder (one sub-folder per class, as torchvision's ImageFolder) into HDF5 shards + a manifest.

Images are decoded in a process pool (results consumed in input order, so output does not depend on scheduling)
and written shard by shard to hidden temporary files; only when every shard is complete are they renamed into
place, the manifest last. An interrupted pack therefore leaves nothing that looks like a dataset.

Same input, same Pillow/h5py versions -> byte-identical shards: sorted then seeded-shuffled input, fixed attributes,
no timestamps.

With a ShardStream (`pack --upload`) each shard is handed to a background upload as soon as it is closed and its
local file deleted once the object is confirmed (unless keep_local), so local disk holds a bounded number of shards;
the remote manifest is published only after every shard object is confirmed, then OUT gets its manifest and report.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np
from tqdm import tqdm

from workloads.data import TOOL_VERSION
from workloads.data.format.errors import DataToolError, is_runtime_oserror
from workloads.data.format.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_NAME,
    Layout,
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
from workloads.data.writing.samples import Decoding, Sample, local_samples
from workloads.data.writing.shardplan import plan_shards

if TYPE_CHECKING:
    from workloads.data.moving.upload import ShardStream, StreamResult
    from workloads.data.writing.sources import S3Source

REPORT_NAME = "pack-report.json"
TEMP_SUFFIX = ".partial"


@dataclass(frozen=True)
class PackOptions:
    layout: Layout = "decoded"
    image_size: int = 256
    shard_bytes: int = 1 << 30
    workers: int = max(1, (os.cpu_count() or 1))
    strict: bool = False
    force: bool = False
    progress: bool = True
    # Interleave the classes (a seeded permutation of the sorted list) so that any run of shards, such as a rolling
    # window or one shuffled block, holds every class; None keeps the sorted (class, path) order.
    shuffle_seed: int | None = 0

    @property
    def decoding(self) -> Decoding:
        return Decoding(layout=self.layout, image_size=self.image_size, workers=self.workers)


@dataclass
class PackResult:
    manifest: Manifest
    skipped: list[dict[str, str]] = field(default_factory=list)
    upload: StreamResult | None = None  # pack --upload: what was sent, skipped, removed; peak local bytes


def list_images(source: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """Classes (sorted sub-folder names) and every regular file below them as (relative path, label)."""
    if not source.is_dir():
        raise DataToolError(str(source), "not a readable directory")
    try:
        classes = sorted(entry.name for entry in source.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    except OSError as exc:
        raise DataToolError(str(source), f"cannot list: {exc.strerror}") from exc
    if not classes:
        raise DataToolError(str(source), "no class sub-folders (expected SRC/<class>/<image files>)")
    files: list[tuple[str, int]] = []
    for label, name in enumerate(classes):
        for root, dirs, names in os.walk(source / name):
            dirs.sort()
            for filename in sorted(names):
                if not filename.startswith("."):
                    files.append(((Path(root) / filename).relative_to(source).as_posix(), label))
    return classes, sorted(files, key=lambda item: (item[1], item[0]))


def _batches(payloads: list[bytes], limit: int = 64 << 20) -> Iterator[tuple[int, list[bytes]]]:
    """(index of first sample, samples) runs of at most ~limit bytes, so a shard is copied in bounded pieces."""
    start, run_bytes = 0, 0
    run: list[bytes] = []
    for index, payload in enumerate(payloads):
        if run and run_bytes + len(payload) > limit:
            yield start, run
            start, run, run_bytes = index, [], 0
        run.append(payload)
        run_bytes += len(payload)
    if run:
        yield start, run


def _write_shard(path: Path, layout: Layout, size: int, payloads: list[bytes], labels: list[int]) -> None:
    with h5py.File(path, "w", libver=("v110", "v110"), track_order=False) as handle:
        handle.attrs["format"] = FORMAT_NAME
        handle.attrs["format_version"] = FORMAT_VERSION
        handle.attrs["layout"] = layout
        if layout == "decoded":
            images = handle.create_dataset("images", shape=(len(payloads), size, size, 3), dtype=np.uint8,
                                           track_times=False)
            for first, run in _batches(payloads):
                pixels = np.frombuffer(b"".join(run), dtype=np.uint8).reshape(len(run), size, size, 3)
                images[first:first + len(run)] = pixels
        else:
            offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in payloads], out=offsets[1:])
            data = handle.create_dataset("data", shape=(int(offsets[-1]),), dtype=np.uint8, track_times=False)
            for first, run in _batches(payloads):
                data[offsets[first]:offsets[first + len(run)]] = np.frombuffer(b"".join(run), dtype=np.uint8)
            handle.create_dataset("offsets", data=offsets, track_times=False)
        handle.create_dataset("labels", data=np.asarray(labels, dtype=np.int64), track_times=False)
    with open(path, "rb+") as written:
        os.fsync(written.fileno())


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


def _where(source: Path | S3Source, relpath: str = "") -> str:
    """What an error names: the source, or a file in it (a path, or an s3:// URI)."""
    if isinstance(source, Path):
        return str(source / relpath) if relpath else str(source)
    return source.where(relpath) if relpath else str(source)


def skip_sample(source: Path | S3Source, sample: Sample, strict: bool, skipped: list[dict[str, str]]) -> None:
    """An unusable sample: a line of the skip report, or with --strict the error that stops the pack."""
    if strict:
        raise DataToolError(_where(source, sample.relpath), sample.reason)
    skipped.append({"path": sample.relpath, "reason": sample.reason})


def _check_classes(classes: list[str], labels: Iterator[int] | list[int], source: Path | S3Source) -> None:
    counts = [0] * len(classes)
    for label in labels:
        counts[label] += 1
    empty = [name for name, count in zip(classes, counts, strict=True) if count == 0]
    if empty:
        raise DataToolError(_where(source, empty[0]), f"class folder has no usable images ({len(empty)} such: "
                                                   f"{', '.join(empty[:5])}); remove it or add images, "
                                                   "since an empty class shifts every label")


def ordered_listing(source: Path | S3Source, options: PackOptions,
                    ) -> tuple[list[str], list[tuple[str, int]], dict[str, int]]:
    """(classes, files in pack's order, listed sizes): the listing, checked (no empty class), then permuted."""
    if isinstance(source, Path):
        classes, files = list_images(source)
        sizes = {}
        for relpath, _ in files:
            try:
                sizes[relpath] = os.lstat(source / relpath).st_size
            except OSError:
                sizes[relpath] = 0  # gone since the listing: the read reports it
    else:
        listing = source.list_images()
        classes, files, sizes = listing.classes, list(listing.files), listing.sizes
    _check_classes(classes, [label for _, label in files], source)
    if options.shuffle_seed is not None:
        random.Random(options.shuffle_seed).shuffle(files)
    return classes, files, sizes


def source_samples(source: Path | S3Source, files: list[tuple[str, int]], options: PackOptions,
                   sizes: dict[str, int]) -> Iterator[Sample]:
    """Decoded samples of `files` in their order, from a folder or an s3:// source."""
    decoding = options.decoding
    return local_samples(source, files, decoding) if isinstance(source, Path) \
        else source.samples(files, decoding, sizes)


def pack(source: Path | S3Source, out: Path, options: PackOptions, stream: ShardStream | None = None) -> PackResult:
    """Pack SRC (a folder, or an s3:// source) into OUT; with `stream`, upload each shard as it closes and publish
    the dataset remotely too."""
    if options.image_size < 1:
        raise DataToolError("--size", "must be a positive number of pixels")
    if options.shard_bytes < 1:
        raise DataToolError("--shard-size", "must be positive")
    classes, files, sizes = ordered_listing(source, options)
    starts = plan_shards(files, sizes, options.layout, options.image_size, options.shard_bytes)
    try:
        if stream is not None:
            stream.open()  # endpoint, credentials, bucket and the current remote manifest: before OUT is touched
        old_names = prepare_output(out, options.force)
        lock = lock_output(out)
        try:
            for stale in out.glob(f".shard-*{TEMP_SUFFIX}"):  # pack's own temporaries from an interrupted run
                stale.unlink()
            return _pack_locked(source, out, options, classes, source_samples(source, files, options, sizes),
                                starts, len(files), old_names, stream)
        finally:
            os.close(lock)
    finally:
        if stream is not None:
            stream.close()


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


def _pack_locked(source: Path | S3Source, out: Path, options: PackOptions, classes: list[str],
                 samples: Iterator[Sample], starts: list[int], total: int, old_names: set[str],
                 stream: ShardStream | None) -> PackResult:

    keep_local = stream is None or stream.keep_local
    taken: set[str] = set()
    shards: list[ShardInfo] = []
    temp_paths: list[Path] = []
    published: list[Path] = []
    skipped: list[dict[str, str]] = []
    payloads: list[bytes] = []
    labels: list[int] = []
    all_labels: list[int] = []
    first_index = 0
    planned = 0  # the planned shard (shardplan) being filled: its number names it

    def flush() -> None:
        nonlocal payloads, labels, first_index
        index = planned
        temp = out / f".{shard_name(index)}{TEMP_SUFFIX}"
        temp_paths.append(temp)
        try:
            _write_shard(temp, options.layout, options.image_size, payloads, labels)
        except OSError as exc:
            raise write_error(temp, exc) from exc
        size = temp.stat().st_size
        sha, md5 = stream.hashes(temp) if stream is not None else (sha256_file(temp), "")
        # The final name is fixed now (with --upload it is the object's key): never one the old dataset, a user's
        # file or, remotely, the current manifest uses for other bytes.
        name = free_name(out, index, taken, (lambda n: stream.usable(n, sha, size)) if stream is not None
                          else (lambda n: True))
        shards.append(ShardInfo(path=name, num_samples=len(labels), first_index=first_index, bytes=size,
                                sha256=sha))
        if stream is not None:
            stream.send(temp, name, sha, md5, size)  # returns at once unless the uploads in flight are all busy
        first_index += len(labels)
        all_labels.extend(labels)
        payloads, labels = [], []

    try:
        bar = tqdm(total=total, unit="img", desc="pack", disable=None if options.progress else True)
        with bar:
            boundaries = set(starts[1:])
            for position, sample in enumerate(samples):
                if position in boundaries:
                    if payloads:
                        flush()
                    planned += 1
                bar.update(1)
                if sample.payload is None:
                    skip_sample(source, sample, options.strict, skipped)
                    continue
                payloads.append(sample.payload)
                labels.append(sample.label)
            if payloads:
                flush()
        if not shards:
            raise DataToolError(_where(source), f"no usable images ({len(skipped)} skipped)")
        _check_classes(classes, all_labels, source)
        if stream is not None:
            stream.finish()  # every shard object confirmed in the bucket, or the upload's error
        # Publish: the final names chosen above (never one the old dataset or anyone else uses), then the manifest
        # in one atomic rename (with --upload: the remote manifest first), then the old dataset's shards that the
        # new manifest does not name.
        if keep_local:
            for temp, info in zip(temp_paths, shards, strict=True):
                os.rename(temp, out / info.path)
                published.append(out / info.path)
        manifest = Manifest(tool_version=TOOL_VERSION, layout=options.layout,
                            image_size=options.image_size if options.layout == "decoded" else None,
                            classes=classes, num_samples=first_index, shards=shards, skipped=len(skipped),
                            shuffle_seed=options.shuffle_seed)
        try:
            if stream is None:
                write_manifest(out, manifest)
            else:
                payload = manifest_bytes(manifest)
                stream.publish(payload)  # the remote dataset is now the new one
                atomic_write_bytes(out / MANIFEST_NAME, payload)  # OUT's record of it
        except OSError as exc:
            raise write_error(out / MANIFEST_NAME, exc) from exc
        published = []  # from here on the new dataset is the dataset
        fsync_dir(out)
        try:
            atomic_write_bytes(out / REPORT_NAME, (json.dumps({"skipped": skipped}, indent=2) + "\n").encode())
        except OSError as exc:
            raise write_error(out / REPORT_NAME, exc) from exc
    except BaseException:
        if stream is not None:
            stream.close()  # no upload reads a temporary any more, nothing more is sent
        for temp in temp_paths:
            temp.unlink(missing_ok=True)
        for path in published:
            path.unlink(missing_ok=True)
        raise
    names = {info.path for info in manifest.shards}
    # Without --keep-local no new shard is in OUT: every shard of the old local dataset goes.
    for name in sorted(old_names - (names if keep_local else set())):
        (out / name).unlink(missing_ok=True)
    if stream is not None:
        stream.remove_stale(names)
    return PackResult(manifest=manifest, skipped=skipped, upload=stream.result if stream is not None else None)


