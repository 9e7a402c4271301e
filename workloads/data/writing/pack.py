"""Pack an image folder (one sub-folder per class, as torchvision's ImageFolder) into HDF5 shards + a manifest.

Images are decoded in a process pool (results consumed in input order, so output does not depend on scheduling),
cut into the shards the shard plan fixes from the listing alone (shardplan.py), and each shard is written by the
image-folder shard writer (format version 1); what happens to a shard then (temporary file, name, upload, publish,
the old dataset) is the pack engine's (engine.py), the same as for typed records.

Same input, same Pillow/h5py versions -> byte-identical shards: sorted then seeded-shuffled input, fixed attributes,
no timestamps.

With a ShardStream (`pack --upload`) each shard is handed to a background upload as soon as it is closed and its
local file deleted once the object is confirmed (unless keep_local), so local disk holds a bounded number of shards;
the remote manifest is published only after every shard object is confirmed, then OUT gets its manifest and report.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np
from tqdm import tqdm

from workloads.data import TOOL_VERSION
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import FORMAT_NAME, FORMAT_VERSION, Layout, Manifest
from workloads.data.writing.engine import REPORT_NAME, TEMP_SUFFIX, ShardSink, run_pack
from workloads.data.writing.samples import Decoding, Sample, local_samples
from workloads.data.writing.shardplan import plan_shards

if TYPE_CHECKING:
    from workloads.data.moving.upload import ShardStream, StreamResult
    from workloads.data.writing.sources import S3Source

__all__ = ["REPORT_NAME", "TEMP_SUFFIX", "PackOptions", "PackResult", "list_images", "ordered_listing", "pack",
           "skip_sample", "source_samples", "write_image_folder_shard"]


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


def write_image_folder_shard(path: Path, layout: Layout, size: int, payloads: list[bytes], labels: list[int]) -> None:
    """The image-folder shard writer (format version 1): images (decoded: (n, S, S, 3) uint8; encoded: data +
    offsets) and labels, contiguous and unfiltered, no timestamps (same samples -> same bytes)."""
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
    skipped: list[dict[str, str]] = []

    def fill(sink: ShardSink) -> tuple[Manifest, dict[str, Any]]:
        samples = source_samples(source, files, options, sizes)
        return _fill(sink, source, options, classes, samples, starts, len(files), skipped)

    try:
        if stream is not None:
            stream.open()  # endpoint, credentials, bucket and the current remote manifest: before OUT is touched
        manifest = run_pack(out, options.force, fill, stream)
    finally:
        if stream is not None:
            stream.close()
    return PackResult(manifest=manifest, skipped=skipped, upload=stream.result if stream is not None else None)


def _fill(sink: ShardSink, source: Path | S3Source, options: PackOptions, classes: list[str],
          samples: Iterator[Sample], starts: list[int], total: int,
          skipped: list[dict[str, str]]) -> tuple[Manifest, dict[str, Any]]:
    """The image folder's shards: the samples in pack's order, cut at the planned boundaries (shardplan), each
    planned shard written by the version-1 shard writer; the manifest and the report."""
    payloads: list[bytes] = []
    labels: list[int] = []
    all_labels: list[int] = []
    planned = 0  # the planned shard (shardplan) being filled: its number names it

    def flush() -> None:
        nonlocal payloads, labels
        sink.add(planned, len(labels),
                 lambda temp: write_image_folder_shard(temp, options.layout, options.image_size, payloads, labels))
        all_labels.extend(labels)
        payloads, labels = [], []

    with tqdm(total=total, unit="img", desc="pack", disable=None if options.progress else True) as bar:
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
    if not sink.shards:
        raise DataToolError(_where(source), f"no usable images ({len(skipped)} skipped)")
    _check_classes(classes, all_labels, source)
    manifest = Manifest(tool_version=TOOL_VERSION, layout=options.layout,
                        image_size=options.image_size if options.layout == "decoded" else None,
                        classes=classes, num_samples=sink.first_index, shards=sink.shards, skipped=len(skipped),
                        shuffle_seed=options.shuffle_seed)
    return manifest, {"skipped": skipped}
