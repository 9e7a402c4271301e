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
    layout "records": /fields/<name>/... per declared field, column-wise (format version 2; see records.py)
Shard attributes: format = FORMAT_NAME, format_version (1 for decoded/encoded, 2 for records), layout.
Version 1 manifests (image folders: decoded/encoded) are written and read as before and carry no `fields`; a version
2 manifest (layout records) declares its fields; a version this code does not know is refused, never guessed at.
Global sample order: shards in manifest order, samples in file order. Pack sorts by (class, relative path), then
applies the seeded permutation recorded as `shuffle_seed` (None: sorted order), so shards mix all classes.

The staging cache (stage, see workloads/data/moving/cache.py) agrees with the reader through two small JSON files in
DEST/.cache/, each written by exactly one side with an atomic rename:
    stager.json  {"budget": bytes | null, "ready": [paths present and verified now], "done": bool, "error": ...}
    plan.json    {"order": [the node's next shards, in order of first use], "done": bool}
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from workloads.data.format.records import RECORDS_VERSION, FieldSpec, check_fields

FORMAT_NAME: Literal["ml-cluster-hdf5"] = "ml-cluster-hdf5"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
CACHE_DIR = ".cache"
STAGER_STATE = "stager.json"
PLAN_STATE = "plan.json"
HEARTBEAT = "stager.heartbeat"  # touched every second by a serving stager (its mtime is the heartbeat)
MANIFEST_MAX_BYTES = 1 << 30  # a manifest of a million shards is ~250 MB; a larger "manifest" is not one

Layout = Literal["decoded", "encoded"]  # an image folder's pack (pack.py)
ManifestLayout = Literal["decoded", "encoded", "records"]  # records: typed fields (records.py)
KNOWN_VERSIONS = (FORMAT_VERSION, RECORDS_VERSION)
MAX_IMAGE_SIZE = 8192  # decoded side in pixels: 8192 x 8192 x 3 is 192 MiB per sample already

# A manifest is untrusted input (it may come from a bucket anyone could write): every name it gives must be a plain
# file name inside the dataset directory. Checked here, once, for pack, verify, upload, stage and the Dataset.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
_RESERVED_NAMES = {MANIFEST_NAME, CACHE_DIR, "pack-report.json"}


def check_file_name(name: str) -> str:
    """`name` when it is a plain file name (no directory part, not hidden, no `..`); ValueError otherwise."""
    if not _SAFE_NAME.match(name) or ".." in name or name in _RESERVED_NAMES:
        raise ValueError(f"{name!r} is not a plain file name inside the dataset (letters, digits, . _ -; "
                         "no directories, no leading dot)")
    return name


class ShardInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="file name relative to the manifest, e.g. shard-00000.h5")
    num_samples: int = Field(ge=0)
    first_index: int = Field(ge=0)
    bytes: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        return check_file_name(value)


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["ml-cluster-hdf5"] = FORMAT_NAME
    version: int = FORMAT_VERSION
    tool_version: str
    layout: ManifestLayout
    image_size: int | None = Field(default=None, ge=1, le=MAX_IMAGE_SIZE,
                                   description="S for layout decoded (images are S x S x 3)")
    classes: list[str] = Field(description="class names (an image folder's sub-folders); a records dataset may "
                                            "leave it empty")
    fields: list[FieldSpec] | None = Field(default=None, description="layout records: the declared fields, in "
                                                                     "order (absent in version 1)")
    num_samples: int = Field(ge=0)
    shards: list[ShardInfo]
    skipped: int = Field(default=0, ge=0, description="source files left out (see the pack report)")
    shuffle_seed: int | None = Field(default=None, description="seed of the sample permutation; None: sorted")
    map_hook: dict[str, str] | None = Field(default=None, description="records packed through a map hook "
                                                                       "(maphook.py): its name and source sha256")

    @model_serializer(mode="wrap")
    def _without_absent_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # A version-1 manifest is written exactly as before (no "fields" key), so older readers, which forbid
        # unknown keys, still read the image-folder datasets this code packs.
        data: dict[str, object] = handler(self)
        for name in ("fields", "map_hook"):
            if data.get(name) is None:
                data.pop(name, None)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.version not in KNOWN_VERSIONS:
            raise ValueError(f"version: {self.version} is not a format version this tool reads "
                             f"({', '.join(map(str, KNOWN_VERSIONS))}); a newer tool wrote it")
        records = self.layout == "records"
        if records != (self.version == RECORDS_VERSION):
            raise ValueError(f"version: layout {self.layout} is format version "
                             f"{RECORDS_VERSION if records else FORMAT_VERSION}, not {self.version}")
        if records:
            if self.fields is None:
                raise ValueError("fields: a records dataset declares its fields")
            check_fields(self.fields)
        elif self.fields is not None:
            raise ValueError(f"fields: only a records dataset declares fields, not layout {self.layout}")
        names = [shard.path for shard in self.shards]
        if len(set(names)) != len(names):
            raise ValueError("shards: the same path is named twice")
        if self.num_samples and not self.classes and not records:
            raise ValueError("classes: empty, but the dataset holds samples")
        held = 0
        for number, shard in enumerate(self.shards):
            if shard.first_index != held:
                raise ValueError(f"shards.{number}.first_index: {shard.first_index}, but the shards before it hold "
                                 f"{held} samples")
            held += shard.num_samples
        if held != self.num_samples:
            raise ValueError(f"num_samples: {self.num_samples}, but the shards hold {held} samples")
        return self


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.h5"


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """Read a manifest from a dataset directory or from the manifest file itself.

    Read as untrusted input: a regular file only (a link the user made is followed, but a FIFO never blocks and a
    link to a device is refused), at most MANIFEST_MAX_BYTES. FileNotFoundError when there is none; ValueError
    (StateFileError or a validation error) for anything that is not a valid manifest."""
    from workloads.safeio import read_regular

    target = Path(path)
    if target.is_dir() and target.name != MANIFEST_NAME:
        target = target / MANIFEST_NAME
    payload, _ = read_regular(target, MANIFEST_MAX_BYTES, follow=True)
    if payload is None:
        raise FileNotFoundError(2, "No such file or directory", str(target))
    return Manifest.model_validate_json(payload)


def manifest_error(exc: Exception) -> str:
    """One line saying why a manifest was refused: `<field>: <why>` for a validation error."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "manifest"
        return f"{field}: {str(first['msg']).removeprefix('Value error, ')}"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def sha256_file(path: str | os.PathLike[str], block_bytes: int = 8 << 20) -> str:
    """The hex sha256 of a file, as the manifest records it for each shard."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(block_bytes):
            digest.update(block)
    return digest.hexdigest()


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename or a new file in `directory` durable (the directory entry, not only the file's data)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(target: str | os.PathLike[str], payload: bytes) -> None:
    """Write a file so that readers see either the old content or the new, never a partial one. An OSError (a full
    disk, a read-only file system) names `target`."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; data files get the usual mode, like the shards
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror or str(exc), str(target)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def manifest_bytes(manifest: Manifest) -> bytes:
    """The manifest file's bytes (a remote copy is these same bytes, so local and remote compare by content)."""
    return (json.dumps(manifest.model_dump(), indent=2, sort_keys=True) + "\n").encode()


def write_manifest(directory: str | os.PathLike[str], manifest: Manifest) -> Path:
    target = Path(directory) / MANIFEST_NAME
    atomic_write_bytes(target, manifest_bytes(manifest))
    return target
