"""The on-disk contract of a packed dataset: HDF5 shards plus one JSON manifest.

Writers (`pack`), movers (`upload`, `stage`) and readers (the HDF5 Dataset) all go through this module, so the
format is defined exactly once.

Layout of a dataset directory (or S3 prefix):

    manifest.json          Manifest below; written last, so a manifest implies complete shards
    shard-00000.h5         samples [first_index, first_index + num_samples)
    shard-00001.h5         ...

Shard datasets (all contiguous: no chunking, no compression, so a run of samples is one read):
    layout "decoded":  images  uint8 (n, S, S, 3)  RGB, resized + center-cropped to S at pack time
                       labels  int64 (n,)
    layout "encoded":  data    uint8 (total_bytes,) original file bytes back to back
                       offsets int64 (n + 1,)       sample i is data[offsets[i]:offsets[i + 1]]; offsets[0] == 0
                       labels  int64 (n,)
Shard attributes: format = FORMAT_NAME, format_version = FORMAT_VERSION, layout.
Global sample order: shards in manifest order, samples in file order. Pack sorts by (class, relative path), then
applies the seeded permutation recorded as `shuffle_seed` (None: sorted order), so shards mix all classes.

Rolling-window staging (stage --window) agrees with the reader through two small JSON files in DEST/.window/,
each written by exactly one side with an atomic rename:
    stager.json  {"order": [shard paths in read order], "ready": [paths fully present and verified], "done": bool}
    reader.json  {"consumed": [shard paths the reader has finished with]}
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

FORMAT_NAME: Literal["ml-cluster-hdf5"] = "ml-cluster-hdf5"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
WINDOW_DIR = ".window"
STAGER_STATE = "stager.json"
READER_STATE = "reader.json"

Layout = Literal["decoded", "encoded"]


class ShardInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="file name relative to the manifest, e.g. shard-00000.h5")
    num_samples: int = Field(ge=0)
    first_index: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["ml-cluster-hdf5"] = FORMAT_NAME
    version: int = FORMAT_VERSION
    tool_version: str
    layout: Layout
    image_size: int | None = Field(default=None, description="S for layout decoded (images are S x S x 3)")
    classes: list[str]
    num_samples: int = Field(ge=0)
    shards: list[ShardInfo]
    skipped: int = Field(default=0, ge=0, description="source files left out (see the pack report)")
    shuffle_seed: int | None = Field(default=None, description="seed of the sample permutation; None: sorted")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.h5"


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest from a dataset directory or from the manifest file itself."""
    target = Path(path)
    if target.is_dir():
        target = target / MANIFEST_NAME
    return Manifest.model_validate_json(target.read_text())


def atomic_write_bytes(target: str | os.PathLike[str], payload: bytes) -> None:
    """Write a file so that readers see either the old content or the new, never a partial one."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    target = Path(directory) / MANIFEST_NAME
    atomic_write_bytes(target, (json.dumps(manifest.model_dump(), indent=2, sort_keys=True) + "\n").encode())
    return target
