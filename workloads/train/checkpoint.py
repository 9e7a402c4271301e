"""An older trainer's whole-state checkpoint, read (never written) so that its runs still resume: model, optimiser,
sampler position and RNG states in one file, verified on load. The trainer now saves sharded checkpoints
(workloads/train/sharded.py); workloads/train/checkpointer.py reads this format only while no complete sharded
checkpoint exists.

On disk such a checkpoint is `last.pt` plus `last.pt.sha256` (sha256sum format: `<hex>  last.pt`; the older
trainer's saves kept the digest of the file in place listed through every rename, so a kill -9 left a `last.pt` its
sidecar accepts). In an object store (--checkpoint-uri) the object's `sha256` metadata carries the digest.

The S3 probe of --checkpoint-uri (CheckpointMirror.probe) serves the sharded checkpoints' remote tier too. boto3
(and the S3 plumbing that imports it) is imported only where a CheckpointMirror is made or used: a trainer with no
object store never loads it (about 0.3 s of import and 17 MB).
"""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import stat
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workloads.awsenv import configured_region
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import fsync_dir
from workloads.safeio import StateFileError, read_regular

CHECKPOINT_NAME = "last.pt"
SIDECAR_SUFFIX = ".sha256"
FORMAT_VERSION = 1  # bump when the checkpoint's keys change meaning; newer files are refused
REQUIRED_KEYS = ("model", "optimizer", "epoch", "batch", "step", "rng", "config", "world_size")
PROBE_TIMEOUT_S = 5.0


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or used (damaged, foreign, from a newer trainer); a config error."""


class CheckpointStoreError(Exception):
    """The checkpoint destination cannot be reached or written now (may pass on retry): exit 1."""


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    saved = state["numpy"]
    np.random.set_state(
        (
            saved["kind"],
            saved["keys"].numpy().astype(np.uint32),
            saved["position"],
            saved["has_gauss"],
            saved["cached"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def sidecar_path(target: Path) -> Path:
    return target.with_name(target.name + SIDECAR_SUFFIX)


def _temp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")


def _write_temp(target: Path, payload: bytes) -> Path:
    """Write `payload` to a new temp file beside `target` (mode 0666 & ~umask), fsynced; returns its path."""
    tmp = _temp_name(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _install(target: Path, payload: bytes) -> None:
    tmp = _write_temp(target, payload)
    try:
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _sidecar_text(digests: list[str], name: str) -> bytes:
    return "".join(f"{digest}  {name}\n" for digest in digests).encode()


SIDECAR_MAX_BYTES = 64 << 10  # a few digest lines; anything larger is not a sidecar


def read_sidecar(target: Path) -> list[str] | None:
    """The digests the sidecar accepts for `target`; None when there is no sidecar. Read as untrusted input (a
    regular file only, never through a link, never blocking on a FIFO, bounded); CheckpointError naming the
    sidecar for anything else."""
    sidecar = sidecar_path(target)
    try:
        payload, _ = read_regular(sidecar, SIDECAR_MAX_BYTES)
    except StateFileError as exc:
        raise CheckpointError(f"{sidecar}: not a sha256 sidecar: {exc.why}") from None
    if payload is None:
        return None
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{sidecar}: not a sha256 sidecar: not UTF-8 text (byte {exc.start})") from None
    digests = [line.split()[0].lower() for line in text.splitlines() if line.strip()]
    if not digests or any(len(d) != 64 or any(c not in "0123456789abcdef" for c in d) for d in digests):
        raise CheckpointError(f"{sidecar}: not a sha256 sidecar")
    return digests


def _checkpoint_present(target: Path) -> bool:
    """Whether there is a checkpoint file at `target`; CheckpointError when something else is there (a directory,
    a FIFO that would block the read, a device, a dangling link)."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        if os.path.lexists(target):
            raise CheckpointError(f"{target}: a symbolic link to nothing, not a checkpoint file") from None
        return False
    except OSError as exc:
        raise CheckpointError(f"{target}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise CheckpointError(f"{target}: {kind}, not a checkpoint file")
    return True


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_checkpoint(target: Path, *, allow_unverified: bool = False) -> str | None:
    """Check `target` against its sidecar. Returns a warning when the sidecar is missing and that is allowed."""
    digests = read_sidecar(target)
    if digests is None:
        if allow_unverified:
            return f"{target}: no sha256 sidecar; loading it unverified (--allow-unverified-checkpoint)"
        raise CheckpointError(
            f"{target}: no {sidecar_path(target).name} sidecar, so its sha256 cannot be checked "
            "(written by an older trainer? pass --allow-unverified-checkpoint to load it anyway)"
        )
    actual = file_sha256(target)
    if actual not in digests:
        raise CheckpointError(f"{target}: sha256 {actual[:16]}... does not match its sidecar: the file is damaged")
    return None


def load_checkpoint(
    directory: str | os.PathLike[str],
    map_location: str | torch.device = "cpu",
    *,
    verify: bool = True,
    allow_unverified: bool = False,
) -> dict[str, Any] | None:
    """The verified checkpoint in `directory`, or None when there is none. Raises CheckpointError."""
    target = Path(directory) / CHECKPOINT_NAME
    if not _checkpoint_present(target):
        return None
    if verify:
        warning = verify_checkpoint(target, allow_unverified=allow_unverified)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    try:
        state = torch.load(target, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged file
        raise CheckpointError(f"{target}: unreadable checkpoint: {exc}".splitlines()[0]) from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"{target}: not a training checkpoint (holds a {type(state).__name__})")
    version = state.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"{target}: checkpoint format {version} is newer than this trainer's ({FORMAT_VERSION}); "
            "resume with the trainer that wrote it"
        )
    return state



def require_training_state(state: dict[str, Any], where: str | os.PathLike[str]) -> None:
    """Refuse a loadable torch file that is not one of our training checkpoints."""
    missing = [key for key in REQUIRED_KEYS if key not in state]
    if missing:
        held = ", ".join(sorted(map(str, state))[:6]) or "nothing"
        raise CheckpointError(f"{where}: not a training checkpoint (no {', '.join(missing)}; holds {held})")


def _endpoint(endpoint_url: str | None = None) -> str | None:
    return endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


class CheckpointMirror:
    """An older trainer's `last.pt` in an object store (S3, or COS through AWS_ENDPOINT_URL_S3), with its `sha256`
    metadata: pulled before a resume that finds no sharded checkpoint. Its probe checks the bucket of
    --checkpoint-uri before any training."""

    def __init__(self, uri: str, endpoint_url: str | None = None):
        from workloads.data.moving.s3 import make_client, parse_s3_uri

        try:
            self.location = parse_s3_uri(uri)
        except DataToolError as exc:
            raise CheckpointError(f"--checkpoint-uri: {exc}") from exc
        self.uri = uri
        self.endpoint = _endpoint(endpoint_url)
        self.client = make_client(self.endpoint, max_connections=8, botocore_attempts=5)

    @property
    def key(self) -> str:
        return self.location.key(CHECKPOINT_NAME)

    @property
    def object_uri(self) -> str:
        return f"s3://{self.location.bucket}/{self.key}"

    def probe(self, timeout_s: float = PROBE_TIMEOUT_S) -> None:
        """Reach the bucket before any training: a wrong bucket or key is a config error (CheckpointError), an
        endpoint that does not answer within `timeout_s` is CheckpointStoreError."""
        import boto3
        import botocore.exceptions
        from botocore.config import Config

        from workloads.data.moving.s3 import error_code

        session = boto3.session.Session()
        client = session.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=configured_region(session) or "us-east-1",
            config=Config(
                connect_timeout=timeout_s,
                read_timeout=timeout_s,
                retries={"mode": "standard", "total_max_attempts": 1},
                s3={"addressing_style": "path"} if self.endpoint else None,
            ),
        )
        where = f"--checkpoint-uri: {self.uri}"
        at = f" at {self.endpoint}" if self.endpoint else ""
        try:
            client.head_bucket(Bucket=self.location.bucket)
        except botocore.exceptions.NoCredentialsError as exc:
            raise CheckpointError(f"{where}: no credentials for the object store{at}") from exc
        except botocore.exceptions.ClientError as exc:
            code = error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                raise CheckpointError(f"{where}: bucket {self.location.bucket} does not exist{at}") from exc
            if code in ("403", "AccessDenied", "Forbidden"):
                raise CheckpointError(f"{where}: access to bucket {self.location.bucket} denied{at}") from exc
            raise CheckpointStoreError(f"{where}: bucket check failed{at}: {code}") from exc
        except (botocore.exceptions.BotoCoreError, OSError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CheckpointStoreError(f"{where}: object store{at} unreachable: {reason}") from exc

    def pull(self, directory: str | os.PathLike[str], *, allow_unverified: bool = False) -> bool:
        """Download and verify the mirrored checkpoint into `directory` (atomically, with its sidecar); False
        when there is none yet. A body that does not match its `sha256` metadata is refused (CheckpointError)."""
        from workloads.data.moving.s3 import error_code

        target = Path(directory) / CHECKPOINT_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.download")
        try:
            response = self.client.get_object(Bucket=self.location.bucket, Key=self.key)
            expected = (response.get("Metadata") or {}).get("sha256", "").lower()
            digest = hashlib.sha256()
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            with os.fdopen(fd, "wb") as handle:
                for block in response["Body"].iter_chunks(1 << 20):
                    digest.update(block)
                    handle.write(block)
                handle.flush()
                os.fsync(handle.fileno())
        except Exception as exc:
            partial.unlink(missing_ok=True)
            if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CheckpointStoreError(f"--checkpoint-uri: {self.object_uri}: download failed: {reason}") from exc
        actual = digest.hexdigest()
        if not expected and not allow_unverified:
            partial.unlink(missing_ok=True)
            raise CheckpointError(
                f"{self.object_uri}: no sha256 metadata, so it cannot be verified "
                "(pass --allow-unverified-checkpoint to load it anyway)"
            )
        if expected and actual != expected:
            partial.unlink(missing_ok=True)
            raise CheckpointError(
                f"{self.object_uri}: sha256 {actual[:16]}... does not match its metadata: the object is damaged"
            )
        if expected:
            _install(sidecar_path(target), _sidecar_text([actual], target.name))
        else:
            sidecar_path(target).unlink(missing_ok=True)
        os.replace(partial, target)
        fsync_dir(target.parent)
        return True
