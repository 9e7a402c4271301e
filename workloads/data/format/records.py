"""Typed records: the fields a multi-field dataset declares once in its manifest, and how each is stored.

A dataset of layout "records" (format version 2) lists its fields in the manifest, in order:

    {"name": "image",   "type": "image"}                                   encoded image bytes (JPEG), decoded on read
    {"name": "caption", "type": "text"}                                    UTF-8 text of any length
    {"name": "raw",     "type": "bytes"}                                   opaque bytes of any length
    {"name": "label",   "type": "int"}                                     one int64
    {"name": "emb",     "type": "ndarray", "dtype": "float32", "shape": [4, 8]}   a fixed-shape array
    {"name": "tokens",  "type": "tokens", "dtype": "uint16", "length": 2048}     token ids: fixed length, or
    {"name": "doc",     "type": "tokens", "dtype": "int32"}                        any length (no "length")

Each shard stores each field as its own contiguous, unfiltered HDF5 dataset under /fields/<name>/ (column-wise,
so a reader asking for some fields never touches the bytes of the others):

    fixed size (int, ndarray, tokens with a length)    values   (n, *shape) of the field's dtype
    variable size (image, text, bytes, other tokens)   data     (total,) uint8, or the token dtype
                                                       offsets  int64 (n + 1,)
    sample i of a variable field is data[offsets[i]:offsets[i + 1]]

This module is the schema and the value rules; it imports nothing else of the data tools (format.py embeds the
schema in the manifest; records_pack.py writes shards, records_dataset.py reads them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import h5py
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

RECORDS_VERSION = 2
FieldType = Literal["image", "ndarray", "bytes", "text", "int", "tokens"]
ARRAY_DTYPES = ("bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64", "float16",
                "float32", "float64")
TOKEN_DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "int64")
# One field of one sample: a declared shape (or length) beyond this is not a training sample but a hostile or broken
# manifest (8192 x 8192 x 3 pixels are 192 MiB), and the reader would allocate it per sample of a batch.
MAX_FIELD_BYTES = 256 << 20
MAX_FIELDS = 64
MAX_DIMS = 8
FIELD_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


class RecordError(ValueError):
    """A value that does not fit its field; the message starts with the field's name."""


class FieldSpec(BaseModel):
    """One field of a record, as the manifest declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=FIELD_NAME_PATTERN, description="letters, digits, _; the key in each sample")
    type: FieldType
    dtype: str | None = Field(default=None, description="ndarray and tokens: the numpy dtype stored")
    shape: tuple[int, ...] | None = Field(default=None, description="ndarray: the shape of every sample's array")
    length: int | None = Field(default=None, ge=1, description="tokens: every sequence's length; none: any length")

    @model_validator(mode="after")
    def _consistent(self) -> FieldSpec:
        kind = self.type
        if kind in ("ndarray", "tokens"):
            allowed = ARRAY_DTYPES if kind == "ndarray" else TOKEN_DTYPES
            if self.dtype not in allowed:
                raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(allowed)} (type {kind})")
        elif self.dtype is not None:
            raise ValueError(f"dtype: only for ndarray and tokens fields, not {kind}")
        if kind == "ndarray":
            if self.shape is None:
                raise ValueError("shape: an ndarray field declares the shape of each sample's array")
            if len(self.shape) > MAX_DIMS or any(dim < 1 for dim in self.shape):
                raise ValueError(f"shape: {list(self.shape)}: at most {MAX_DIMS} dimensions, each >= 1")
        elif self.shape is not None:
            raise ValueError(f"shape: only for ndarray fields, not {kind}")
        if self.length is not None and kind != "tokens":
            raise ValueError(f"length: only for tokens fields, not {kind}")
        if self.fixed and self.sample_bytes > MAX_FIELD_BYTES:
            raise ValueError(f"{'shape' if kind == 'ndarray' else 'length'}: {self.sample_bytes} bytes per sample, "
                             f"more than {MAX_FIELD_BYTES} ({MAX_FIELD_BYTES >> 20} MiB)")
        return self

    @property
    def fixed(self) -> bool:
        """Every sample has the same size: stored as one (n, *shape) array."""
        return self.type in ("int", "ndarray") or (self.type == "tokens" and self.length is not None)

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        """The dtype of the stored column (values for a fixed field, data for a variable one)."""
        if self.type == "int":
            return np.dtype(np.int64)
        if self.dtype is not None:
            return np.dtype(self.dtype)
        return np.dtype(np.uint8)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample's value (fixed fields)."""
        if self.type == "ndarray":
            assert self.shape is not None
            return tuple(self.shape)
        if self.type == "tokens" and self.length is not None:
            return (self.length,)
        return ()

    @property
    def sample_bytes(self) -> int:
        """Bytes of one sample (fixed fields)."""
        return math.prod(self.sample_shape) * self.numpy_dtype.itemsize


def check_fields(fields: Sequence[FieldSpec]) -> list[FieldSpec]:
    """The field list of a records dataset: at least one, at most MAX_FIELDS, names unique."""
    if not fields:
        raise ValueError("fields: a records dataset declares at least one field")
    if len(fields) > MAX_FIELDS:
        raise ValueError(f"fields: {len(fields)} fields, at most {MAX_FIELDS}")
    seen: set[str] = set()
    for number, spec in enumerate(fields):
        if spec.name in seen:
            raise ValueError(f"fields.{number}.name: {spec.name!r} is declared twice")
        seen.add(spec.name)
    return list(fields)


def image_folder_fields(layout: str = "encoded", image_size: int | None = None) -> list[FieldSpec]:
    """What a version-1 (image folder) dataset holds, in these terms: an image and its class. The encoded layout
    stores image bytes (an image field, decoded on read); the decoded layout stores pixels, uint8 (S, S, 3)."""
    if layout == "decoded":
        side = image_size or 1
        image = FieldSpec(name="image", type="ndarray", dtype="uint8", shape=(side, side, 3))
    else:
        image = FieldSpec(name="image", type="image")
    return [image, FieldSpec(name="label", type="int")]


def _integer_array(value: Any, spec: FieldSpec) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        raise RecordError(f"{spec.name}: token ids must be integers, got dtype {array.dtype}")
    if array.ndim != 1:
        raise RecordError(f"{spec.name}: token ids must be one-dimensional, got shape {list(array.shape)}")
    target = spec.numpy_dtype
    if array.size:
        info = np.iinfo(target)
        low, high = int(array.min()), int(array.max())
        if low < info.min or high > info.max:
            raise RecordError(f"{spec.name}: token ids {low}..{high} do not fit {target} ({info.min}..{info.max})")
    return array.astype(target, copy=False)


def encode_value(spec: FieldSpec, value: Any) -> bytes | np.ndarray:
    """A sample's value as stored: bytes for image/bytes/text, an array of the field's dtype and shape otherwise.
    RecordError (naming the field) when the value does not fit the declaration. Image bytes are checked by the
    packer (records_pack.normalize_image), not here."""
    kind = spec.type
    if kind in ("image", "bytes"):
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise RecordError(f"{spec.name}: expected bytes, got {type(value).__name__}")
        payload = bytes(value)
        if kind == "image" and not payload:
            raise RecordError(f"{spec.name}: empty image")
    elif kind == "text":
        if isinstance(value, str):
            try:
                payload = value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RecordError(f"{spec.name}: text is not UTF-8 (an undecodable byte or a lone surrogate at "
                                  f"character {exc.start})") from None
        elif isinstance(value, (bytes, bytearray, memoryview)):
            payload = bytes(value)
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RecordError(f"{spec.name}: text is not UTF-8 (byte {exc.start})") from None
        else:
            raise RecordError(f"{spec.name}: expected text, got {type(value).__name__}")
    elif kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise RecordError(f"{spec.name}: expected an integer, got {type(value).__name__}")
        if not -(1 << 63) <= int(value) < (1 << 63):
            raise RecordError(f"{spec.name}: {value} does not fit int64")
        return np.asarray(int(value), dtype=np.int64)
    elif kind == "ndarray":
        array = np.asarray(value)
        target = spec.numpy_dtype
        if array.dtype != target and not np.can_cast(array.dtype, target, casting="safe"):
            raise RecordError(f"{spec.name}: dtype {array.dtype} does not convert to {target} without loss")
        if array.shape != spec.sample_shape:
            raise RecordError(f"{spec.name}: shape {list(array.shape)}, the field declares {list(spec.sample_shape)}")
        return np.ascontiguousarray(array, dtype=target)
    else:
        array = _integer_array(value, spec)
        if spec.length is not None and len(array) != spec.length:
            raise RecordError(f"{spec.name}: {len(array)} tokens, the field declares length {spec.length}")
        if spec.length is None and array.nbytes > MAX_FIELD_BYTES:
            raise RecordError(f"{spec.name}: {array.nbytes} bytes, more than {MAX_FIELD_BYTES}")
        return np.ascontiguousarray(array)
    if len(payload) > MAX_FIELD_BYTES:
        raise RecordError(f"{spec.name}: {len(payload)} bytes, more than {MAX_FIELD_BYTES}")
    return payload


def encode_record(fields: Sequence[FieldSpec], record: Mapping[str, Any]) -> list[bytes | np.ndarray]:
    """A record (a mapping of every declared field, nothing else) as stored values, in field order."""
    names = {spec.name for spec in fields}
    extra = sorted(set(record) - names)
    if extra:
        raise RecordError(f"{extra[0]}: not a declared field ({', '.join(sorted(names))})")
    values = []
    for spec in fields:
        if spec.name not in record:
            raise RecordError(f"{spec.name}: missing from the record")
        values.append(encode_value(spec, record[spec.name]))
    return values


def decode_text(payload: bytes | memoryview, where: str) -> str:
    """Stored text back as str; a ValueError naming `where` when it is not UTF-8 (a shard written by anything but
    this packer)."""
    try:
        return bytes(payload).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}: text is not UTF-8 (byte {exc.start})") from None


@dataclass
class Column:
    """Where a field's column sits in an open shard."""

    spec: FieldSpec
    offset: int  # byte offset in the file of `values` (fixed) or `data` (variable); contiguous, unfiltered
    offsets: np.ndarray | None = None  # variable fields: sample i is data[offsets[i]:offsets[i + 1]]
    # An image-folder shard (image_folder_columns): its labels are held in memory (read once per shard), and a
    # payload another writer stored chunked or compressed is read through h5py instead of at `offset`.
    values: np.ndarray | None = None
    stored: h5py.Dataset | None = None


def check_column(handle: h5py.File, spec: FieldSpec, count: int, where: str) -> Column:
    """A field's column in a shard of `count` samples, checked against its declaration (dtype, shape, offsets,
    MAX_FIELD_BYTES per sample, contiguous storage); ValueError starting with `where` otherwise. Only this field's
    metadata and offsets are read, never its data."""
    where = f"{where}: field {spec.name}"
    group = handle.get(f"fields/{spec.name}")
    if not isinstance(group, h5py.Group):
        raise ValueError(f"{where}: missing from the shard")
    stored = group.get("values" if spec.fixed else "data")
    if not isinstance(stored, h5py.Dataset):
        raise ValueError(f"{where}: no {'values' if spec.fixed else 'data'} array")
    if stored.dtype != spec.numpy_dtype:
        raise ValueError(f"{where}: stored as {stored.dtype}, the manifest declares {spec.numpy_dtype}")
    expected = (count, *spec.sample_shape) if spec.fixed else (stored.shape[0] if stored.ndim == 1 else -1,)
    if stored.shape != expected:
        raise ValueError(f"{where}: shape {list(stored.shape)}, the manifest implies {list(expected)}")
    if stored.chunks is not None or stored.compression is not None:
        raise ValueError(f"{where}: chunked or compressed (the format stores columns contiguous)")
    offset = stored.id.get_offset()
    if offset is None and stored.size:
        raise ValueError(f"{where}: no contiguous storage")
    column = Column(spec, int(offset or 0))
    if spec.fixed:
        return column
    table = group.get("offsets")
    if not isinstance(table, h5py.Dataset) or table.dtype != np.int64 or table.shape != (count + 1,):
        raise ValueError(f"{where}: offsets are not int64 ({count + 1},)")
    offsets = table[:]
    sizes = np.diff(offsets)
    if offsets[0] != 0 or offsets[-1] != stored.shape[0] or (sizes < 0).any():
        raise ValueError(f"{where}: offsets do not describe {count} samples of the data array")
    if sizes.size and int(sizes.max()) * stored.dtype.itemsize > MAX_FIELD_BYTES:
        raise ValueError(f"{where}: a sample of {int(sizes.max()) * stored.dtype.itemsize} bytes, more than "
                         f"{MAX_FIELD_BYTES}")
    column.offsets = offsets
    return column


def image_folder_columns(handle: h5py.File, layout: str, image_size: int, count: int, where: str) -> dict[str, Column]:
    """A version-1 (image folder) shard of `count` samples as the columns of image_folder_fields(layout,
    image_size): "image" (decoded: images (n, S, S, 3) uint8; encoded: data + offsets) and "label" (labels, held in
    memory). ValueError starting with `where` when the shard disagrees with the manifest."""
    image, label = image_folder_fields(layout, image_size)
    try:
        labels = handle["labels"][:]
        if layout == "decoded":
            payload, offsets = handle["images"], None
            expected = (count, image_size, image_size, 3)
            if payload.shape != expected:
                raise ValueError(f"{where}: images are {payload.shape}, the manifest implies {expected}")
        else:
            payload, offsets = handle["data"], handle["offsets"][:]
            if len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != payload.shape[0]:
                raise ValueError(f"{where}: offsets do not describe {count} samples of the data array")
    except KeyError as exc:
        raise ValueError(f"{where}: missing dataset {exc}") from exc
    if len(labels) != count:
        raise ValueError(f"{where}: {len(labels)} labels, the manifest says {count} samples")
    # The packer keeps payloads contiguous and unfiltered, so h5py only supplies the byte offset and the bytes go
    # straight from the page cache into the batch (about twice as fast as read_direct).
    contiguous = payload.chunks is None and payload.compression is None and payload.dtype == np.uint8
    offset = payload.id.get_offset() if contiguous else None
    return {"image": Column(image, int(offset or 0), offsets, stored=None if offset is not None else payload),
            "label": Column(label, 0, values=labels)}
