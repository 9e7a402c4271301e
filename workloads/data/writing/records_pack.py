"""Pack typed records (records.py) into HDF5 shards + a version-2 manifest, with pack's guarantees.

Three ways in:
  pack_records   any iterable of (key, record) from Python: every declared field of every record, checked
  pack_captions  (captions.py) a JSONL/CSV/Parquet table of key,caption[,extra columns] beside the images
  pack_tokens    (tokens.py) a folder of .npy or Arrow token-id arrays, cut into fixed-length sequences

The same pack engine as the image-folder pack (engine.py), with the records shard writer: shards are written to
hidden temporary files and renamed into place only when all are complete, the manifest last, so an interrupted pack
leaves nothing that looks like a dataset; one pack at a time per OUT; an old dataset in OUT is replaced only with
--force, and only its own shards are deleted. Every input left out is counted in the manifest (`skipped`) and named
with its reason in OUT/pack-report.json (--strict: the first one is the error instead). Same input -> same shards.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from tqdm import tqdm

from workloads.data import TOOL_VERSION
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import (
    FORMAT_NAME,
    Manifest,
)
from workloads.data.format.records import (
    RECORDS_VERSION,
    FieldSpec,
    RecordError,
    check_fields,
    encode_record,
)
from workloads.data.writing.engine import ShardSink, run_pack
from workloads.data.writing.samples import decode_image


@dataclass(frozen=True)
class RecordPackOptions:
    shard_bytes: int = 1 << 30
    workers: int = max(1, (os.cpu_count() or 1))  # image decoding processes (pack_captions)
    strict: bool = False
    force: bool = False
    progress: bool = True
    # pack_captions and pack_tokens: the samples in a seeded permutation of the input order (None: input order)
    shuffle_seed: int | None = 0


@dataclass
class RecordPackResult:
    manifest: Manifest
    skipped: list[dict[str, str]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)  # what the source adds (pack_tokens: the dropped tail)


# A source yields (key, record, reason): the record when it is usable, else None and why not.
Item = tuple[str, Mapping[str, Any] | None, str]


_REASONS_SHOWN = 3  # the commonest reasons a "no usable records" line names
_REASON_CHARS = 200


def no_usable_records(where: str, skipped: Sequence[Mapping[str, str]], filtered: int = 0) -> DataToolError:
    """The error of a pack that found nothing to pack, saying why: how many inputs were left out and for which
    reasons (the commonest first; a reason only one input had names that input), and how many the map hook
    filtered. No pack report is written for a pack that fails, so this line is the report."""
    if not skipped and not filtered:
        return DataToolError(where, "no usable records: the input has no rows")
    counts = Counter(" ".join(str(item["reason"]).split())[:_REASON_CHARS] for item in skipped)
    first: dict[str, str] = {}
    for item in skipped:
        first.setdefault(" ".join(str(item["reason"]).split())[:_REASON_CHARS], item["path"])
    reasons = [f"{count} x {reason}" if count > 1 else f"{first[reason]}: {reason}"
               for reason, count in counts.most_common(_REASONS_SHOWN)]
    more = len(counts) - len(reasons)
    left = f"{len(skipped)} left out" + (f", {filtered} filtered by the map hook" if filtered else "")
    why = "; ".join(reasons) + (f"; and {more} other reason{'s' if more > 1 else ''}" if more > 0 else "")
    return DataToolError(where, f"no usable records ({left})" + (f": {why}" if why else ""))


def normalize_image(raw: bytes) -> bytes:
    """Image bytes as an image field stores them: what the image-folder pack's encoded layout stores
    (samples.decode_image: an upright RGB JPEG that decodes as it is, anything else Pillow opens converted to RGB and
    re-encoded as JPEG quality 95). RecordError with the reason otherwise."""
    sample = decode_image("", 0, raw, "encoded", 0)
    if sample.payload is None:
        raise RecordError(sample.reason)
    return sample.payload


def write_records_shard(path: Path, fields: Sequence[FieldSpec], columns: list[list[Any]]) -> None:
    """One records shard: each field's column as records.py lays it out (same columns -> same bytes)."""
    count = len(columns[0])
    with h5py.File(path, "w", libver=("v110", "v110"), track_order=False) as handle:
        handle.attrs["format"] = FORMAT_NAME
        handle.attrs["format_version"] = RECORDS_VERSION
        handle.attrs["layout"] = "records"
        group = handle.create_group("fields", track_order=False)
        for spec, values in zip(fields, columns, strict=True):
            column = group.create_group(spec.name, track_order=False)
            dtype = spec.numpy_dtype
            if spec.fixed:
                stacked = np.stack(values) if values else np.empty((0, *spec.sample_shape), dtype=dtype)
                column.create_dataset("values", data=stacked.astype(dtype, copy=False), track_times=False)
                continue
            arrays = [np.frombuffer(v, dtype=np.uint8) if isinstance(v, bytes) else v for v in values]
            offsets = np.zeros(count + 1, dtype=np.int64)
            np.cumsum([len(a) for a in arrays], out=offsets[1:])
            data = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype=dtype)
            column.create_dataset("data", data=data, track_times=False)
            column.create_dataset("offsets", data=offsets, track_times=False)
    with open(path, "rb+") as written:
        os.fsync(written.fileno())


def _value_bytes(value: bytes | np.ndarray) -> int:
    return len(value) if isinstance(value, bytes) else int(value.nbytes)


def pack_records(items: Iterable[Item], fields: Sequence[FieldSpec], out: Path, options: RecordPackOptions, *,
                 classes: Sequence[str] = (), source: str = "records", total: int | None = None,
                 report: Mapping[str, Any] | None = None, images_normalized: bool = False) -> RecordPackResult:
    """Write every usable record of `items` (in order) into OUT as a records dataset through the pack engine;
    `source` names the input in errors, `report` is added to the pack report. Image fields go through
    normalize_image unless the source did that already (`images_normalized`)."""
    if options.shard_bytes < 1:
        raise DataToolError("--shard-size", "must be positive")
    try:
        fields = check_fields(fields)
    except ValueError as exc:
        raise DataToolError(source, str(exc)) from None
    skipped: list[dict[str, str]] = []
    extra = dict(report or {})

    def fill(sink: ShardSink) -> tuple[Manifest, dict[str, Any]]:
        images = [] if images_normalized else [spec.name for spec in fields if spec.type == "image"]
        return _fill(sink, _with_images(items, images), fields, options, list(classes), source, total, extra,
                     skipped)

    manifest = run_pack(out, options.force, fill)
    return RecordPackResult(manifest=manifest, skipped=skipped, report=extra)


def _with_images(items: Iterable[Item], images: list[str]) -> Iterator[Item]:
    """Items whose image fields hold normalize_image's bytes; a record whose image does not convert is left out."""
    for key, record, reason in items:
        if record is None or not images:
            yield key, record, reason
            continue
        converted = dict(record)
        try:
            for name in images:
                if isinstance(record.get(name), bytes):  # anything else is named by encode_value
                    converted[name] = normalize_image(record[name])
        except RecordError as exc:
            yield key, None, f"{name}: {exc}"
            continue
        yield key, converted, ""


def _fill(sink: ShardSink, items: Iterable[Item], fields: list[FieldSpec], options: RecordPackOptions,
          classes: list[str], source: str, total: int | None, report: dict[str, Any],
          skipped: list[dict[str, str]]) -> tuple[Manifest, dict[str, Any]]:
    """The records' shards: a shard closes before the record that would take it past shard_bytes, and is written
    by the records shard writer; the manifest and the report."""
    columns: list[list[Any]] = [[] for _ in fields]
    pending = 0

    def flush() -> None:
        nonlocal columns, pending
        sink.add(len(sink.shards), len(columns[0]), lambda temp: write_records_shard(temp, fields, columns))
        columns, pending = [[] for _ in fields], 0

    with tqdm(total=total, unit="rec", desc="pack", disable=None if options.progress else True) as bar:
        for key, record, reason in items:
            bar.update(1)
            values = None
            if record is not None:
                try:
                    values = encode_record(fields, record)
                except RecordError as exc:
                    reason = str(exc)
            if values is None:
                if options.strict:
                    raise DataToolError(f"{source}: {key}", reason)
                skipped.append({"path": key, "reason": reason})
                continue
            size = sum(_value_bytes(value) for value in values)
            if columns[0] and pending + size > options.shard_bytes:
                flush()
            for column, value in zip(columns, values, strict=True):
                column.append(value)
            pending += size
        if columns[0]:
            flush()
    if not sink.shards:
        raise no_usable_records(source, skipped)
    manifest = Manifest(version=RECORDS_VERSION, tool_version=TOOL_VERSION, layout="records", classes=classes,
                        fields=fields, num_samples=sink.first_index, shards=sink.shards, skipped=len(skipped),
                        shuffle_seed=options.shuffle_seed)
    return manifest, {**report, "skipped": skipped}
