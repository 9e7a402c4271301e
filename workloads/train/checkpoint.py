"""Atomic training checkpoints: model, optimiser, sampler position and RNG states in one file, replaced
whole."""

from __future__ import annotations

import io
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workloads.data.format import atomic_write_bytes
from workloads.data.s3 import error_code, make_client, parse_s3_uri

CHECKPOINT_NAME = "last.pt"


def capture_rng() -> dict[str, Any]:
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


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


def save_checkpoint(directory: str | os.PathLike[str], state: dict[str, Any]) -> Path:
    """Serialise in memory, then write-fsync-rename: a crash leaves the previous checkpoint intact."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    target = Path(directory) / CHECKPOINT_NAME
    atomic_write_bytes(target, buffer.getvalue())
    return target


def load_checkpoint(
    directory: str | os.PathLike[str], map_location: str | torch.device = "cpu"
) -> dict[str, Any] | None:
    target = Path(directory) / CHECKPOINT_NAME
    if not target.exists():
        return None
    try:
        return torch.load(target, map_location=map_location, weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged file
        raise ValueError(f"{target}: unreadable checkpoint: {exc}".splitlines()[0]) from exc


class CheckpointMirror:
    """A copy of the local checkpoint in an object store (S3, or COS through AWS_ENDPOINT_URL_S3).

    Pushed after every local save and pulled before a resume, so a pod rescheduled onto another node (whose local
    disk is gone) continues from the last checkpoint. An S3 PUT (or completed multipart upload) replaces the object
    whole, so a reader sees the previous checkpoint or the new one, never a torn file. Checkpoints never go to a
    Mountpoint S3 mount: it cannot rename, which write-then-rename needs.
    """

    def __init__(self, uri: str, endpoint_url: str | None = None):
        self.location = parse_s3_uri(uri)
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        self.client = make_client(endpoint, max_connections=8, botocore_attempts=5)

    @property
    def key(self) -> str:
        return self.location.key(CHECKPOINT_NAME)

    def push(self, local: str | os.PathLike[str]) -> None:
        self.client.upload_file(str(local), self.location.bucket, self.key)

    def pull(self, directory: str | os.PathLike[str]) -> bool:
        """Download the mirrored checkpoint into `directory` (atomically); False when there is none yet."""
        target = Path(directory) / CHECKPOINT_NAME
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.download")
        try:
            self.client.download_file(self.location.bucket, self.key, str(partial))
        except Exception as exc:
            partial.unlink(missing_ok=True)
            if error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        os.replace(partial, target)
        return True
