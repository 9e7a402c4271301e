"""The reader of a records dataset (layout "records", records.py): a dict per batch, or a tuple in a declared order.

Built on HDF5Dataset, so everything else is the same: handles opened lazily per process, the staging cache's wait
for each shard and its evictions, the sampler's batches of indices read as runs of consecutive samples. Only the
requested fields are read (each is its own column in the shard). Per batch, for each field:

    image              uint8 (N, S, S, 3), decoded like the encoded layout (centre square, resized to image_size);
                       the decode cache keeps the decoded rows of every image field
    int                int64 (N,)
    ndarray            (N, *shape) of its dtype
    tokens, length L   (N, L) of its dtype
    tokens, any length a list of N 1-D arrays
    bytes / text       a list of N bytes / str

Fixed-size fields are tensors (numpy arrays with transport "pipe"; `records_to_tensors` turns either into tensors);
uint16 and uint32 come back widened to int32 and int64 (the values are unchanged; torch's unsigned types beyond uint8
lack most operations, embedding lookups included). Variable-length fields stay lists: collate them in the training
step, e.g. `pad_sequences` for token lists, or a tokenizer for captions.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
import torch

from workloads.data.format.jpeg import decode_into
from workloads.data.format.manifest import FORMAT_NAME
from workloads.data.format.records import Column, FieldSpec, check_column, decode_text
from workloads.data.moving.cache import HEARTBEAT_TIMEOUT_S, SHARD_WAIT_S
from workloads.data.reading.dataset import DatasetError, HDF5Dataset, _OpenShard, uint8_batch
from workloads.data.reading.decode_cache import ShardRows

_WIDEN = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}


@dataclass
class _RecordShard(_OpenShard):
    columns: dict[str, Column] = field(default_factory=dict)


def _pread_into(fd: int, out: np.ndarray, position: int, where: str) -> None:
    view = memoryview(out.data).cast("B")
    done = 0
    while done < len(view):  # pread may return short counts on very large reads
        read = os.preadv(fd, [view[done:]], position + done)
        if read <= 0:
            raise DatasetError(f"{where}: unexpected end of file")
        done += read


def _tensor(array: np.ndarray) -> torch.Tensor:
    widened = _WIDEN.get(array.dtype)
    return torch.from_numpy(array.astype(widened) if widened is not None else array)


def records_to_tensors(batch: Any) -> Any:
    """A batch of RecordsDataset (dict or tuple) with every fixed-size field as a tensor (numpy arrays from the pipe
    transport are wrapped, widened as the module says); lists stay lists."""
    def convert(value: Any) -> Any:
        return _tensor(value) if isinstance(value, np.ndarray) else value
    if isinstance(batch, dict):
        return {name: convert(value) for name, value in batch.items()}
    return tuple(convert(value) for value in batch)


def pad_sequences(sequences: Sequence[Any], pad_value: int = 0, length: int | None = None) -> tuple[torch.Tensor,
                                                                                                     torch.Tensor]:
    """Variable-length token lists -> (int64 (N, L) padded with pad_value, int64 (N,) lengths); L is the longest
    (or `length`, which cuts longer ones). A `length` that is not a whole number of 0 or more is a ValueError."""
    if length is not None and (isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 0):
        raise ValueError(f"pad_sequences: length must be a whole number of 0 or more, got {length!r}")
    lengths = torch.tensor([len(seq) for seq in sequences], dtype=torch.int64)
    width = int(lengths.max()) if length is None and len(sequences) else (length or 0)
    padded = torch.full((len(sequences), width), pad_value, dtype=torch.int64)
    for row, seq in enumerate(sequences):
        values = torch.as_tensor(np.asarray(seq[:width], dtype=np.int64))
        padded[row, : len(values)] = values
    return padded, lengths.clamp(max=width)


class RecordsDataset(HDF5Dataset):
    """Samples of a records dataset: `fields` picks (and orders) the fields read, default all in manifest order;
    `as_tuple` returns a tuple in that order instead of a dict. The other arguments are HDF5Dataset's (image_size:
    the decode size of image fields, default 224)."""

    reads_records = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        fields: Sequence[str] | None = None,
        as_tuple: bool = False,
        image_size: int | None = None,
        draft: bool = True,
        fast_decode: bool = True,
        shard_wait_s: float = SHARD_WAIT_S,
        stager_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        decode_cache: str | os.PathLike[str] | None = None,
        decode_cache_bytes: int | None = None,
    ) -> None:
        if isinstance(fields, str):
            raise ValueError(f"fields: a list of field names, not the string {fields!r}")
        self._asked = list(fields) if fields is not None else None
        self.as_tuple = as_tuple
        super().__init__(root, image_size=image_size, draft=draft, fast_decode=fast_decode, shard_wait_s=shard_wait_s,
                         stager_timeout_s=stager_timeout_s, decode_cache=decode_cache,
                         decode_cache_bytes=decode_cache_bytes)
        self.fields = self._selected()

    def _selected(self) -> list[FieldSpec]:
        declared = {spec.name: spec for spec in self.manifest.fields or []}
        if self._asked is None:
            return list(declared.values())
        if not self._asked:
            raise ValueError("fields: name at least one field")
        for name in self._asked:
            if name not in declared:
                raise ValueError(f"fields: {name!r} is not a field of {self.root} ({', '.join(declared)})")
        if len(set(self._asked)) != len(self._asked):
            raise ValueError(f"fields: a field is named twice: {self._asked}")
        return [declared[name] for name in self._asked]

    @property
    def field_names(self) -> list[str]:
        return [spec.name for spec in self.fields]

    def sample_bytes(self) -> int:
        """Bytes of one sample's fixed-size fields as read (what a batch puts in shared memory)."""
        size = self.image_size
        return sum(size * size * 3 if spec.type == "image" else spec.sample_bytes for spec in self.fields
                   if spec.type == "image" or spec.fixed)

    def _position(self, name: str) -> int:
        return [spec.name for spec in self.manifest.fields or []].index(name)

    def _row_id(self, shard_index: int, name: str) -> str:
        return hashlib.sha256(f"{self.manifest.shards[shard_index].sha256}/{name}".encode()).hexdigest()

    def _cache_ids(self) -> list[str]:
        images = [spec.name for spec in self._selected() if spec.type == "image"]
        return [self._row_id(index, name) for index in range(len(self.manifest.shards)) for name in images]

    def _check_shard(self, handle: h5py.File, shard_index: int) -> _OpenShard:
        path, count = self.shard_paths[shard_index], self.shard_sizes[shard_index]
        if handle.attrs.get("format") != FORMAT_NAME or handle.attrs.get("layout") != "records":
            raise DatasetError(f"{path}: not a {FORMAT_NAME} shard of layout records")
        try:
            columns = {spec.name: check_column(handle, spec, count, str(path)) for spec in self.fields}
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
        first = next(iter(columns))
        return _RecordShard(file=handle, payload=handle[f"fields/{first}"], payload_offset=None,
                            fd=os.open(path, os.O_RDONLY), labels=np.empty(0, dtype=np.int64), offsets=None,
                            columns=columns)

    def __getitems__(self, indices: Sequence[int]) -> Any:
        count, size = len(indices), self.image_size
        batch: dict[str, Any] = {}
        for spec in self.fields:
            if spec.type == "image":
                batch[spec.name] = uint8_batch((count, size, size, 3), self.transport)
            elif spec.fixed:
                batch[spec.name] = np.empty((count, *spec.sample_shape), dtype=spec.numpy_dtype)
            else:
                batch[spec.name] = [None] * count
        for position, shard_index, local, length in self._shard_runs(indices):
            shard = self._shard(shard_index)
            assert isinstance(shard, _RecordShard)
            for spec in self.fields:
                column, value = shard.columns[spec.name], batch[spec.name]
                if spec.type == "image":
                    pixels = value.numpy() if isinstance(value, torch.Tensor) else value
                    self._decode_images(shard_index, shard, column, pixels[position : position + length], local)
                elif spec.fixed:
                    _pread_into(shard.fd, value[position : position + length],
                                column.offset + local * spec.sample_bytes, str(self.shard_paths[shard_index]))
                else:
                    value[position : position + length] = self._variable(shard_index, shard, column, local, length)
        if self.transport != "pipe":
            batch = {name: _tensor(value) if isinstance(value, np.ndarray) else value for name, value in batch.items()}
        return tuple(batch.values()) if self.as_tuple else batch

    def __getitem__(self, index: int) -> Any:
        batch = self.__getitems__([index])
        values = batch if self.as_tuple else batch.values()
        sample = [value[0] if not isinstance(value, np.ndarray) else torch.as_tensor(value[0]) for value in values]
        return tuple(sample) if self.as_tuple else dict(zip(self.field_names, sample, strict=True))

    def _blob(self, shard_index: int, shard: _RecordShard, column: Column, first: int, stop: int) -> np.ndarray:
        """data[offsets[first]:offsets[stop]] of a variable column, in one read."""
        assert column.offsets is not None
        dtype = column.spec.numpy_dtype
        begin, end = int(column.offsets[first]), int(column.offsets[stop])
        blob = np.empty(end - begin, dtype=dtype)
        _pread_into(shard.fd, blob, column.offset + begin * dtype.itemsize, str(self.shard_paths[shard_index]))
        return blob

    def _variable(self, shard_index: int, shard: _RecordShard, column: Column, local: int,
                  length: int) -> list[Any]:
        assert column.offsets is not None
        blob = self._blob(shard_index, shard, column, local, local + length)
        begin = int(column.offsets[local])
        kind, values = column.spec.type, list[Any]()
        for k in range(length):
            start, stop = int(column.offsets[local + k]) - begin, int(column.offsets[local + k + 1]) - begin
            piece = blob[start:stop]
            if kind == "tokens":
                values.append(piece.copy())
            elif kind == "text":
                try:
                    values.append(decode_text(piece.data, f"{self.shard_paths[shard_index]}: field "
                                                          f"{column.spec.name}, sample {local + k}"))
                except ValueError as exc:
                    raise DatasetError(str(exc)) from None
            else:
                values.append(piece.tobytes())
        return values

    def _decode_images(self, shard_index: int, shard: _RecordShard, column: Column, out: np.ndarray,
                       local: int) -> None:
        """Like HDF5Dataset._decode_run for one image field: kept rows read back, the others read in one call,
        decoded, and kept when the decode cache has room."""
        rows = self._field_rows(shard_index, column)
        missing = list(range(len(out))) if rows is None else rows.read(local, out)
        if not missing:
            return
        assert column.offsets is not None
        blob = self._blob(shard_index, shard, column, local + missing[0], local + missing[-1] + 1)
        begin = int(column.offsets[local + missing[0]])
        for k in missing:
            start = int(column.offsets[local + k]) - begin
            stop = int(column.offsets[local + k + 1]) - begin
            try:
                decode_into(blob.data[start:stop], out[k], draft=self.draft, use_simplejpeg=self.fast_decode)
            except OSError as exc:
                raise DatasetError(f"{self.shard_paths[shard_index]}: field {column.spec.name}, sample {local + k} "
                                   f"does not decode: {exc}") from exc
            cache = self.decoded
            if rows is not None and cache is not None and cache.writable:
                try:
                    rows.write(local + k, out[k])
                except OSError:
                    cache.writable = False

    def _field_rows(self, shard_index: int, column: Column) -> ShardRows | None:
        if self.decoded is None:
            return None
        key = shard_index * (len(self.manifest.fields or []) or 1) + self._position(column.spec.name)
        if key not in self._rows:
            try:
                self._rows[key] = self.decoded.open_shard(self._row_id(shard_index, column.spec.name),
                                                          self.shard_sizes[shard_index])
            except OSError:
                self.decoded.writable = False
                self._rows[key] = None
        return self._rows[key]
