"""Records packed from tables in slices: `pack-tables SRC OUT|s3://DEST` (Parquet, Arrow IPC, JSONL, npy).

    pack-tables SRC OUT --fields F.json [--map mod:fn]                   a local pack
    pack-tables SRC s3://DEST ... --shard-index I --shard-count N        slice I (default $JOB_COMPLETION_INDEX) of N
    pack-tables SRC s3://DEST ... --publish                              the manifest, once every shard is in

The plan comes from the listing of SRC (tables.py: sorted relative paths) and each table's row counts, read from its
footer or header (never the whole table): the rows laid end to end in that order are cut into shards of
`shard_rows` rows, so shard k holds the same rows, and so the same bytes, whoever packs it: a local pack, or slice
i of N for any N (slice i owns shards [i K / N, (i + 1) K / N)). The plan's digest covers the listing, the row
counts, the fields, the shard size, the image columns and the map hook's source, so records of another plan are
never taken for this one's.

Per row, in plan order: every image column's value (a key under --images, default SRC) is fetched (a missing or
unreadable image leaves the row out, named with why), the map hook runs (maphook.py: None filters the row out; an
exception leaves it out, named), and the record is encoded with the declared fields (an image stored as
records_pack.normalize_image stores it). A shard's rows are the only ones in memory, besides one row group or record
batch of the table being read. The slices' publish step is the image pack's (slices.py): shard objects with their
sha256 and a record each under DEST/.pack/<plan>/, the manifest last, byte-identical to a local pack of the same
SRC and options; a killed slice rerun repacks only the shards whose record and object do not agree.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from workloads.data import TOOL_VERSION
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import (
    Manifest,
    ShardInfo,
    manifest_bytes,
    shard_name,
)
from workloads.data.format.records import RECORDS_VERSION, FieldSpec, RecordError, check_fields, encode_record
from workloads.data.moving.s3 import S3Uri, parse_s3_uri
from workloads.data.moving.upload import ShardStream
from workloads.data.writing.engine import ShardSink, run_pack
from workloads.data.writing.maphook import MapHook
from workloads.data.writing.records_pack import no_usable_records, normalize_image, write_records_shard
from workloads.data.writing.slices import (
    ShardRecord,
    SliceResult,
    abort_open_uploads,
    committed_shards,
    free_shard_name,
    object_matches,
    owned,
    put_record,
    put_report,
    read_record,
    remove_records,
    wait_for_records,
)
from workloads.data.writing.sources import S3Source, SourceOptions
from workloads.data.writing.tables import TableFile, TableSource, read_rows, table_units

FILTERED = "filtered by the map hook"  # a ShardRecord.skipped reason that is not a skip: the hook said None


@dataclass(frozen=True)
class TablePackOptions:
    fields: tuple[FieldSpec, ...]
    shard_rows: int = 4096
    image_columns: tuple[str, ...] = ()  # columns whose value is the key of an image under `images`
    images: str | None = None  # local folder or s3:// prefix of the images; None: SRC
    strict: bool = False
    force: bool = False
    workers: int = 16  # image fetches and encodes at once


@dataclass(frozen=True)
class TablePlan:
    tables: list[TableFile]
    units: list[list[int]]  # rows per piece of each table
    starts: list[int]  # first global row of each table
    total: int
    shard_rows: int
    bad: list[dict[str, str]]  # tables that could not be read, with why
    digest: str

    @property
    def shards(self) -> int:
        return -(-self.total // self.shard_rows)

    def pieces(self, shard: int) -> Iterator[tuple[int, int, int]]:
        """(table, first row, end row) of the rows shard `shard` holds, in order."""
        begin, end = shard * self.shard_rows, min(self.total, (shard + 1) * self.shard_rows)
        for number, start in enumerate(self.starts):
            rows = sum(self.units[number])
            if start < end and start + rows > begin:
                yield number, max(begin, start) - start, min(end, start + rows) - start


@dataclass
class TablePackResult:
    manifest: Manifest
    skipped: list[dict[str, str]]
    filtered: int
    shards: list[int] = field(default_factory=list)


def make_table_plan(source: TableSource, options: TablePackOptions, hook: MapHook | None) -> TablePlan:
    tables = source.list()
    if not tables:
        raise DataToolError(source.root, "no .parquet, .arrow, .jsonl or .npy files")
    if options.shard_rows < 1:
        raise DataToolError("--shard-rows", "must be positive")

    def units(table: TableFile) -> list[int] | str:
        try:
            return table_units(source, table)
        except ValueError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=min(16, len(tables))) as pool:
        found = list(pool.map(units, tables))
    bad = [{"path": table.relpath, "reason": why} for table, why in zip(tables, found, strict=True)
           if isinstance(why, str)]
    good = [(table, rows) for table, rows in zip(tables, found, strict=True) if not isinstance(rows, str)]
    starts, total = [], 0
    for _, rows in good:
        starts.append(total)
        total += sum(rows)
    digest = hashlib.sha256(json.dumps({
        "tool_version": TOOL_VERSION, "fields": [spec.model_dump() for spec in options.fields],
        "shard_rows": options.shard_rows, "image_columns": list(options.image_columns), "images": options.images,
        "map": hook.describe() if hook else None, "bad": bad}, sort_keys=True).encode())
    for table, rows in good:
        digest.update(json.dumps([table.relpath, table.size, rows]).encode() + b"\n")
    return TablePlan([t for t, _ in good], [r for _, r in good], starts, total, options.shard_rows, bad,
                     digest.hexdigest())


class _Images:
    """Fetches the image a row names: a key relative to a local folder or an s3:// prefix."""

    def __init__(self, root: str, client: Any) -> None:
        self.root = root
        self.s3 = S3Source(client, parse_s3_uri(root), SourceOptions()) if root.startswith("s3://") else None

    def fetch(self, key: Any) -> tuple[bytes | None, str]:
        if isinstance(key, bytes):
            return key, ""  # the table holds the image itself
        if not isinstance(key, str) or not key:
            return None, f"no image key ({type(key).__name__})"
        path = PurePosixPath(key)
        if path.is_absolute() or ".." in path.parts:
            return None, f"image key {key!r} leaves the images prefix"
        if self.s3 is not None:
            return self.s3.fetch(key, 0)
        try:
            return (Path(self.root) / key).read_bytes(), ""
        except OSError as exc:
            return None, f"unreadable: {exc.strerror or exc}"


def shard_rows(source: TableSource, plan: TablePlan, shard: int, options: TablePackOptions, hook: MapHook | None,
               images: _Images, pool: ThreadPoolExecutor) -> tuple[list[list[Any]], list[dict[str, str]]]:
    """The encoded columns of planned shard `shard`, and the rows left out (reason FILTERED: the hook said None)."""
    rows: list[tuple[str, Any]] = []
    for number, begin, end in plan.pieces(shard):
        table = plan.tables[number]
        for offset, row in enumerate(read_rows(source, table, plan.units[number], begin, end)):
            rows.append((f"{table.relpath}#{begin + offset}", row))

    def with_images(item: tuple[str, Any]) -> tuple[str, Any, str]:
        key, row = item
        if isinstance(row, ValueError):
            return key, None, str(row)
        record = dict(row)
        for column in options.image_columns:
            data, why = images.fetch(record.get(column))
            if data is None:
                return key, None, f"{column}: {why}"
            record[column] = data
        return key, record, ""

    fields = list(options.fields)
    image_fields = [spec.name for spec in fields if spec.type == "image"]

    def encoded(item: tuple[str, Any, str]) -> tuple[str, list[Any] | None, str]:
        key, record, why = item
        if record is None:
            return key, None, why
        try:
            for name in image_fields:
                if isinstance(record.get(name), bytes):
                    record[name] = normalize_image(record[name])
            return key, encode_record(fields, record), ""
        except RecordError as exc:
            return key, None, str(exc)

    mapped = []
    for key, record, why in pool.map(with_images, rows):
        if record is not None and hook is not None:
            record, why = hook.apply(record)
            why = why or ("" if record is not None else FILTERED)
        mapped.append((key, record, why))
    columns: list[list[Any]] = [[] for _ in fields]
    left_out: list[dict[str, str]] = []
    for key, values, why in pool.map(encoded, mapped):
        if values is None:
            if options.strict and why != FILTERED:
                raise DataToolError(source.where(key), why)
            left_out.append({"path": key, "reason": why})
            continue
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return columns, left_out


def records_manifest(options: TablePackOptions, shards: list[ShardInfo], skipped: int,
                     hook: MapHook | None) -> Manifest:
    return Manifest(version=RECORDS_VERSION, tool_version=TOOL_VERSION, layout="records", classes=[],
                    fields=list(options.fields), num_samples=sum(s.num_samples for s in shards), shards=shards,
                    skipped=skipped, shuffle_seed=None, map_hook=hook.describe() if hook else None)


def _report(plan: TablePlan, left_out: list[dict[str, str]], hook: MapHook | None
            ) -> tuple[dict[str, Any], list[dict[str, str]], int]:
    """The pack report, the inputs left out (unreadable tables, then rows) and the rows the hook filtered."""
    skipped = plan.bad + [item for item in left_out if item["reason"] != FILTERED]
    filtered = sum(1 for item in left_out if item["reason"] == FILTERED)
    report = {"plan": plan.digest, "rows": plan.total, "filtered": filtered,
              "map": hook.describe() if hook else None, "skipped": skipped}
    return report, skipped, filtered


def pack_tables(source: TableSource, out: Path, options: TablePackOptions, hook: MapHook | None,
                client: Any = None) -> TablePackResult:
    """A local pack of the plan's every shard into OUT through the pack engine (the manifest last), byte-identical
    to the sliced pack."""
    check_fields(list(options.fields))
    plan = make_table_plan(source, options, hook)
    left_out: list[dict[str, str]] = []
    counts: dict[str, int] = {}

    def fill(sink: ShardSink) -> tuple[Manifest, dict[str, Any]]:
        images = _Images(options.images or source.root, client)
        with ThreadPoolExecutor(max_workers=options.workers) as pool:
            for shard in range(plan.shards):
                columns, dropped = shard_rows(source, plan, shard, options, hook, images, pool)
                left_out.extend(dropped)
                if columns[0]:
                    sink.add(shard, len(columns[0]),
                             lambda temp: write_records_shard(temp, list(options.fields), columns))  # noqa: B023
        report, skipped, counts["filtered"] = _report(plan, left_out, hook)
        if not sink.shards:
            raise no_usable_records(source.root, skipped, counts["filtered"])
        return records_manifest(options, sink.shards, len(skipped), hook), report

    manifest = run_pack(out, options.force, fill)
    return TablePackResult(manifest, [i for i in left_out if i["reason"] != FILTERED], counts["filtered"])


def pack_table_slice(client: Any, source: TableSource, target: S3Uri, options: TablePackOptions,
                     hook: MapHook | None, index: int, count: int, scratch: Path, stream: ShardStream) -> SliceResult:
    """Pack slice `index` of `count` into `target`: its shards and their records (no manifest)."""
    if not 0 <= index < count:
        raise DataToolError("--shard-index", f"{index} is not in 0..{count - 1} (--shard-count {count})")
    check_fields(list(options.fields))
    plan = make_table_plan(source, options, hook)
    result = SliceResult(shards=owned(plan.shards, index, count))
    stream.open()
    work = Path(tempfile.mkdtemp(prefix=".pack-slice-", dir=scratch))
    try:
        result.aborted_uploads = abort_open_uploads(client, target, result.shards)
        images = _Images(options.images or source.root, client)
        with ThreadPoolExecutor(max_workers=options.workers) as pool:
            for shard in result.shards:
                record = read_record(client, target, plan.digest, shard)
                if record is not None and object_matches(client, target, record):
                    result.reused.append(shard)
                    result.samples += record.num_samples
                    continue
                columns, left_out = shard_rows(source, plan, shard, options, hook, images, pool)
                empty = ShardRecord(plan=plan.digest, shard=shard, path=None, num_samples=0, bytes=0,
                                    class_counts=[], skipped=left_out)
                result.packed.append(shard)
                result.skipped += len(left_out)
                if not columns[0]:
                    put_record(client, target, empty)
                    continue
                temp = work / f".{shard_name(shard)}.partial"
                write_records_shard(temp, list(options.fields), columns)
                size = temp.stat().st_size
                sha, md5 = stream.hashes(temp)
                done = empty.model_copy(update={"path": free_shard_name(stream, shard, sha, size),
                                                "num_samples": len(columns[0]), "bytes": size, "sha256": sha})
                stream.send(temp, done.path or "", sha, md5, size,
                            then=lambda record=done: put_record(client, target, record))  # type: ignore[misc]
                result.samples += len(columns[0])
        stream.finish()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        stream.close()
    result.uploaded_bytes = stream.result.uploaded_bytes
    return result


def publish_tables(client: Any, source: TableSource, target: S3Uri, options: TablePackOptions,
                   hook: MapHook | None, stream: ShardStream, wait_s: float = 0.0,
                   poll_s: float = 10.0) -> TablePackResult:
    """The manifest of the slices' shards at `target`, once every shard is in and matches its record."""
    plan = make_table_plan(source, options, hook)
    deadline = time.monotonic() + wait_s
    stream.open()
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            records, missing = wait_for_records(client, target, plan.digest, plan.shards, pool, deadline, poll_s)
            if missing:
                raise DataToolError(str(target), f"{len(missing)} of {plan.shards} shards are not packed yet (shard "
                                                 f"{missing[0]} first); run their slices before publishing",
                                    runtime=True)
            done = [record for record in records if record is not None]
            agree = list(pool.map(lambda record: object_matches(client, target, record), done))
        for record, ok in zip(done, agree, strict=True):
            if not ok:
                raise DataToolError(f"s3://{target.bucket}/{target.key(record.path or '')}",
                                    f"missing, or not the bytes its slice recorded (shard {record.shard}); rerun "
                                    "its slice", runtime=True)
        shards = committed_shards(done)
        report, skipped, filtered = _report(plan, [i for r in done for i in r.skipped], hook)
        if not shards:
            raise no_usable_records(source.root, skipped, filtered)
        manifest = records_manifest(options, shards, len(skipped), hook)
        stream.publish(manifest_bytes(manifest))
        put_report(client, target, report)
        stream.remove_stale({shard.path for shard in shards})
        remove_records(client, target)
    finally:
        stream.close()
    left_out = [i for r in done for i in r.skipped]
    return TablePackResult(manifest, [i for i in left_out if i["reason"] != FILTERED], filtered)


def read_fields(text: str) -> tuple[FieldSpec, ...]:
    """--fields: a JSON list of field declarations, or the path of a file holding one."""
    try:
        raw = json.loads(Path(text).read_text() if not text.lstrip().startswith("[") else text)
        return tuple(check_fields([FieldSpec.model_validate(item) for item in raw]))
    except (OSError, ValueError, TypeError) as exc:
        raise DataToolError("--fields", f"not a JSON list of fields ({' '.join(str(exc).split())[:200]})") from None

