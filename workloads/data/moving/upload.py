"""Upload a packed dataset directory to s3://bucket/prefix (S3, or an S3-compatible store such as IBM COS).

Shards go through boto3's transfer manager (multipart, parts and files in parallel); each object carries its
sha256 as user metadata, which is what makes a rerun idempotent: an object whose size and sha256 metadata match
the manifest is skipped (multipart ETags are not content hashes) -- unless a single-part object's ETag (its MD5,
outside SSE-KMS) shows different bytes, or --force asks to re-send everything. Every local shard is hashed against
the manifest before anything is sent: a corrupt local file is refused, never published under a good sha256.
The manifest goes last, after every shard is in place, and an older, different manifest is deleted first, so a
reader never sees a manifest whose shards are missing or from another pack. After the new manifest is published,
shards of the previous pack that it does not name are deleted, so the prefix holds exactly one dataset (other
objects under the prefix are left alone).

ShardStream is the same machinery for `pack --upload`: shards are sent one by one while pack writes the next, with
a bounded number in flight, and the remote manifest is still published last (see its docstring).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from s3transfer.subscribers import BaseSubscriber
from tqdm import tqdm

from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import MANIFEST_MAX_BYTES, MANIFEST_NAME, Manifest, ShardInfo
from workloads.data.format.verify import read_manifest, sha256_file
from workloads.data.moving.s3 import S3Uri, describe, error_code

SHA256_METADATA = "sha256"  # stored as x-amz-meta-sha256


@dataclass(frozen=True)
class UploadOptions:
    workers: int = 16
    part_bytes: int = 64 << 20
    progress: bool = True
    force: bool = False  # re-send every shard, whatever the remote metadata says


@dataclass
class UploadResult:
    manifest: Manifest
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # stale shards of a previous pack


class _Progress(BaseSubscriber):
    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        self.bar.update(bytes_transferred)


_PACK_SHARD = re.compile(r"^shard-[0-9]{5}(-r[0-9]+)?\.h5$")


def transfer_config(workers: int, part_bytes: int) -> TransferConfig:
    """Multipart above part_bytes, `workers` threads for parts and files; the classic (non-CRT) transfer client."""
    return TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes, max_concurrency=workers,
                          preferred_transfer_client="classic")


def check_bucket(client: Any, target: S3Uri) -> None:
    """The bucket exists and answers: a missing bucket, an unreachable endpoint or rejected credentials are one
    DataToolError naming the target."""
    try:
        client.head_bucket(Bucket=target.bucket)
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
            raise DataToolError(str(target), "bucket does not exist") from exc
        raise describe(str(target), exc) from exc


def _local_hashes(path: Path) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            sha.update(block)
            md5.update(block)
    return sha.hexdigest(), md5.hexdigest()


def _remote_sha256(client: Any, target: S3Uri, name: str, size: int | None, md5: str | None = None) -> str | None:
    """The sha256 metadata of an existing object with the expected size, or None when it must be (re)written.

    A single-part object's ETag is the MD5 of its bytes (except under SSE-KMS): when it disagrees with the local
    file the object is rewritten whatever its metadata claims."""
    try:
        head = client.head_object(Bucket=target.bucket, Key=target.key(name))
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise describe(f"s3://{target.bucket}/{target.key(name)}", exc) from exc
    if size is not None and head["ContentLength"] != size:
        return None
    etag = str(head.get("ETag", "")).strip('"')
    if md5 is not None and etag and "-" not in etag and head.get("ServerSideEncryption") != "aws:kms" \
            and etag != md5:
        return None
    return head.get("Metadata", {}).get(SHA256_METADATA)


def _remote_manifest(client: Any, target: S3Uri) -> Manifest | None:
    try:
        payload = client.get_object(Bucket=target.bucket, Key=target.key(MANIFEST_NAME))["Body"].read(
            MANIFEST_MAX_BYTES + 1)
        return Manifest.model_validate_json(payload)
    except Exception:  # noqa: BLE001 - absent or not a manifest: nothing known to clean up
        return None


def _remove_stale(client: Any, target: S3Uri, keep: set[str], old: Manifest | None) -> list[str]:
    """Delete the previous pack's shards (named by its manifest, or named like pack's shards) that `keep` lacks."""
    stale = {shard.path for shard in old.shards} if old else set()
    prefix = target.key("")
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=prefix,
                                                                      Delimiter="/"):
            for item in page.get("Contents", []):
                name = item["Key"][len(prefix):]
                if _PACK_SHARD.match(name):
                    stale.add(name)
    except Exception as exc:
        raise describe(str(target), exc) from exc
    removed = sorted(stale - keep)
    for name in removed:
        try:
            client.delete_object(Bucket=target.bucket, Key=target.key(name))
        except Exception as exc:
            raise describe(f"s3://{target.bucket}/{target.key(name)}", exc) from exc
    return removed


def upload(client: Any, source: Path, target: S3Uri, options: UploadOptions) -> UploadResult:
    manifest = read_manifest(source)
    for shard in manifest.shards:
        path = source / shard.path
        if not path.is_file() or path.stat().st_size != shard.bytes:
            raise DataToolError(str(path), "missing or not the size the manifest says (run verify)")
    with ThreadPoolExecutor(max_workers=min(options.workers, 8)) as pool:  # what is sent is what the manifest says
        hashes = list(pool.map(lambda s: _local_hashes(source / s.path), manifest.shards))
    for shard, (sha, _) in zip(manifest.shards, hashes, strict=True):
        if sha != shard.sha256:
            raise DataToolError(str(source / shard.path), f"sha256 {sha[:12]}... does not match the manifest's "
                                                          f"{shard.sha256[:12]}...: corrupt local shard, nothing "
                                                          "uploaded (re-pack or restore it; run verify)")
    check_bucket(client, target)

    manifest_path = source / MANIFEST_NAME
    manifest_sha = sha256_file(manifest_path)
    remote_manifest_sha = _remote_sha256(client, target, MANIFEST_NAME, None)
    with ThreadPoolExecutor(max_workers=options.workers) as pool:  # one HEAD per shard, in parallel
        remote = list(pool.map(lambda sh: _remote_sha256(client, target, sh[0].path, sh[0].bytes, sh[1][1]),
                               zip(manifest.shards, hashes, strict=True)))
    result = UploadResult(manifest=manifest)
    todo = []
    for shard, remote_sha in zip(manifest.shards, remote, strict=True):
        if remote_sha == shard.sha256 and not options.force:
            result.skipped.append(shard.path)
        else:
            todo.append(shard)
    old_manifest = _remote_manifest(client, target) if remote_manifest_sha is not None else None
    keep = {shard.path for shard in manifest.shards}
    if not todo and remote_manifest_sha == manifest_sha:
        result.skipped.append(MANIFEST_NAME)
        result.removed = _remove_stale(client, target, keep, old_manifest)
        return result
    if remote_manifest_sha is not None:  # never leave an old manifest describing a prefix being rewritten
        try:
            client.delete_object(Bucket=target.bucket, Key=target.key(MANIFEST_NAME))
        except Exception as exc:
            raise describe(f"s3://{target.bucket}/{target.key(MANIFEST_NAME)}", exc) from exc

    config = transfer_config(options.workers, options.part_bytes)
    bar = tqdm(total=sum(s.bytes for s in todo), unit="B", unit_scale=True, desc="upload",
               disable=None if options.progress else True)
    with bar, create_transfer_manager(client, config) as manager:
        futures = [(shard, manager.upload(str(source / shard.path), target.bucket, target.key(shard.path),
                                          extra_args={"Metadata": {SHA256_METADATA: shard.sha256}},
                                          subscribers=[_Progress(bar)]))
                   for shard in todo]
        for shard, future in futures:
            try:
                future.result()
            except Exception as exc:
                raise describe(f"s3://{target.bucket}/{target.key(shard.path)}", exc) from exc
            result.uploaded.append(shard.path)
    try:
        client.put_object(Bucket=target.bucket, Key=target.key(MANIFEST_NAME), Body=manifest_path.read_bytes(),
                          ContentType="application/json", Metadata={SHA256_METADATA: manifest_sha})
    except Exception as exc:
        raise describe(f"s3://{target.bucket}/{target.key(MANIFEST_NAME)}", exc) from exc
    result.uploaded.append(MANIFEST_NAME)
    result.removed = _remove_stale(client, target, keep, old_manifest)
    return result



def current_manifest(client: Any, target: S3Uri) -> Manifest | None:
    """The manifest published at the prefix now: None when there is none, or when it is not a valid manifest (it
    describes no dataset a reader could use). Any other failure is an error: without the manifest the names its
    shards hold, and so the names a new pack must not overwrite, are unknown."""
    where = f"s3://{target.bucket}/{target.key(MANIFEST_NAME)}"
    try:
        payload = client.get_object(Bucket=target.bucket, Key=target.key(MANIFEST_NAME))["Body"].read(
            MANIFEST_MAX_BYTES + 1)
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise describe(where, exc) from exc
    try:
        return Manifest.model_validate_json(payload)
    except ValueError:
        return None


@dataclass(frozen=True)
class StreamOptions:
    in_flight: int = 2  # shard uploads at once; the packer waits for one to finish before handing over another
    workers: int = 16  # transfer-manager threads (multipart parts of the shards in flight), as upload's default
    part_bytes: int = 64 << 20  # as upload's --part-size default, so the objects are the same as upload's
    keep_local: bool = False  # keep the shard files (OUT is then a full dataset, as after a plain pack)
    progress: bool = True


@dataclass
class StreamResult:
    uploaded: list[str] = field(default_factory=list)  # objects sent: shards, then the manifest
    skipped: list[str] = field(default_factory=list)  # shards already in the bucket with these bytes
    removed: list[str] = field(default_factory=list)  # stale shards of the previous pack, deleted after publishing
    uploaded_bytes: int = 0
    peak_local_bytes: int = 0  # the most bytes of shard files on local disk at once (an upper bound)


class ShardStream:
    """Upload shards as pack closes them, the manifest last: `pack --upload`.

    open() probes the target before anything is packed (bucket present and answering, the current manifest read).
    send() hands a closed shard file to a background upload (HEAD first: an object already holding these bytes is
    not sent again, which makes a rerun resume) and returns at once, unless `in_flight` uploads are running: then it
    waits for one to finish, so a slow network holds the packer back instead of filling the local disk. A confirmed
    upload's local file is deleted unless keep_local. publish() puts the manifest once finish() has confirmed every
    shard; until then the previous manifest, if any, stays as it was and stays valid: pack only gives a shard a name
    the previous manifest uses when the bytes are the same (usable), so no object it names is overwritten with
    other bytes. remove_stale() then deletes the previous pack's shards the new manifest does not name.
    """

    def __init__(self, client: Any, target: S3Uri, options: StreamOptions, probe_client: Any = None) -> None:
        self.client = client
        self.target = target
        self.options = options
        self.result = StreamResult()
        self._probe_client = probe_client if probe_client is not None else client
        self._old: Manifest | None = None
        self._old_shards: dict[str, ShardInfo] = {}
        self._pending: set[Future[None]] = set()
        self._lock = threading.Lock()
        self._held = 0  # bytes of shard files handed over and not yet deleted
        self._held_after_send = 0
        self._stopping = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._manager: Any = None
        self._bar: tqdm | None = None

    @property
    def keep_local(self) -> bool:
        return self.options.keep_local

    def open(self) -> None:
        check_bucket(self._probe_client, self.target)
        self._old = current_manifest(self.client, self.target)
        self._old_shards = {shard.path: shard for shard in self._old.shards} if self._old else {}
        self._pool = ThreadPoolExecutor(max_workers=self.options.in_flight, thread_name_prefix="shard-upload")
        self._manager = create_transfer_manager(self.client, transfer_config(self.options.workers,
                                                                             self.options.part_bytes))
        self._bar = tqdm(total=0, unit="B", unit_scale=True, desc="upload",
                         disable=None if self.options.progress else True)

    @staticmethod
    def hashes(path: Path) -> tuple[str, str]:
        """(sha256, md5) of a local file in one read."""
        return _local_hashes(path)

    def usable(self, name: str, sha256: str, size: int) -> bool:
        """Whether a new shard may take `name`: not a name the current remote manifest uses for other bytes."""
        old = self._old_shards.get(name)
        return old is None or (old.sha256 == sha256 and old.bytes == size)

    def send(self, path: Path, name: str, sha256: str, md5: str, size: int,
             then: Callable[[], None] | None = None) -> None:
        """Upload `path` as object `name` in the background; `then` runs (on the upload's thread) once the object
        is confirmed, before the local file is deleted."""
        if self._pool is None or self._bar is None:
            raise RuntimeError("ShardStream.send before open")
        with self._lock:
            self._held += size
            # While this shard was written, the files held were at most what was held right after the last send.
            self.result.peak_local_bytes = max(self.result.peak_local_bytes, self._held_after_send + size)
        self._collect(block=False)
        while len(self._pending) >= self.options.in_flight:
            self._collect(block=True)
        self._bar.total += size
        self._bar.refresh()
        self._pending.add(self._pool.submit(self._send, path, name, sha256, md5, size, then))
        with self._lock:
            self._held_after_send = self._held

    def _collect(self, block: bool) -> None:
        if not self._pending:
            return
        done, _ = wait(self._pending, timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for future in done:
            self._pending.discard(future)
            future.result()  # the upload's failure, as one DataToolError

    def _send(self, path: Path, name: str, sha256: str, md5: str, size: int,
              then: Callable[[], None] | None = None) -> None:
        assert self._bar is not None
        key = self.target.key(name)
        if self._stopping.is_set():
            return
        if _remote_sha256(self.client, self.target, name, size, md5) == sha256:
            self._bar.update(size)
            with self._lock:
                self.result.skipped.append(name)
        else:
            future = self._manager.upload(str(path), self.target.bucket, key,
                                          extra_args={"Metadata": {SHA256_METADATA: sha256}},
                                          subscribers=[_Progress(self._bar)])
            try:
                future.result()
            except Exception as exc:
                raise describe(f"s3://{self.target.bucket}/{key}", exc) from exc
            with self._lock:
                self.result.uploaded.append(name)
                self.result.uploaded_bytes += size
        if then is not None:
            then()
        if not self.options.keep_local:
            path.unlink(missing_ok=True)
            with self._lock:
                self._held -= size

    def finish(self) -> None:
        """Wait until every shard sent is in the bucket; raises the first failure."""
        while self._pending:
            self._collect(block=True)
        self.result.uploaded.sort()
        self.result.skipped.sort()

    def publish(self, manifest_payload: bytes) -> None:
        """Put the manifest (after finish): from now on the prefix holds the new dataset."""
        if self._pending:
            raise RuntimeError("ShardStream.publish before finish")
        key = self.target.key(MANIFEST_NAME)
        try:
            self.client.put_object(Bucket=self.target.bucket, Key=key, Body=manifest_payload,
                                   ContentType="application/json",
                                   Metadata={SHA256_METADATA: hashlib.sha256(manifest_payload).hexdigest()})
        except Exception as exc:
            raise describe(f"s3://{self.target.bucket}/{key}", exc) from exc
        self.result.uploaded.append(MANIFEST_NAME)
        self.result.uploaded_bytes += len(manifest_payload)

    def remove_stale(self, names: set[str]) -> None:
        """After publish: delete the previous pack's shards that the new manifest (`names`) does not use."""
        self.result.removed = _remove_stale(self.client, self.target, names, self._old)

    def close(self) -> None:
        """Stop the threads. Uploads still pending (a failure or Ctrl-C in the packer) are cancelled and their
        multipart uploads aborted; objects already complete stay, named by no manifest, and a rerun reuses them."""
        self._stopping.set()
        cancel = bool(self._pending)
        for future in self._pending:
            future.cancel()
        if self._manager is not None:
            # Shut down through the context-manager exit: s3transfer's public shutdown(cancel=True) passes its
            # arguments on in the wrong order and fails with a TypeError instead of cancelling.
            if cancel:
                self._manager.__exit__(CancelledError, CancelledError("pack stopped"), None)
            else:
                self._manager.__exit__(None, None, None)
            self._manager = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
