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
"""

from __future__ import annotations

import hashlib
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig, create_transfer_manager
from s3transfer.subscribers import BaseSubscriber
from tqdm import tqdm

from workloads.data.format import MANIFEST_NAME, Manifest
from workloads.data.s3 import DataToolError, S3Uri, describe, error_code
from workloads.data.verify import read_manifest, sha256_file

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
        payload = client.get_object(Bucket=target.bucket, Key=target.key(MANIFEST_NAME))["Body"].read()
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
    try:
        client.head_bucket(Bucket=target.bucket)
    except Exception as exc:
        if error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
            raise DataToolError(str(target), "bucket does not exist") from exc
        raise describe(str(target), exc) from exc

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

    config = TransferConfig(multipart_threshold=options.part_bytes, multipart_chunksize=options.part_bytes,
                            max_concurrency=options.workers, preferred_transfer_client="classic")
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

