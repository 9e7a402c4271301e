"""Check a packed dataset directory against its manifest: sizes, sha256, HDF5 structure and sample counts (and for a
records dataset every declared field's column, its text UTF-8)."""

from __future__ import annotations

from pathlib import Path

import h5py
from pydantic import ValidationError

from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import (
    FORMAT_NAME,
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    load_manifest,
    manifest_error,
    sha256_file,
)
from workloads.data.format.records import check_column, decode_text
from workloads.safeio import StateFileError


class VerifyError(DataToolError):
    """The dataset does not match its manifest (the CLI exits 1, not 2)."""


def read_manifest(directory: Path) -> Manifest:
    try:
        return load_manifest(directory)
    except FileNotFoundError as exc:
        raise DataToolError(str(directory / MANIFEST_NAME), "not found (is this a packed dataset?)") from exc
    except IsADirectoryError as exc:
        raise DataToolError(str(directory / MANIFEST_NAME), "is a directory, not a manifest file") from exc
    except OSError as exc:
        raise DataToolError(str(directory / MANIFEST_NAME), f"cannot read: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise DataToolError(str(directory / MANIFEST_NAME), f"invalid manifest: {manifest_error(exc)}") from exc
    except StateFileError as exc:
        raise DataToolError(exc.where, exc.why) from exc
    except ValueError as exc:
        raise DataToolError(str(directory / MANIFEST_NAME), f"invalid manifest: {exc}") from exc


def check_manifest_counts(manifest: Manifest, where: str) -> None:
    next_index = 0
    for shard in manifest.shards:
        if shard.first_index != next_index:
            raise VerifyError(where, f"{shard.path}: first_index {shard.first_index}, expected {next_index}")
        next_index += shard.num_samples
    if next_index != manifest.num_samples:
        raise VerifyError(where, f"num_samples {manifest.num_samples} but shards hold {next_index}")


def verify_shard(path: Path, shard: ShardInfo, manifest: Manifest) -> None:
    if not path.is_file():
        raise VerifyError(str(path), "missing")
    size = path.stat().st_size
    if size != shard.bytes:
        raise VerifyError(str(path), f"size {size} bytes, manifest says {shard.bytes}")
    actual = sha256_file(path)
    if actual != shard.sha256:
        raise VerifyError(str(path), f"sha256 mismatch (manifest {shard.sha256[:12]}..., file {actual[:12]}...)")
    try:
        with h5py.File(path, "r") as handle:
            if handle.attrs.get("format") != FORMAT_NAME or handle.attrs.get("layout") != manifest.layout:
                raise VerifyError(str(path), "HDF5 attributes do not match the manifest's format and layout")
            if manifest.layout == "records":
                _verify_records(handle, shard, manifest, path)
                return
            labels = handle["labels"][...]
            if manifest.layout == "decoded":
                size_px = manifest.image_size
                images = handle["images"]
                if images.shape != (shard.num_samples, size_px, size_px, 3) or images.dtype != "uint8":
                    raise VerifyError(str(path), f"images {images.shape} {images.dtype}, expected "
                                                 f"({shard.num_samples}, {size_px}, {size_px}, 3) uint8")
            else:
                offsets = handle["offsets"][...]
                if len(offsets) != shard.num_samples + 1 or offsets[0] != 0 \
                        or offsets[-1] != handle["data"].shape[0] or (offsets[1:] < offsets[:-1]).any():
                    raise VerifyError(str(path), "offsets table does not describe the data array")
    except (OSError, KeyError) as exc:
        raise VerifyError(str(path), f"not a readable shard: {exc}") from exc
    if len(labels) != shard.num_samples:
        raise VerifyError(str(path), f"{len(labels)} samples, manifest says {shard.num_samples}")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(manifest.classes)):
        raise VerifyError(str(path), f"labels outside 0..{len(manifest.classes) - 1}")


def _verify_records(handle: h5py.File, shard: ShardInfo, manifest: Manifest, path: Path) -> None:
    """Every declared field's column (records.check_column); every text sample is UTF-8."""
    for spec in manifest.fields or []:
        try:
            column = check_column(handle, spec, shard.num_samples, str(path))
        except ValueError as exc:
            raise VerifyError(str(path), str(exc).removeprefix(f"{path}: ")) from None
        if spec.type == "text" and column.offsets is not None:
            data = handle[f"fields/{spec.name}/data"][...].tobytes()
            for index in range(shard.num_samples):
                try:
                    decode_text(data[column.offsets[index]:column.offsets[index + 1]], f"field {spec.name}, sample "
                                                                                       f"{index}")
                except ValueError as exc:
                    raise VerifyError(str(path), str(exc)) from None


def verify(directory: Path) -> Manifest:
    """Raise VerifyError naming the first failing shard; return the manifest when everything matches."""
    manifest = read_manifest(directory)
    check_manifest_counts(manifest, str(directory / MANIFEST_NAME))
    for shard in manifest.shards:
        verify_shard(directory / shard.path, shard, manifest)
    return manifest
