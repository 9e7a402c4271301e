"""Pack typed records (records.py) into HDF5 shards + a version-2 manifest, with pack's guarantees.

Three ways in:
  pack_records   any iterable of (key, record) from Python: every declared field of every record, checked
  pack_captions  a JSONL/CSV/Parquet table of key,caption[,extra columns] beside the images (image + caption
                 pairs), local or s3:// (the images then come through sources.S3Source, as `pack s3://...`)
  pack_tokens    a folder of .npy token-id arrays, concatenated and cut into fixed-length sequences

Same guarantees as the image-folder pack (pack.py, whose output handling this reuses): shards are written to hidden
temporary files and renamed into place only when all are complete, the manifest last, so an interrupted pack leaves
nothing that looks like a dataset; one pack at a time per OUT; an old dataset in OUT is replaced only with --force,
and only its own shards are deleted. Every input left out is counted in the manifest (`skipped`) and named with its
reason in OUT/pack-report.json (--strict: the first one is the error instead). Same input -> same shards.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import h5py
import numpy as np
from tqdm import tqdm

from workloads.data import TOOL_VERSION
from workloads.data.format.documents import DOC_OFFSETS_FIELD, sequence_offsets
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import (
    FORMAT_NAME,
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    atomic_write_bytes,
    fsync_dir,
    shard_name,
    write_manifest,
)
from workloads.data.format.records import (
    RECORDS_VERSION,
    FieldSpec,
    RecordError,
    check_fields,
    encode_record,
)
from workloads.data.format.verify import sha256_file
from workloads.data.moving.s3 import RetryPolicy, S3Uri, TransientError, parse_s3_uri, with_retries
from workloads.data.writing.pack import (
    REPORT_NAME,
    TEMP_SUFFIX,
    free_name,
    lock_output,
    prepare_output,
    write_error,
)
from workloads.data.writing.samples import Decoding, decode_image, local_samples
from workloads.data.writing.sources import S3Source, SourceOptions

CAPTIONS_MAX_BYTES = 4 << 30  # a caption table larger than this is read in slices by a source, not here
TOKEN_SUFFIX = ".npy"
# Arrow IPC files (file or stream format, as Hugging Face datasets caches them): a list-of-integers column, one
# document per row.
ARROW_SUFFIX = ".arrow"
ARROW_COLUMN = "input_ids"


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
    """Write every usable record of `items` (in order) into OUT as a records dataset; `source` names the input in
    errors, `report` is added to the pack report. Image fields go through normalize_image unless the source did
    that already (`images_normalized`)."""
    if options.shard_bytes < 1:
        raise DataToolError("--shard-size", "must be positive")
    try:
        fields = check_fields(fields)
    except ValueError as exc:
        raise DataToolError(source, str(exc)) from None
    old_names = prepare_output(out, options.force)
    lock = lock_output(out)
    try:
        for stale in out.glob(f".shard-*{TEMP_SUFFIX}"):
            stale.unlink()
        images = [] if images_normalized else [spec.name for spec in fields if spec.type == "image"]
        return _pack_locked(_with_images(items, images), fields, out, options, list(classes), source, total,
                            dict(report or {}), old_names)
    finally:
        os.close(lock)


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


def _pack_locked(items: Iterable[Item], fields: list[FieldSpec], out: Path, options: RecordPackOptions,
                 classes: list[str], source: str, total: int | None, report: dict[str, Any],
                 old_names: set[str]) -> RecordPackResult:
    taken: set[str] = set()
    shards: list[ShardInfo] = []
    temp_paths: list[Path] = []
    published: list[Path] = []
    skipped: list[dict[str, str]] = []
    columns: list[list[Any]] = [[] for _ in fields]
    pending = 0
    first_index = 0

    def flush() -> None:
        nonlocal columns, pending, first_index
        index = len(shards)
        temp = out / f".{shard_name(index)}{TEMP_SUFFIX}"
        temp_paths.append(temp)
        try:
            write_records_shard(temp, fields, columns)
        except OSError as exc:
            raise write_error(temp, exc) from exc
        count = len(columns[0])
        name = free_name(out, index, taken)
        shards.append(ShardInfo(path=name, num_samples=count, first_index=first_index, bytes=temp.stat().st_size,
                                sha256=sha256_file(temp)))
        first_index += count
        columns, pending = [[] for _ in fields], 0

    try:
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
        if not shards:
            raise DataToolError(source, f"no usable records ({len(skipped)} skipped)")
        for temp, info in zip(temp_paths, shards, strict=True):
            os.rename(temp, out / info.path)
            published.append(out / info.path)
        manifest = Manifest(version=RECORDS_VERSION, tool_version=TOOL_VERSION, layout="records", classes=classes,
                            fields=fields, num_samples=first_index, shards=shards, skipped=len(skipped),
                            shuffle_seed=options.shuffle_seed)
        try:
            write_manifest(out, manifest)
        except OSError as exc:
            raise write_error(out / MANIFEST_NAME, exc) from exc
        published = []
        fsync_dir(out)
        try:
            atomic_write_bytes(out / REPORT_NAME, (json.dumps({**report, "skipped": skipped}, indent=2) + "\n")
                               .encode())
        except OSError as exc:
            raise write_error(out / REPORT_NAME, exc) from exc
    except BaseException:
        for temp in temp_paths:
            temp.unlink(missing_ok=True)
        for path in published:
            path.unlink(missing_ok=True)
        raise
    for name in sorted(old_names - {info.path for info in manifest.shards}):
        (out / name).unlink(missing_ok=True)
    return RecordPackResult(manifest=manifest, skipped=skipped, report=report)


# -- image + caption pairs ---------------------------------------------------------------------------------------

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
    if suffix == ".jsonl":
        return _jsonl_rows(raw)
    if suffix in (".csv", ".tsv"):
        return _csv_rows(raw, "\t" if suffix == ".tsv" else ",", where)
    if suffix == ".parquet":
        return _parquet_rows(raw, where)
    raise DataToolError(where, "not a caption table: expected .jsonl, .csv, .tsv or .parquet")


def _jsonl_rows(raw: bytes) -> list[tuple[str, dict[str, Any] | None, str]]:
    # surrogateescape keeps bytes that are not UTF-8 visible: the caption holding them is refused (named) by its
    # field, not the whole table.
    rows: list[tuple[str, dict[str, Any] | None, str]] = []
    for number, line in enumerate(raw.decode("utf-8", errors="surrogateescape").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            rows.append((f"line {number}", None, f"not JSON: {exc.msg}"))
            continue
        if not isinstance(row, dict):
            rows.append((f"line {number}", None, "not a JSON object"))
            continue
        rows.append((f"line {number}", row, ""))
    return rows


def _csv_rows(raw: bytes, delimiter: str, where: str) -> list[tuple[str, dict[str, Any] | None, str]]:
    text = raw.decode("utf-8", errors="surrogateescape")
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
            raise DataToolError(name, "a column name must be letters, digits and _ (it becomes a field)") from None
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
        raise DataToolError(where, "no rows")
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


# -- pre-tokenized corpora ---------------------------------------------------------------------------------------

def _arrow_documents(path: Path, name: str, column: str) -> list[tuple[str, np.ndarray]]:
    """The rows of an Arrow IPC file's list-of-integers `column`, memory-mapped: (name#row, 1-D ids). Raises
    ValueError (the reason) for a file that is not one; a null row is a document of no ids."""
    try:
        import pyarrow as pa
    except ImportError:
        raise DataToolError(str(path), "reading Arrow needs pyarrow (pip install pyarrow), or give .npy files") \
            from None
    try:
        source = pa.memory_map(str(path))  # the arrays below keep it open; nothing is read until they are used
        try:
            table = pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"not a readable Arrow IPC file: {exc}") from None
    if column not in table.column_names:
        raise ValueError(f"no column {column!r} (columns: {', '.join(table.column_names) or 'none'}); "
                         "name it with --arrow-column")
    values = table.column(column).combine_chunks()
    kind = values.type
    if not ((pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)):
        raise ValueError(f"column {column!r} is {kind}, expected a list of integer token ids per row")
    if values.values.null_count:  # a null inside a row's list has no id to give
        raise ValueError(f"column {column!r} has null ids inside rows")
    ids = values.values.to_numpy()  # the child array, zero-copy from the map; offsets index into it as they are
    offsets = values.offsets.to_numpy()
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    return [(f"{name}#{row}", ids[offsets[row]:offsets[row + 1]] if valid[row] else ids[:0])
            for row in range(len(values))]


def _token_documents(source: Path, dtype: np.dtype[Any], arrow_column: str = ARROW_COLUMN,
                     ) -> tuple[list[tuple[str, np.ndarray]], list[dict[str, str]]]:
    """Every .npy file (one document) and .arrow file (a document per row of `arrow_column`) below SOURCE, in
    sorted relative-path order and an Arrow file's rows in order, memory-mapped: (name, 1-D ids); and the files or
    rows left out with why (not 1-D integers, ids outside the dtype, unreadable)."""
    if not source.is_dir():
        raise DataToolError(str(source), "not a readable directory")
    names = sorted(path.relative_to(source).as_posix() for path in source.rglob("*")
                   if path.suffix in (TOKEN_SUFFIX, ARROW_SUFFIX)
                   and not any(part.startswith(".") for part in path.relative_to(source).parts))
    documents: list[tuple[str, np.ndarray]] = []
    bad: list[dict[str, str]] = []
    info = np.iinfo(dtype)
    for name in names:
        path = source / name
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                bad.append({"path": name, "reason": "not a regular file"})
                continue
            if path.suffix == ARROW_SUFFIX:
                found = _arrow_documents(path, name, arrow_column)
            else:
                found = [(name, np.load(path, mmap_mode="r", allow_pickle=False))]
        except (OSError, ValueError, EOFError) as exc:
            reason = str(exc) if path.suffix == ARROW_SUFFIX else f"not a readable .npy array: {exc}"
            bad.append({"path": name, "reason": reason})
            continue
        for document, ids in found:
            if ids.dtype.kind not in "iu" or ids.ndim != 1:
                bad.append({"path": document, "reason": f"{ids.dtype} array of shape {list(ids.shape)}, expected "
                                                        "1-D integer token ids"})
            elif ids.size and (int(ids.min()) < info.min or int(ids.max()) > info.max):
                bad.append({"path": document,
                            "reason": f"token ids {int(ids.min())}..{int(ids.max())} do not fit {dtype}"})
            else:
                documents.append((document, ids))
    return documents, bad


def pack_tokens(source: Path, out: Path, options: RecordPackOptions, *, seq_len: int, dtype: str = "uint16",
                eos: int | None = None, arrow_column: str = ARROW_COLUMN, doc_offsets: bool = False,
                ) -> RecordPackResult:
    """Pre-tokenized documents as fixed-length sequences in field "tokens": SOURCE/**/*.npy (1-D integer ids, one
    document each) and SOURCE/**/*.arrow (Arrow IPC, a document per row of the list-of-integers `arrow_column`,
    e.g. a Hugging Face datasets cache file's input_ids).

    The packing rule: documents in sorted relative-path order (an Arrow file's rows in row order), each followed by
    `eos` when given, are concatenated
    into one stream, which is cut into consecutive sequences of exactly `seq_len` ids (a sequence may span
    documents; none overlaps another). The stream's tail of fewer than seq_len ids is dropped and its length is in
    the pack report (`dropped_tail_tokens`). The sequences are then stored in a seeded permutation (shuffle_seed).
    doc_offsets: also store each sequence's document segment starts (field "doc_offsets", documents.py)."""
    spec = FieldSpec(name="tokens", type="tokens", dtype=dtype, length=seq_len)
    fields = [spec, FieldSpec(name=DOC_OFFSETS_FIELD, type="tokens", dtype="uint32")] if doc_offsets else [spec]
    target = spec.numpy_dtype
    if eos is not None and not np.iinfo(target).min <= eos <= np.iinfo(target).max:
        raise DataToolError("--eos", f"{eos} does not fit {target}")
    documents, bad = _token_documents(source, target, arrow_column)
    if options.strict and bad:
        raise DataToolError(str(source / bad[0]["path"]), bad[0]["reason"])
    pieces = [ids for _, ids in documents]
    if eos is not None:
        pieces = [part for ids in pieces for part in (ids, np.asarray([eos], dtype=target))]
    ends = np.cumsum([len(part) for part in pieces], dtype=np.int64)
    document_ends = ends[1::2] if eos is not None else ends  # a document ends after its eos
    stream_tokens = int(ends[-1]) if len(ends) else 0
    count = stream_tokens // seq_len
    order = list(range(count))
    if options.shuffle_seed is not None:
        random.Random(options.shuffle_seed).shuffle(order)

    def sequence(index: int) -> np.ndarray:
        start, stop = index * seq_len, (index + 1) * seq_len
        out_ids = np.empty(seq_len, dtype=target)
        part = int(np.searchsorted(ends, start, side="right"))
        filled = 0
        while filled < seq_len:
            begin = int(ends[part - 1]) if part else 0
            take = min(stop - start - filled, int(ends[part]) - (start + filled))
            offset = start + filled - begin
            out_ids[filled:filled + take] = pieces[part][offset:offset + take]
            filled += take
            part += 1
        return out_ids

    def items() -> Iterator[Item]:
        for entry in bad:
            yield entry["path"], None, entry["reason"]
        for index in order:
            record = {"tokens": sequence(index)}
            if doc_offsets:
                record[DOC_OFFSETS_FIELD] = sequence_offsets(document_ends, index * seq_len, (index + 1) * seq_len)
            yield f"sequence {index}", record, ""

    report = {"seq_len": seq_len, "documents": len(documents), "stream_tokens": stream_tokens,
              "sequences": count, "dropped_tail_tokens": stream_tokens - count * seq_len, "eos": eos}
    if count == 0:
        raise DataToolError(str(source), f"{stream_tokens} usable token ids, fewer than one sequence of {seq_len} "
                                         f"({len(bad)} files left out)")
    return pack_records(items(), fields, out, options, source=str(source), total=count + len(bad), report=report)
