"""Pack a dataset into s3://DEST as N independent slices, then publish its one manifest: `pack SRC s3://DEST`.

    pack SRC s3://DEST --shard-index I --shard-count N     slice I (default: $JOB_COMPLETION_INDEX) of N
    pack SRC s3://DEST --publish                           the manifest, once every shard is in and verified
    pack SRC s3://DEST                                     both, in one process (slice 0 of 1)

Every slice lists SRC and orders it as pack does (pack.ordered_listing), and cuts the order into shards from the
listing alone (writing/shardplan.py), so shard k holds the same images, and so the same bytes, whatever N is;
slice I packs shards [I * K // N, (I + 1) * K // N) of the K planned. A shard is uploaded as it closes (pack
--upload's ShardStream: sha256 metadata, the object name avoiding any name the current manifest at DEST uses for
other bytes) and, once the object is confirmed, its record is written: DEST/.pack/<plan>/shard-NNNNN.json (name,
samples, bytes, sha256, per-class counts, the files skipped with their reasons). The plan is a digest of the
listing and the pack options, so records of another listing or other options are never mistaken for this one's.

A retried slice (a preempted pod, a failed index) reads its shards' records first: a shard whose record and object
agree (size, sha256 metadata) is not packed again; any other is packed again to the same name and the same bytes,
so nothing valid is overwritten with other bytes and nothing is left that no manifest will name. Multipart uploads
a killed slice left open on its own shards' names are aborted (they are invisible objects that are billed).

Publish reads the K records, checks every shard object against its record (size and the sha256 the slice computed
from the local file before sending it), checks that no class is left without a usable image, and only then puts
the manifest, byte-identical to a one-machine `pack` of the same source and options; the dataset that was at DEST
stays valid until that single PUT. Then pack-report.json, the previous pack's shards the new manifest does not
name, and the records go.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from workloads.data import TOOL_VERSION
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import Manifest, ShardInfo, check_file_name, manifest_bytes, shard_name
from workloads.data.moving.metrics import PackMetrics
from workloads.data.moving.s3 import S3Uri, describe, error_code
from workloads.data.moving.upload import SHA256_METADATA, ShardStream
from workloads.data.writing.engine import REPORT_NAME, report_bytes
from workloads.data.writing.pack import (
    PackOptions,
    _where,
    ordered_listing,
    skip_sample,
    source_samples,
    write_image_folder_shard,
)
from workloads.data.writing.shardplan import plan_id, plan_shards

if TYPE_CHECKING:
    from workloads.data.writing.sources import S3Source

RECORDS_DIR = ".pack"
RECORD_MAX_BYTES = 64 << 20
_SHARD_KEY = re.compile(r"^shard-([0-9]{5})(-r[0-9]+)?\.h5$")


class ShardRecord(BaseModel):
    """What a slice knows about one planned shard once its object is in the bucket (read back as untrusted)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan: str = Field(pattern=r"^[0-9a-f]{64}$")
    shard: int = Field(ge=0)
    path: str | None = Field(description="the object's name; None when every input of the shard was unusable")
    num_samples: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    class_counts: list[int]
    skipped: list[dict[str, str]]


@dataclass(frozen=True)
class SlicePlan:
    """How a pack's inputs fall into shards: the classes, the input files in order (with sizes), where each shard
    starts, and the digest every slice of one pack agrees on."""

    classes: list[str]
    files: list[tuple[str, int]]
    sizes: dict[str, int]
    starts: list[int]  # input position where each planned shard begins
    digest: str

    def inputs(self, shard: int) -> list[tuple[str, int]]:
        end = self.starts[shard + 1] if shard + 1 < len(self.starts) else len(self.files)
        return self.files[self.starts[shard]:end]


@dataclass
class SliceResult:
    shards: range  # the planned shards this slice owns
    packed: list[int] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)  # complete from an earlier attempt: record and object agree
    samples: int = 0
    skipped: int = 0
    uploaded_bytes: int = 0
    aborted_uploads: int = 0


@dataclass
class PublishResult:
    manifest: Manifest
    skipped: list[dict[str, str]]
    removed: list[str]


def make_plan(source: Path | S3Source, options: PackOptions) -> SlicePlan:
    classes, files, sizes = ordered_listing(source, options)
    starts = plan_shards(files, sizes, options.layout, options.image_size, options.shard_bytes)
    digest = plan_id(TOOL_VERSION, classes, files, sizes, options.layout, options.image_size, options.shard_bytes,
                     options.shuffle_seed)
    return SlicePlan(classes, files, sizes, starts, digest)


def owned(shards: int, index: int, count: int) -> range:
    """The planned shards slice `index` of `count` packs: contiguous, disjoint, together all of them."""
    return range(index * shards // count, (index + 1) * shards // count)


def record_key(target: S3Uri, plan: str, shard: int) -> str:
    return target.key(f"{RECORDS_DIR}/{plan[:16]}/shard-{shard:05d}.json")


def _uri(target: S3Uri, key: str) -> str:
    return f"s3://{target.bucket}/{key}"


def read_record(client: Any, target: S3Uri, plan: str, shard: int) -> ShardRecord | None:
    """Shard `shard`'s record for `plan`, or None when there is none (or it is not a record of this shard)."""
    key = record_key(target, plan, shard)
    try:
        response = client.get_object(Bucket=target.bucket, Key=key)
        if int(response.get("ContentLength", 0)) > RECORD_MAX_BYTES:
            return None
        payload = response["Body"].read(RECORD_MAX_BYTES + 1)
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise describe(_uri(target, key), exc) from exc
    try:
        record = ShardRecord.model_validate_json(payload)
    except ValidationError:
        return None
    return record if record.plan == plan and record.shard == shard else None


def object_matches(client: Any, target: S3Uri, record: ShardRecord) -> bool:
    """The record's shard object is in the bucket with the recorded size and sha256 (True for an absent shard)."""
    if record.path is None:
        return True
    try:
        head = client.head_object(Bucket=target.bucket, Key=target.key(record.path))
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise describe(_uri(target, target.key(record.path)), exc) from exc
    return bool(head["ContentLength"] == record.bytes
                and head.get("Metadata", {}).get(SHA256_METADATA) == record.sha256)


def abort_open_uploads(client: Any, target: S3Uri, shards: range) -> int:
    """Abort multipart uploads left open on the names of `shards` (a killed slice's); other slices' are theirs."""
    aborted = 0
    prefix = target.key("shard-")
    try:
        for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=target.bucket, Prefix=prefix):
            for upload in page.get("Uploads", []):
                match = _SHARD_KEY.match(upload["Key"][len(target.key("")):])
                if match and int(match.group(1)) in shards:
                    client.abort_multipart_upload(Bucket=target.bucket, Key=upload["Key"],
                                                  UploadId=upload["UploadId"])
                    aborted += 1
    except Exception as exc:
        if error_code(exc) in ("AccessDenied", "403"):
            # A role without s3:ListBucketMultipartUploads: the stack's buckets abort incomplete uploads after
            # abortIncompleteMultipartDays by their lifecycle rule (infra/storage/buckets.py) instead.
            return aborted
        raise describe(str(target), exc) from exc
    return aborted


def free_shard_name(stream: ShardStream, shard: int, sha256: str, size: int) -> str:
    """shard-NNNNN.h5, or shard-NNNNN-rK.h5 while the manifest now at DEST uses that name for other bytes."""
    name, k = shard_name(shard), 0
    while not stream.usable(name, sha256, size):
        k += 1
        name = f"shard-{shard:05d}-r{k}.h5"
    return name


def pack_slice(client: Any, source: Path | S3Source, target: S3Uri, options: PackOptions, index: int, count: int,
               scratch: Path, stream: ShardStream, metrics: PackMetrics | None = None) -> SliceResult:
    """Pack slice `index` of `count` into `target` (shards and their records; no manifest)."""
    if not 0 <= index < count:
        raise DataToolError("--shard-index", f"{index} is not in 0..{count - 1} (--shard-count {count})")
    plan = make_plan(source, options)
    result = SliceResult(shards=owned(len(plan.starts), index, count))
    metrics = metrics if metrics is not None else PackMetrics()
    metrics.shards.set(len(result.shards))
    stream.open()  # bucket present and answering, the manifest now at DEST: before anything is packed
    try:
        result.aborted_uploads = abort_open_uploads(client, target, result.shards)
        todo = []
        for shard in result.shards:
            record = read_record(client, target, plan.digest, shard)
            if record is not None and object_matches(client, target, record):
                result.reused.append(shard)
                metrics.shards_done.inc()
                result.samples += record.num_samples
                result.skipped += len(record.skipped)
            else:
                todo.append(shard)
        work = tempfile.mkdtemp(prefix=".pack-slice-", dir=scratch)
        try:
            _pack_shards(client, source, target, options, plan, todo, Path(work), stream, result, metrics)
            stream.finish()
        except DataToolError as exc:
            # A slice that fails names what it was packing, so its inputs can be looked at (or left out).
            first, last = plan.inputs(result.shards[0])[0][0], plan.inputs(result.shards[-1])[-1][0]
            raise DataToolError(exc.where, f"{exc.why} [slice {index} of {count}: shards {result.shards[0]}.."
                                           f"{result.shards[-1]}, inputs {first} .. {last}]",
                                runtime=exc.runtime) from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
    finally:
        stream.close()
    result.uploaded_bytes = stream.result.uploaded_bytes
    return result


def _pack_shards(client: Any, source: Path | S3Source, target: S3Uri, options: PackOptions, plan: SlicePlan,
                 todo: list[int], work: Path, stream: ShardStream, result: SliceResult,
                 metrics: PackMetrics) -> None:
    files: list[tuple[str, int]] = []
    ends: list[tuple[int, int]] = []  # (position after the shard's last input, shard)
    for shard in todo:
        files.extend(plan.inputs(shard))
        ends.append((len(files), shard))
    payloads: list[bytes] = []
    labels: list[int] = []
    skipped: list[dict[str, str]] = []

    def commit(shard: int, payloads: list[bytes], labels: list[int], skipped: list[dict[str, str]]) -> None:
        counts = [0] * len(plan.classes)
        for label in labels:
            counts[label] += 1
        empty = ShardRecord(plan=plan.digest, shard=shard, path=None, num_samples=0, bytes=0, class_counts=counts,
                            skipped=skipped)
        if payloads:
            temp = work / f".{shard_name(shard)}.partial"
            write_image_folder_shard(temp, options.layout, options.image_size, payloads, labels)
            size = temp.stat().st_size
            sha, md5 = stream.hashes(temp)
            name = free_shard_name(stream, shard, sha, size)
            record = empty.model_copy(update={"path": name, "num_samples": len(labels), "bytes": size,
                                              "sha256": sha})

            def committed() -> None:
                put_record(client, target, record)
                metrics.shards_done.inc()

            stream.send(temp, name, sha, md5, size, then=committed)
        else:
            put_record(client, target, empty)
            metrics.shards_done.inc()
        result.packed.append(shard)
        result.samples += len(labels)
        result.skipped += len(skipped)

    # A closed shard is written, hashed and handed to the upload on a thread of its own while the next one fills
    # (the decoders never wait for the HDF5 write); at most one is closing, so memory holds at most two shards.
    closer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-close")
    closing: list[Future[None]] = []

    def close(shard: int) -> None:
        nonlocal payloads, labels, skipped
        if closing:
            closing.pop().result()
        closing.append(closer.submit(commit, shard, payloads, labels, skipped))
        payloads, labels, skipped = [], [], []

    try:
        pending = iter(ends)
        end, shard = next(pending, (0, -1))
        for position, sample in enumerate(source_samples(source, files, options, plan.sizes)):
            while position >= end:
                close(shard)
                end, shard = next(pending)
            metrics.images.inc()
            if sample.payload is None:
                metrics.skipped.inc()
                skip_sample(source, sample, options.strict, skipped)
                continue
            payloads.append(sample.payload)
            labels.append(sample.label)
        if files:
            close(shard)
        if closing:
            closing.pop().result()
    finally:
        closer.shutdown(wait=True, cancel_futures=True)


def put_record(client: Any, target: S3Uri, record: ShardRecord) -> None:
    key = record_key(target, record.plan, record.shard)
    try:
        client.put_object(Bucket=target.bucket, Key=key, Body=(record.model_dump_json() + "\n").encode(),
                          ContentType="application/json")
    except Exception as exc:
        raise describe(_uri(target, key), exc) from exc


def publish(client: Any, source: Path | S3Source, target: S3Uri, options: PackOptions,
            stream: ShardStream, wait_s: float = 0.0, poll_s: float = 30.0) -> PublishResult:
    """Publish the manifest of the slices' shards at `target`, once every shard is in and matches its record;
    with `wait_s`, wait at most that long for the records of shards still being packed."""
    plan = make_plan(source, options)
    stream.open()
    deadline = time.monotonic() + wait_s
    try:
        with ThreadPoolExecutor(max_workers=16) as pool:
            records, missing = wait_for_records(client, target, plan.digest, len(plan.starts), pool, deadline, poll_s)
            if missing:
                first_input = plan.inputs(missing[0])[0][0]
                raise DataToolError(str(target), f"{len(missing)} of {len(records)} shards are not packed yet "
                                                 f"(shard {missing[0]}, from {first_input}, first); run their slices "
                                                 "(the same SRC and options) before publishing", runtime=True)
            done = [record for record in records if record is not None]
            agree = list(pool.map(lambda record: object_matches(client, target, record), done))
        for record, ok in zip(done, agree, strict=True):
            if not ok:
                where = _uri(target, target.key(record.path or ""))
                raise DataToolError(where, f"missing, or not the {record.bytes} bytes and sha256 its slice recorded "
                                           f"(shard {record.shard}); rerun its slice", runtime=True)
        counts = [sum(column) for column in zip(*(record.class_counts for record in done), strict=True)] \
            if done else [0] * len(plan.classes)
        if len(counts) != len(plan.classes):
            raise DataToolError(str(target), "shard records disagree with the listing's classes; rerun the slices")
        skipped = [item for record in done for item in record.skipped]
        shards = committed_shards(done)
        if not shards:
            raise DataToolError(_where(source), f"no usable images ({len(skipped)} skipped)")
        empty = [name for name, count in zip(plan.classes, counts, strict=True) if count == 0]
        if empty:
            raise DataToolError(_where(source, empty[0]), f"class folder has no usable images ({len(empty)} such: "
                                       f"{', '.join(empty[:5])}); remove it or add images, since an empty class "
                                       "shifts every label")
        manifest = Manifest(tool_version=TOOL_VERSION, layout=options.layout,
                            image_size=options.image_size if options.layout == "decoded" else None,
                            classes=plan.classes, num_samples=sum(s.num_samples for s in shards), shards=shards,
                            skipped=len(skipped), shuffle_seed=options.shuffle_seed)
        stream.publish(manifest_bytes(manifest))  # the one moment DEST changes datasets
        put_report(client, target, {"skipped": skipped})
        stream.remove_stale({shard.path for shard in shards})
        remove_records(client, target)
    finally:
        stream.close()
    return PublishResult(manifest=manifest, skipped=skipped, removed=stream.result.removed)


def wait_for_records(client: Any, target: S3Uri, plan: str, shards: int, pool: ThreadPoolExecutor, deadline: float,
                     poll_s: float) -> tuple[list[ShardRecord | None], list[int]]:
    """The slices' records of every planned shard, read again (those still missing) until all are there or the
    deadline passes; and the shards still missing."""
    records: list[ShardRecord | None] = [None] * shards
    missing = list(range(shards))
    while True:
        found = list(pool.map(lambda k: read_record(client, target, plan, k), missing))
        for k, record in zip(missing, found, strict=True):
            records[k] = record
        missing = [k for k in missing if records[k] is None]
        left = deadline - time.monotonic()
        if not missing or left <= 0:
            return records, missing
        print(f"publish: {shards - len(missing)} of {shards} shards packed; waiting for the rest (at most "
              f"{left:.0f} s more)", file=sys.stderr, flush=True)
        time.sleep(min(poll_s, left))


def committed_shards(records: list[ShardRecord]) -> list[ShardInfo]:
    """The manifest's shards from the slices' records, in plan order (a planned shard that packed nothing, all its
    inputs skipped, has no shard)."""
    shards, first = [], 0
    for record in records:
        if record.path is not None and record.sha256 is not None:
            shards.append(ShardInfo(path=check_file_name(record.path), num_samples=record.num_samples,
                                    first_index=first, bytes=record.bytes, sha256=record.sha256))
            first += record.num_samples
    return shards


def put_report(client: Any, target: S3Uri, report: dict[str, Any]) -> None:
    """The pack report beside the published manifest (after it: the dataset is already the new one)."""
    try:
        client.put_object(Bucket=target.bucket, Key=target.key(REPORT_NAME), Body=report_bytes(report),
                          ContentType="application/json")
    except Exception as exc:
        raise describe(_uri(target, target.key(REPORT_NAME)), exc) from exc


def remove_records(client: Any, target: S3Uri) -> None:
    prefix = target.key(f"{RECORDS_DIR}/")
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=prefix):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=target.bucket, Delete={"Objects": keys, "Quiet": True})
    except Exception as exc:
        raise describe(_uri(target, prefix), exc) from exc

