"""The reader of packed shards: a records dataset (layout "records", records.py) and an image-folder pack (format
version 1, read as the records layout records.image_folder_fields describes: an image and its label), as a dict per
batch, or a tuple in a declared order. HDF5Dataset (dataset.py) is this reader with the fields image and label,
returned as (images, labels).

HDF5 handles are opened lazily in whichever process reads (the object remembers the pid that opened them), so a
dataset can be used in the main process and then handed to fork, spawn or forkserver workers without sharing an HDF5
handle across processes. A staging cache fills the directory while we read (and may evict shards we are done with):
each shard is waited for, and a shard the cache evicted is closed. `__getitems__` turns a batch of indices into runs
of consecutive samples and reads each run of each requested field with one call (each field is its own column in
the shard; an image folder's columns come from records.image_folder_columns); in a DataLoader worker uint8 fields
are written straight into shared memory, so handing them to the main process costs no further copy. Per batch, for
each field:

    image              uint8 (N, S, S, 3), decoded like the encoded layout (centre square, resized to image_size);
                       the decode cache keeps the decoded rows of every image field
    int                int64 (N,)
    ndarray            (N, *shape) of its dtype (an image folder's decoded layout: its pixels, uint8 (N, S, S, 3))
    tokens, length L   (N, L) of its dtype
    tokens, any length a list of N 1-D arrays
    bytes / text       a list of N bytes / str

Fixed-size fields are tensors (numpy arrays with transport "pipe"; `records_to_tensors` turns either into tensors);
uint16 and uint32 come back widened to int32 and int64 (the values are unchanged; torch's unsigned types beyond uint8
lack most operations, embedding lookups included). Variable-length fields stay lists: collate them in the training
step, e.g. `pad_sequences` for token lists, or a tokenizer for captions.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from workloads.data.format.jpeg import decode_into, fast_decoder_available
from workloads.data.format.manifest import FORMAT_NAME, MANIFEST_NAME, Manifest, load_manifest, manifest_error
from workloads.data.format.records import (
    Column,
    FieldSpec,
    check_column,
    decode_text,
    image_folder_columns,
    image_folder_fields,
)
from workloads.data.moving.cache import HEARTBEAT_TIMEOUT_S, SHARD_WAIT_S, CacheReader, CacheStagerError, is_cached
from workloads.data.reading.batches import (
    DatasetError,
    DataUnavailableError,
    Transport,
    contiguous_runs,
    uint8_batch,
)
from workloads.data.reading.decode_cache import DecodeCache, DecodeKey, ShardRows
from workloads.safeio import StateFileError

_WIDEN = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}


@dataclass
class OpenShard:
    """A shard open in this process: its h5py file, a descriptor for the column reads, and where each column is."""

    file: h5py.File
    fd: int
    columns: dict[str, Column]
    where: str  # the shard's path, as errors name it


def _pread_into(fd: int, out: np.ndarray, position: int, where: str) -> None:
    view = memoryview(out.data).cast("B")
    done = 0
    while done < len(view):  # pread may return short counts on very large reads
        read = os.preadv(fd, [view[done:]], position + done)
        if read <= 0:
            raise DatasetError(f"{where}: unexpected end of file")
        done += read


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (an evicted shard fetched again is a new file)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


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


def _load(root: Path) -> Manifest:
    try:
        return load_manifest(root)
    except FileNotFoundError as exc:
        raise DatasetError(f"{root / MANIFEST_NAME}: no manifest (is this a packed dataset?)") from exc
    except StateFileError as exc:
        raise DatasetError(f"{exc.where}: {exc.why}") from exc
    except ValueError as exc:
        raise DatasetError(f"{root / MANIFEST_NAME}: invalid manifest: {manifest_error(exc)}") from exc
    except OSError as exc:
        raise DatasetError(f"{root / MANIFEST_NAME}: cannot read: {exc.strerror or exc}") from exc


class RecordsDataset(Dataset[Any]):
    """Samples of a packed dataset (a directory holding manifest.json, or the manifest path itself): `fields` picks
    (and orders) the fields read, default all in manifest order (an image-folder pack: image, label); `as_tuple`
    returns a tuple in that order instead of a dict.

    image_size: the decode size of image fields (default: the manifest's, else 224); an image folder's decoded layout
    holds one size, and asking another is an error. `draft` allows libjpeg's reduced-scale decoding when the source
    is at least twice that size; `fast_decode` uses simplejpeg where it is installed (workloads/data/format/jpeg.py),
    PIL otherwise; `decode_cache` (a directory, with `decode_cache_bytes` its budget) keeps decoded images for the
    next epochs (workloads/data/reading/decode_cache.py). shard_wait_s, stager_timeout_s: a staging cache's waits.
    """

    reads_records = True  # batches are the fields (a dict, or a tuple); HDF5Dataset says False: (images, labels)

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
        path = Path(root)
        self.root = path.parent if path.name == MANIFEST_NAME else path
        self.manifest: Manifest = _load(self.root)
        self.layout = self.manifest.layout
        self._check_layout()
        if self.layout == "decoded":
            stored = self.manifest.image_size
            if image_size is not None and image_size != stored:
                raise DatasetError(f"{self.root}: decoded shards hold {stored}px images, asked for {image_size}px")
            self.image_size = int(stored or 0)
        else:
            self.image_size = int(image_size or self.manifest.image_size or 224)
        # The fields every shard holds, in order: a records manifest declares them; an image folder is image, label.
        self.declared: list[FieldSpec] = (list(self.manifest.fields) if self.manifest.fields is not None
                                          else image_folder_fields(self.layout, self.image_size))
        self.fields = self._selected(None if fields is None else list(fields))
        self._position = {spec.name: number for number, spec in enumerate(self.declared)}
        self.as_tuple = as_tuple
        self.draft = draft
        self.fast_decode = fast_decode
        self.transport: Transport = "shm"
        self.shard_paths = [self.root / shard.path for shard in self.manifest.shards]
        self.cache = (CacheReader(self.root, heartbeat_timeout_s=stager_timeout_s) if is_cached(self.root)
                      else None)
        self.shard_wait_s = shard_wait_s
        self.shard_starts = [shard.first_index for shard in self.manifest.shards]
        self.shard_sizes = [shard.num_samples for shard in self.manifest.shards]
        self.decoded = self._decode_cache(decode_cache, decode_cache_bytes)
        self._owner_pid: int | None = None
        self._open: dict[int, OpenShard] = {}
        self._rows: dict[int, ShardRows | None] = {}

    def _check_layout(self) -> None:
        """Every layout reads as records; HDF5Dataset refuses a records dataset (its batches are images, labels)."""

    def _selected(self, asked: list[str] | None) -> list[FieldSpec]:
        declared = {spec.name: spec for spec in self.declared}
        if asked is None:
            return list(declared.values())
        if not asked:
            raise ValueError("fields: name at least one field")
        for name in asked:
            if name not in declared:
                raise ValueError(f"fields: {name!r} is not a field of {self.root} ({', '.join(declared)})")
        if len(set(asked)) != len(asked):
            raise ValueError(f"fields: a field is named twice: {asked}")
        return [declared[name] for name in asked]

    @property
    def field_names(self) -> list[str]:
        return [spec.name for spec in self.fields]

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

    def sample_bytes(self) -> int:
        """Bytes of one sample's fixed-size fields as read (what a batch puts in shared memory)."""
        size = self.image_size
        return sum(size * size * 3 if spec.type == "image" else spec.sample_bytes for spec in self.fields
                   if spec.type == "image" or spec.fixed)

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_owner_pid"] = None
        state["_open"] = {}
        state["_rows"] = {}
        return state

    # -- the decode cache -------------------------------------------------------------------------------------------
    def _row_id(self, shard_index: int, name: str) -> str:
        """The decode cache's name for one image column of a shard: an image folder's is the shard's sha256 (as the
        cache has always named them); a records shard's also names the field."""
        sha256 = self.manifest.shards[shard_index].sha256
        if self.manifest.fields is None:
            return sha256
        return hashlib.sha256(f"{sha256}/{name}".encode()).hexdigest()

    def _decode_cache(self, directory: str | os.PathLike[str] | None, budget: int | None) -> DecodeCache | None:
        if directory is None:
            return None
        images = [spec.name for spec in self.fields if spec.type == "image"]
        ids = [self._row_id(index, name) for index in range(len(self.manifest.shards)) for name in images]
        if not ids:
            return None  # nothing to decode (decoded pixels are read as stored)
        if budget is None or budget <= 0:
            raise DatasetError(f"{directory}: a decode cache needs a budget in bytes (decode_cache_bytes)")
        decoder = "simplejpeg" if self.fast_decode and fast_decoder_available() else "pil"
        cache = DecodeCache(directory, budget, DecodeKey(self.image_size, self.draft, decoder))
        try:
            cache.prepare(ids)
        except OSError as exc:
            raise DatasetError(f"{directory}: cannot use as the decode cache: {exc.strerror or exc}") from exc
        return cache

    def _field_rows(self, shard_index: int, name: str) -> ShardRows | None:
        if self.decoded is None:
            return None
        key = shard_index * len(self.declared) + self._position[name]
        if key not in self._rows:
            try:
                self._rows[key] = self.decoded.open_shard(self._row_id(shard_index, name),
                                                          self.shard_sizes[shard_index])
            except OSError:
                self.decoded.writable = False
                self._rows[key] = None
        return self._rows[key]

    # -- shards, opened per process ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Close this process's handles (they reopen on the next read)."""
        if self._owner_pid == os.getpid():
            for shard in self._open.values():
                os.close(shard.fd)
                shard.file.close()
            self._close_rows()
        self._open = {}
        self._rows = {}

    def _close_rows(self) -> None:
        for rows in self._rows.values():
            if rows is not None:
                rows.close()

    def _shard(self, shard_index: int) -> OpenShard:
        if self._owner_pid != os.getpid():
            # Inherited through fork: the parent's handles; this process opens its own.
            for inherited in self._open.values():
                os.close(inherited.fd)  # this process's copy of the descriptor only
            self._close_rows()
            self._open = {}
            self._rows = {}
            self._owner_pid = os.getpid()
        shard = self._open.get(shard_index)
        if shard is None:
            if self.cache is not None:
                self._close_evicted()
            shard = self._open_shard(shard_index)
            self._open[shard_index] = shard
        return shard

    def _close_evicted(self) -> None:
        """Close shards the cache has evicted: an open descriptor would keep their blocks allocated on the node's
        disk, past the cache's budget (and a shard fetched again is a new file)."""
        assert self.cache is not None
        try:
            ready = self.cache.ready()
        except StateFileError as exc:
            raise DataUnavailableError(str(exc)) from exc
        stale = [index for index, shard in self._open.items()
                 if self.manifest.shards[index].path not in ready or not _same_file(shard.fd, self.shard_paths[index])]
        for index in stale:
            shard = self._open.pop(index)
            os.close(shard.fd)
            shard.file.close()

    def _open_shard(self, shard_index: int) -> OpenShard:
        path = self.shard_paths[shard_index]
        if self.cache is not None:
            try:
                self.cache.wait_ready(self.manifest.shards[shard_index].path, timeout=self.shard_wait_s)
            except (TimeoutError, CacheStagerError, StateFileError) as exc:
                text = str(exc)
                raise DataUnavailableError(text if text.startswith(str(path)) else f"{path}: {text}") from exc
        try:
            handle = h5py.File(path, "r")
        except OSError as exc:
            raise DatasetError(f"{path}: cannot open shard: {exc}") from exc
        try:
            columns = self._columns(handle, shard_index)
        except ValueError as exc:
            handle.close()
            raise DatasetError(str(exc)) from None
        return OpenShard(file=handle, fd=os.open(path, os.O_RDONLY), columns=columns, where=str(path))

    def _columns(self, handle: h5py.File, shard_index: int) -> dict[str, Column]:
        """Validate a shard against the format and the manifest, and find its columns: a records shard's declared
        fields, or an image folder's image and label (through the column adapter)."""
        path, count = self.shard_paths[shard_index], self.shard_sizes[shard_index]
        if handle.attrs.get("format") != FORMAT_NAME or handle.attrs.get("layout") != self.layout:
            raise ValueError(f"{path}: not a {FORMAT_NAME} shard of layout {self.layout}")
        if self.manifest.fields is None:
            return image_folder_columns(handle, self.layout, self.image_size, count, str(path))
        return {spec.name: check_column(handle, spec, count, str(path)) for spec in self.fields}

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        shard_index = bisect.bisect_right(self.shard_starts, index) - 1
        return shard_index, index - self.shard_starts[shard_index]

    def _shard_runs(self, indices: Sequence[int]) -> Iterator[tuple[int, int, int, int]]:
        """(position in batch, shard, first local index, length): contiguous runs split at shard boundaries."""
        for position, first, length in contiguous_runs(indices):
            while length > 0:
                shard_index, local = self._locate(first)
                take = min(length, self.shard_sizes[shard_index] - local)
                yield position, shard_index, local, take
                position, first, length = position + take, first + take, length - take

    # -- batches ----------------------------------------------------------------------------------------------------
    def _empty_batch(self, count: int) -> dict[str, Any]:
        """The batch's buffers: uint8 fields (images, an image folder's pixels) in shared memory in a worker."""
        size, batch = self.image_size, dict[str, Any]()
        for spec in self.fields:
            if spec.type == "image":
                batch[spec.name] = uint8_batch((count, size, size, 3), self.transport)
            elif spec.fixed and spec.numpy_dtype == np.uint8:
                batch[spec.name] = uint8_batch((count, *spec.sample_shape), self.transport)
            elif spec.fixed:
                batch[spec.name] = np.empty((count, *spec.sample_shape), dtype=spec.numpy_dtype)
            else:
                batch[spec.name] = [None] * count
        return batch

    def _read_batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """The requested fields of `indices`, each run of consecutive samples read with one call per field (the
        loop runs once per run of a shuffled batch, often a single sample: fixed-size reads are inline)."""
        batch = self._empty_batch(len(indices))
        # Once per batch, not per run: how each field is read, and a numpy view of its buffer.
        plan = [(spec.name, spec.type == "image", spec.fixed,
                 value.numpy() if isinstance(value, torch.Tensor) else value)
                for spec, value in zip(self.fields, batch.values(), strict=True)]
        for position, shard_index, local, length in self._shard_runs(indices):
            shard = self._shard(shard_index)
            stop = position + length
            for name, image, fixed, out in plan:
                column = shard.columns[name]
                if fixed:
                    if column.values is not None:  # held in memory (an image folder's labels)
                        out[position:stop] = column.values[local : local + length]
                    elif column.stored is not None:  # not contiguous: through h5py
                        column.stored.read_direct(out[position:stop], source_sel=np.s_[local : local + length])
                    else:  # a run of the C-contiguous batch buffer of the field's dtype: rows of out.strides[0]
                        _pread_into(shard.fd, out[position:stop], column.offset + local * out.strides[0], shard.where)
                elif image:
                    self._decode_images(shard_index, shard, column, out[position:stop], local)
                else:
                    out[position:stop] = self._variable(shard_index, shard, column, local, length)
        return batch

    def __getitems__(self, indices: Sequence[int]) -> Any:
        batch = self._read_batch(indices)
        if self.transport != "pipe":
            batch = {name: _tensor(value) if isinstance(value, np.ndarray) else value for name, value in batch.items()}
        return tuple(batch.values()) if self.as_tuple else batch

    def __getitem__(self, index: int) -> Any:
        batch = self.__getitems__([index])
        values = batch if self.as_tuple else batch.values()
        sample = [value[0] if not isinstance(value, np.ndarray) else torch.as_tensor(value[0]) for value in values]
        return tuple(sample) if self.as_tuple else dict(zip(self.field_names, sample, strict=True))

    # -- columns ----------------------------------------------------------------------------------------------------
    def _blob(self, shard_index: int, shard: OpenShard, column: Column, first: int, stop: int) -> np.ndarray:
        """data[offsets[first]:offsets[stop]] of a variable column, in one read."""
        assert column.offsets is not None
        dtype = column.spec.numpy_dtype
        begin, end = int(column.offsets[first]), int(column.offsets[stop])
        blob = np.empty(end - begin, dtype=dtype)
        if column.stored is not None:
            column.stored.read_direct(blob, source_sel=np.s_[begin:end])
        else:
            _pread_into(shard.fd, blob, column.offset + begin * dtype.itemsize, str(self.shard_paths[shard_index]))
        return blob

    def _variable(self, shard_index: int, shard: OpenShard, column: Column, local: int,
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

    def _decode_images(self, shard_index: int, shard: OpenShard, column: Column, out: np.ndarray,
                       local: int) -> None:
        """Samples [local, local + len(out)) of an image column into `out`: kept rows are read back from the decode
        cache, the others are read from the shard in one call, decoded, and kept when the decode cache has room."""
        rows = self._field_rows(shard_index, column.spec.name)
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
                raise DatasetError(f"{self.shard_paths[shard_index]}: {self._sample_name(column, local + k)} "
                                   f"does not decode: {exc}") from exc
            cache = self.decoded
            if rows is not None and cache is not None and cache.writable:
                try:
                    rows.write(local + k, out[k])
                except OSError:
                    cache.writable = False  # a full file system: keep decoding, keep reading what is there

    def _sample_name(self, column: Column, index: int) -> str:
        """How an error names a sample: an image folder's by its number, a records dataset's with its field."""
        return f"sample {index}" if self.manifest.fields is None else f"field {column.spec.name}, sample {index}"
