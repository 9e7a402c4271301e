"""Where sharded checkpoints live: the local tier (a directory on the node's NVMe) and a remote tier (S3, or a
shared file system such as EFS or FSx for Lustre mounted as a directory), each holding one folder per checkpoint:

    step-000001200/__0_0.distcp, __1_0.distcp, ..., .metadata    what torch.distributed.checkpoint writes
    step-000001200/checkpoint.json                                the manifest: every file's sha256 and size, written
                                                                  LAST (temp + fsync + rename, or one S3 PUT)

A folder without a manifest, or whose files do not match it (a shard missing, truncated or altered), is partial
and never loaded. The remote tier gets the same bytes the local tier holds (copied, never serialised again), so one
sha256 per file serves both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

MANIFEST = "checkpoint.json"
FORMAT = "ml-cluster-sharded-checkpoint"
FORMAT_VERSION = 1
MANIFEST_MAX_BYTES = 64 << 20  # every file of a 100k-rank checkpoint fits many times over
_STEP_DIR = re.compile(r"^step-(\d{9,})$")
_HASH_BLOCK = 4 << 20


class CheckpointDamaged(ValueError):
    """A checkpoint folder that must not be loaded (partial, altered, foreign); the message says which file."""


class CheckpointTimeout(TimeoutError):
    """A save still in flight when its wait's deadline passed (a hung disk, store or peer): the previous complete
    checkpoint stands; the trainer exits with the disruption code, so the Job resumes from it."""


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def step_of(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def file_digest(path: Path) -> tuple[str, int]:
    """sha256 hex and size of a file, read in blocks (bounded memory)."""
    digest = hashlib.sha256()
    size = 0
    for block in read_blocks(path):
        digest.update(block)
        size += len(block)
    return digest.hexdigest(), size


def read_blocks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            yield block


def install(blocks: Iterable[bytes], target: Path, *, suffix: str = "tmp") -> str:
    """Write `blocks` to a temp file beside `target`, hashing them on the way, fsync it and rename it over `target`;
    returns the sha256. A failure (disk full, a broken download) removes the temp file and leaves `target` as it
    was: a reader sees the old file or the new, never a torn one. The one copy routine of both tiers: a copy up
    (DirectoryTier.put), a copy down (get), the manifest (write_atomic)."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.{suffix}")
    digest = hashlib.sha256()
    try:
        with open(tmp, "xb") as sink:
            for block in blocks:
                digest.update(block)
                sink.write(block)
            sink.flush()
            os.fsync(sink.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return digest.hexdigest()


def write_atomic(target: Path, payload: bytes) -> None:
    """install() of one payload, then an fsync of the folder (the rename itself durable)."""
    install([payload], target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Manifest:
    step: int
    world_size: int
    files: dict[str, dict[str, Any]]  # name -> {"sha256": hex, "bytes": n}
    meta: dict[str, Any]  # the caller's JSON-able facts (epoch, data position, config, ...)

    def to_bytes(self) -> bytes:
        return json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "step": self.step,
                           "world_size": self.world_size, "files": self.files, "meta": self.meta},
                          sort_keys=True, indent=1).encode()

    @property
    def total_bytes(self) -> int:
        return sum(int(entry["bytes"]) for entry in self.files.values())

    @classmethod
    def parse(cls, payload: bytes, where: str) -> Manifest:
        try:
            document = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointDamaged(f"{where}: not a checkpoint manifest ({exc})") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise CheckpointDamaged(f"{where}: not a checkpoint manifest")
        version = document.get("version")
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise CheckpointDamaged(f"{where}: manifest version {version!r} is newer than this trainer's "
                                    f"({FORMAT_VERSION})")
        files = document.get("files")
        if not isinstance(files, dict) or not files or not all(
                isinstance(name, str) and "/" not in name and name not in ("", ".", "..") and isinstance(entry, dict)
                and isinstance(entry.get("sha256"), str) and isinstance(entry.get("bytes"), int)
                for name, entry in files.items()):
            raise CheckpointDamaged(f"{where}: manifest lists no files, or files without sha256 and size")
        step, world = document.get("step"), document.get("world_size")
        if not isinstance(step, int) or not isinstance(world, int) or step < 0 or world < 1:
            raise CheckpointDamaged(f"{where}: manifest without a step and a world size")
        return cls(step, world, files, document.get("meta") or {})


def verify_folder(folder: Path, manifest: Manifest) -> None:
    """Every file the manifest lists is in `folder` with its size and sha256 (CheckpointDamaged naming the first
    that is not)."""
    for name, entry in sorted(manifest.files.items()):
        path = folder / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointDamaged(f"{path}: missing (listed in {MANIFEST})") from None
        if size != entry["bytes"]:
            raise CheckpointDamaged(f"{path}: {size} bytes, the manifest says {entry['bytes']} (truncated?)")
        digest, _ = file_digest(path)
        if digest != entry["sha256"]:
            raise CheckpointDamaged(f"{path}: sha256 {digest[:16]}... does not match the manifest (altered)")


def read_local_manifest(folder: Path) -> Manifest | None:
    path = folder / MANIFEST
    try:
        with path.open("rb") as handle:
            payload = handle.read(MANIFEST_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(payload) > MANIFEST_MAX_BYTES:
        raise CheckpointDamaged(f"{path}: larger than {MANIFEST_MAX_BYTES} bytes: not a manifest")
    return Manifest.parse(payload, str(path))


def local_steps(root: Path) -> list[int]:
    """Steps with a folder under `root` (complete or not), newest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted((step for step in map(step_of, names) if step is not None), reverse=True)


def to_prune(steps_complete: Iterable[int], steps_all: Iterable[int], keep: int, in_flight: int | None) -> list[int]:
    """Folders retention removes: complete checkpoints beyond the newest `keep`, and partial ones older than the
    newest complete one (never the one being written). The newest complete checkpoint is never among them."""
    complete = sorted(set(steps_complete), reverse=True)
    kept = set(complete[:max(1, keep)])
    newest = complete[0] if complete else None
    doomed = []
    for step in sorted(set(steps_all), reverse=True):
        if step in kept or step == in_flight:
            continue
        if step in complete or (newest is not None and step < newest):
            doomed.append(step)
    return doomed


class RemoteTier(Protocol):
    """The second tier: the local tier's bytes, copied file by file; the manifest last."""

    uri: str

    def put(self, local: Path, step: int, name: str) -> None: ...

    def put_manifest(self, step: int, payload: bytes) -> None: ...

    def manifest(self, step: int) -> Manifest | None: ...

    def steps(self) -> list[int]: ...

    def get(self, step: int, name: str, local: Path) -> str:
        """Copy one file down to `local` (temp + rename); returns its sha256."""
        ...

    def delete(self, step: int) -> None: ...


class DirectoryTier:
    """A shared file system (EFS, FSx for Lustre) mounted as a directory. Not a Mountpoint S3 mount: it cannot
    rename, which the atomic manifest needs."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

    def _folder(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def put(self, local: Path, step: int, name: str) -> None:
        folder = self._folder(step)
        folder.mkdir(parents=True, exist_ok=True)
        install(read_blocks(local), folder / name)

    def put_manifest(self, step: int, payload: bytes) -> None:
        write_atomic(self._folder(step) / MANIFEST, payload)

    def manifest(self, step: int) -> Manifest | None:
        return read_local_manifest(self._folder(step))

    def steps(self) -> list[int]:
        return local_steps(self.root)

    def get(self, step: int, name: str, local: Path) -> str:
        return install(read_blocks(self._folder(step) / name), local, suffix="download")

    def delete(self, step: int) -> None:
        folder = self._folder(step)
        (folder / MANIFEST).unlink(missing_ok=True)  # partial from here on, whatever happens next
        shutil.rmtree(folder, ignore_errors=True)


class S3Tier:
    """An S3 prefix (or an S3-compatible store through AWS_ENDPOINT_URL_S3): one object per file, uploaded with
    bounded concurrency and part size (boto3's transfer manager), the manifest in one PUT after every file."""

    def __init__(self, uri: str, *, endpoint_url: str | None = None, max_concurrency: int = 4,
                 part_bytes: int = 64 << 20) -> None:
        from boto3.s3.transfer import TransferConfig  # here: a trainer with no S3 tier never imports boto3

        from workloads.data.moving.s3 import make_client, parse_s3_uri

        self.uri = uri.rstrip("/")
        self.location = parse_s3_uri(uri)
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.client = make_client(endpoint, max_connections=max_concurrency * 2, botocore_attempts=5)
        # bounded host memory: at most max_concurrency parts of part_bytes in flight
        self.transfer = TransferConfig(multipart_threshold=part_bytes, multipart_chunksize=part_bytes,
                                       max_concurrency=max_concurrency, use_threads=True)

    def _key(self, step: int, name: str) -> str:
        return self.location.key(f"{step_dir_name(step)}/{name}")

    def put(self, local: Path, step: int, name: str) -> None:
        self.client.upload_file(str(local), self.location.bucket, self._key(step, name), Config=self.transfer)

    def put_manifest(self, step: int, payload: bytes) -> None:
        self.client.put_object(Bucket=self.location.bucket, Key=self._key(step, MANIFEST), Body=payload)

    def manifest(self, step: int) -> Manifest | None:
        try:
            response = self.client.get_object(Bucket=self.location.bucket, Key=self._key(step, MANIFEST))
        except self.client.exceptions.NoSuchKey:
            return None
        payload = response["Body"].read(MANIFEST_MAX_BYTES + 1)
        where = f"s3://{self.location.bucket}/{self._key(step, MANIFEST)}"
        if len(payload) > MANIFEST_MAX_BYTES:
            raise CheckpointDamaged(f"{where}: larger than {MANIFEST_MAX_BYTES} bytes: not a manifest")
        return Manifest.parse(payload, where)

    def steps(self) -> list[int]:
        prefix = self.location.key("")
        found: set[int] = set()
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix, Delimiter="/"):
            for entry in page.get("CommonPrefixes") or []:
                step = step_of(entry["Prefix"][len(prefix):].rstrip("/"))
                if step is not None:
                    found.add(step)
        return sorted(found, reverse=True)

    def get(self, step: int, name: str, local: Path) -> str:
        response = self.client.get_object(Bucket=self.location.bucket, Key=self._key(step, name))
        return install(response["Body"].iter_chunks(_HASH_BLOCK), local, suffix="download")

    def delete(self, step: int) -> None:
        prefix = self.location.key(f"{step_dir_name(step)}/")
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.location.bucket, Prefix=prefix):
            keys = [{"Key": entry["Key"]} for entry in page.get("Contents") or []]
            # the manifest first: a folder being deleted is partial from the first request on
            keys.sort(key=lambda item: not item["Key"].endswith("/" + MANIFEST))
            for key in keys:
                self.client.delete_object(Bucket=self.location.bucket, Key=key["Key"])


def remote_tier(uri: str) -> RemoteTier:
    """s3://bucket/prefix -> S3Tier; anything else is a mounted directory (EFS, FSx)."""
    if uri.startswith("s3://"):
        return S3Tier(uri)
    return DirectoryTier(uri)
