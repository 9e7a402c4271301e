"""Image + caption pairs as a records dataset (`pack-captions`): a JSONL/CSV/Parquet table of key,caption[,extra
columns] beside the images, local or s3:// (the images then come through sources.S3Source, as `pack s3://...`),
packed by records_pack.pack_records."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from workloads.data.format.errors import DataToolError
from workloads.data.format.records import FieldSpec
from workloads.data.moving.s3 import RetryPolicy, S3Uri, TransientError, parse_s3_uri, with_retries
from workloads.data.writing.records_pack import (
    Item,
    RecordPackOptions,
    RecordPackResult,
    no_usable_records,
    pack_records,
)
from workloads.data.writing.samples import Decoding, local_samples
from workloads.data.writing.sources import S3Source, SourceOptions
from workloads.data.writing.text import column_name, json_lines, shown_name, table_text

CAPTIONS_MAX_BYTES = 4 << 30  # a caption table larger than this is read in slices by a source, not here

CAPTION_FIELDS = ("key", "caption")


def _read_local_table(path: Path) -> bytes:
    """The bytes of a local caption table: a regular file (a FIFO is never waited on) of at most
    CAPTIONS_MAX_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise DataToolError(str(path), f"cannot read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DataToolError(str(path), "not a regular file")
        if info.st_size > CAPTIONS_MAX_BYTES:
            raise DataToolError(str(path), f"{info.st_size} bytes, more than {CAPTIONS_MAX_BYTES} (split it)")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(CAPTIONS_MAX_BYTES + 1)
    finally:
        os.close(fd)


def _read_s3_table(client: Any, uri: S3Uri, retry: RetryPolicy) -> bytes:
    """The bytes of a caption table in a bucket (at most CAPTIONS_MAX_BYTES; retried like every GET)."""
    def get() -> bytes:
        response = client.get_object(Bucket=uri.bucket, Key=uri.prefix)
        length = int(response.get("ContentLength", 0))
        if length > CAPTIONS_MAX_BYTES:
            raise DataToolError(str(uri), f"{length} bytes, more than {CAPTIONS_MAX_BYTES} (split it)")
        body = bytes(response["Body"].read(CAPTIONS_MAX_BYTES + 1))
        if len(body) != length:
            raise TransientError(f"short body: {len(body)} of {length} bytes")
        return body

    try:
        return with_retries(get, str(uri), retry)
    except DataToolError as exc:
        if exc.why == "object not found":
            raise DataToolError(str(uri), "caption table not found") from None
        raise


def _parse_table(raw: bytes, suffix: str, where: str) -> list[tuple[str, dict[str, Any] | None, str]]:
    """(row name, row, reason) of a JSONL, CSV/TSV or Parquet caption table; a row that cannot be read has None
    and why."""
    if suffix in (".jsonl", ".csv", ".tsv"):
        try:
            text = table_text(raw)
        except ValueError as exc:
            raise DataToolError(where, str(exc)) from None
        if suffix == ".jsonl":
            return _jsonl_rows(text)
        return _csv_rows(text, "\t" if suffix == ".tsv" else ",", where)
    if suffix == ".parquet":
        return _parquet_rows(raw, where)
    raise DataToolError(where, "not a caption table: expected .jsonl, .csv, .tsv or .parquet")


def _jsonl_rows(text: str) -> list[tuple[str, dict[str, Any] | None, str]]:
    rows: list[tuple[str, dict[str, Any] | None, str]] = []
    for number, row, why in json_lines(text):
        if not why and not isinstance(row, dict):
            why = "not a JSON object"
        rows.append((f"line {number}", None if why else row, why))
    return rows


def _csv_rows(text: str, delimiter: str, where: str) -> list[tuple[str, dict[str, Any] | None, str]]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader)
    except StopIteration:
        raise DataToolError(where, "empty (expected a header row: key,caption[,...])") from None
    rows: list[tuple[str, dict[str, Any] | None, str]] = []
    try:
        for values in reader:
            name = f"line {reader.line_num}"
            if not values:
                continue
            if len(values) != len(header):
                rows.append((name, None, f"{len(values)} columns, the header has {len(header)}"))
                continue
            rows.append((name, dict(zip(header, values, strict=True)), ""))
    except csv.Error as exc:
        raise DataToolError(where, f"line {reader.line_num}: {exc}") from None
    return rows


def _parquet_rows(raw: bytes, where: str) -> list[tuple[str, dict[str, Any] | None, str]]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataToolError(where, "reading Parquet needs pyarrow (pip install pyarrow), or give JSONL or CSV") \
            from None
    try:
        table = pq.read_table(pa.BufferReader(raw))
        table = table.rename_columns([column_name(name) for name in table.column_names])
    except (pa.ArrowException, OSError) as exc:
        raise DataToolError(where, f"not a readable Parquet file: {exc}") from None
    return [(f"row {number}", row, "") for number, row in enumerate(table.to_pylist(), start=1)]


def caption_fields(columns: Sequence[str], int_columns: Sequence[str] = ()) -> list[FieldSpec]:
    """image, caption, then each extra column in table order: text, or int for those in `int_columns`."""
    extras = [name for name in columns if name not in CAPTION_FIELDS]
    unknown = sorted(set(int_columns) - set(extras))
    if unknown:
        raise DataToolError("--int", f"{unknown[0]}: not an extra column of the table ({', '.join(extras) or 'none'})")
    fields = [FieldSpec(name="image", type="image"), FieldSpec(name="caption", type="text")]
    for name in extras:
        try:
            fields.append(FieldSpec(name=name, type="int" if name in int_columns else "text"))
        except ValueError:
            raise DataToolError(shown_name(name), "a column name must be letters, digits and _ (it becomes a field)") \
                from None
    return fields


def _relative_key(key: Any) -> tuple[str | None, str]:
    """A key as a POSIX path relative to the table's folder, or None and why."""
    if not isinstance(key, str) or not key:
        return None, "key: not a non-empty string"
    relative = PurePosixPath(key)
    if relative.is_absolute() or ".." in relative.parts or "\\" in key:
        return None, "key: must be a path relative to the table's folder, without '..'"
    return relative.as_posix(), ""


def _inside(base: Path, relative: str) -> str:
    """Why a local key may not be read ('' when it may): a link that leads out of the table's folder."""
    try:
        resolved = (base / relative).resolve()
    except (OSError, RuntimeError) as exc:
        return f"key: cannot resolve: {exc}"
    return "" if resolved.is_relative_to(base.resolve()) else "key: a link out of the table's folder"


def _caption_record(row: Mapping[str, Any], fields: list[FieldSpec]) -> tuple[dict[str, Any] | None, str]:
    missing = [spec.name for spec in fields if spec.name != "image" and spec.name not in row]
    if missing:
        return None, f"{missing[0]}: missing"
    unknown = sorted(set(row) - {spec.name for spec in fields} - {"key"})
    if unknown:
        return None, f"{unknown[0]}: not a column of the first row"
    record: dict[str, Any] = {}
    for spec in fields[1:]:
        value = row[spec.name]
        if spec.type == "int":
            try:
                value = int(value) if isinstance(value, str) else value
            except ValueError:
                return None, f"{spec.name}: not an integer: {value!r}"
        elif spec.name != "caption" and not isinstance(value, str):
            value = json.dumps(value)
        record[spec.name] = value
    return record, ""


def pack_captions(table: str | Path, out: Path, options: RecordPackOptions, int_columns: Sequence[str] = (), *,
                  client: Any = None, source_options: SourceOptions | None = None) -> RecordPackResult:
    """Image + caption pairs: TABLE (a local path, or s3://bucket/path/table.jsonl with `client`) lists key (the
    image's path relative to TABLE's folder), caption and any extra columns (text, or int for `int_columns`). Images
    are converted like the image-folder pack's encoded layout; a row whose image is missing or does not decode is
    left out and named, like every other bad row."""
    remote = isinstance(table, str) and table.startswith("s3://")
    source_options = source_options or SourceOptions()
    bucket_source: S3Source | None = None
    if remote:
        uri = parse_s3_uri(str(table))
        raw = _read_s3_table(client, uri, source_options.retry)
        directory = str(PurePosixPath(uri.prefix).parent).strip(".").strip("/")
        bucket_source = S3Source(client, S3Uri(uri.bucket, directory), source_options)
        where, suffix, base = str(uri), PurePosixPath(uri.prefix).suffix.lower(), Path(".")
    else:
        path = Path(table)
        raw = _read_local_table(path)
        where, suffix, base = str(path), path.suffix.lower(), path.parent
    rows = _parse_table(raw, suffix, where)
    readable = [row for _, row, _ in rows if row is not None]
    if not readable:
        raise no_usable_records(where, [{"path": name, "reason": reason} for name, _, reason in rows])
    fields = caption_fields(list(readable[0]), int_columns)
    if options.shuffle_seed is not None:
        random.Random(options.shuffle_seed).shuffle(rows)
    items: list[Item] = []
    images: list[tuple[str, int]] = []
    for name, row, reason in rows:
        if row is None:
            items.append((name, None, reason))
            continue
        label = f"{name} ({row.get('key')!r})"
        relative, why = _relative_key(row.get("key"))
        if relative is not None and bucket_source is None:
            why = _inside(base, relative)
        record, bad = _caption_record(row, fields) if relative is not None and not why else (None, why)
        if record is None or relative is None:
            items.append((label, None, bad))
            continue
        items.append((label, record, ""))
        images.append((relative, len(items) - 1))
    decode = Decoding(layout="encoded", workers=options.workers)
    decoded = bucket_source.samples(images, decode, {}) if bucket_source is not None \
        else local_samples(base, images, decode)

    def merged() -> Iterator[Item]:
        pending = iter(decoded)
        for label, record, reason in items:
            if record is None:
                yield label, None, reason
                continue
            sample = next(pending)
            if sample.payload is None:
                yield label, None, f"image {sample.relpath}: {sample.reason}"
                continue
            yield label, {"image": sample.payload, **record}, ""

    return pack_records(merged(), fields, out, options, source=where, total=len(items), images_normalized=True)
