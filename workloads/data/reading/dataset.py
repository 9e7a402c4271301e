"""Datasets that turn stored images into uint8 batches: packed HDF5 shards (both layouts) and the study's
baseline, a folder of JPEG files.

HDF5 handles are opened lazily in whichever process reads (the object remembers the pid that opened them),
so a dataset can be used in the main process and then handed to fork, spawn or forkserver workers without
sharing an HDF5 handle across processes. `__getitems__` turns a batch of indices into runs of consecutive
samples and reads each run with one call; in a DataLoader worker the batch is written straight into shared
memory, so handing it to the main process costs no further copy.

Use `make_loader` (or pass `collate_fn=keep_batch`): `__getitems__` already returns the collated batch
`(images uint8 (N, S, S, 3), labels int64 (N,))`. With transport="pipe" (see workloads/data/reading/shm.py) batches
are numpy arrays, which workers pickle through their pipe instead of /dev/shm; `to_tensors` turns either
into tensors.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from workloads.data.format.jpeg import decode_file, decode_into, fast_decoder_available
from workloads.data.format.manifest import (
    FORMAT_NAME,
    MANIFEST_NAME,
    Manifest,
    load_manifest,
    manifest_error,
)
from workloads.data.moving.cache import HEARTBEAT_TIMEOUT_S, SHARD_WAIT_S, CacheReader, CacheStagerError, is_cached
from workloads.data.reading.decode_cache import DecodeCache, DecodeKey, ShardRows
from workloads.safeio import StateFileError
from workloads.train.stop import ignore_stop_signals

Batch = tuple[torch.Tensor, torch.Tensor]
Transport = Literal["shm", "pipe"]
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class DatasetError(ValueError):
    """A dataset that cannot be read; the message names the file. A config error: retrying cannot help."""


class DataUnavailableError(RuntimeError):
    """The data cannot be read now, though nothing says it is wrong: the staging cache's stager failed, stopped or
    left a state that cannot be served, or a shard was not staged in time. A runtime failure: a retry (a new pod,
    with a new stager) may succeed. The message names the file waited for."""


def uint8_batch(shape: Sequence[int], transport: Transport = "shm") -> torch.Tensor | np.ndarray:
    """An uninitialised uint8 batch: in a worker with the shm transport it is allocated in shared memory, so
    returning it costs no copy; with the pipe transport it is a numpy array (pickled through the pipe)."""
    if transport == "pipe":
        return np.empty(tuple(shape), dtype=np.uint8)
    if get_worker_info() is None:
        return torch.empty(tuple(shape), dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(tuple(shape))


def to_tensors(batch: Any) -> Batch:
    """(images, labels) as tensors, whichever transport delivered them (numpy arrays are wrapped, not
    copied)."""
    images, labels = batch
    return torch.as_tensor(images), torch.as_tensor(labels)


def _same_file(fd: int, path: Path) -> bool:
    """Whether `fd` is still the file at `path` (an evicted shard fetched again is a new file)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def contiguous_runs(indices: Sequence[int]) -> list[tuple[int, int, int]]:
    """[(position in batch, first index, length)] for maximal runs of consecutive indices, in batch order."""
    runs: list[tuple[int, int, int]] = []
    for position, index in enumerate(indices):
        if runs and runs[-1][1] + runs[-1][2] == index:
            start_position, first, length = runs[-1]
            runs[-1] = (start_position, first, length + 1)
        else:
            runs.append((position, int(index), 1))
    return runs


@dataclass
class _OpenShard:
    file: h5py.File
    payload: h5py.Dataset  # "images" (decoded) or "data" (encoded)
    payload_offset: int | None  # byte offset of a contiguous payload in the file: read it with pread
    fd: int
    labels: np.ndarray
    offsets: np.ndarray | None

    def read_into(self, out: np.ndarray, first: int, item_bytes: int) -> None:
        """Fill `out` (C-contiguous) with payload items [first, first + len(out)) in one read."""
        if self.payload_offset is None:
            self.payload.read_direct(out, source_sel=np.s_[first : first + len(out)])
            return
        view = memoryview(out.data).cast("B")
        position, done = self.payload_offset + first * item_bytes, 0
        while done < len(view):  # pread may return short counts on very large reads
            read = os.preadv(self.fd, [view[done:]], position + done)
            if read <= 0:
                raise OSError(f"{self.file.filename}: unexpected end of file")
            done += read


class HDF5Dataset(Dataset[tuple[torch.Tensor, int]]):
    """Samples of a packed dataset (a directory holding manifest.json, or the manifest path itself).

    decoded layout: images come back as stored (S x S x 3).
    encoded layout: stored bytes are decoded in the calling process (a worker) to image_size x image_size x 3,
    straight into the batch; `draft` allows libjpeg's reduced-scale decoding when the source is at least twice that
    size; `fast_decode` uses simplejpeg where it is installed (workloads/data/format/jpeg.py), PIL otherwise;
    `decode_cache` (a directory, with `decode_cache_bytes` its budget) keeps decoded samples for the next epochs
    (workloads/data/reading/decode_cache.py).
    """

    reads_records = False  # the subclass for layout records (records_dataset.py) says True

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        image_size: int | None = None,
        draft: bool = True,
        fast_decode: bool = True,
        shard_wait_s: float = SHARD_WAIT_S,
        stager_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        decode_cache: str | os.PathLike[str] | None = None,
        decode_cache_bytes: int | None = None,
    ) -> None:
        path = Path(root)
        self.root = path.parent if path.name == MANIFEST_NAME else path
        try:
            self.manifest: Manifest = load_manifest(self.root)
        except FileNotFoundError as exc:
            raise DatasetError(f"{self.root / MANIFEST_NAME}: no manifest (is this a packed dataset?)") from exc
        except StateFileError as exc:
            raise DatasetError(f"{exc.where}: {exc.why}") from exc
        except ValueError as exc:
            raise DatasetError(f"{self.root / MANIFEST_NAME}: invalid manifest: {manifest_error(exc)}") from exc
        except OSError as exc:
            raise DatasetError(f"{self.root / MANIFEST_NAME}: cannot read: {exc.strerror or exc}") from exc
        self.layout = self.manifest.layout
        if (self.layout == "records") != self.reads_records:
            names = ", ".join(spec.name for spec in self.manifest.fields or [])
            raise DatasetError(f"{self.root / MANIFEST_NAME}: a records dataset (fields {names}): read it with "
                               "open_dataset or RecordsDataset" if self.layout == "records" else
                               f"{self.root / MANIFEST_NAME}: layout {self.layout}, not a records dataset: read it "
                               "with open_dataset or HDF5Dataset")
        if self.layout == "decoded":
            stored = self.manifest.image_size
            if image_size is not None and image_size != stored:
                raise DatasetError(f"{self.root}: decoded shards hold {stored}px images, asked for {image_size}px")
            self.image_size = int(stored or 0)
        else:
            self.image_size = int(image_size or self.manifest.image_size or 224)
        self.draft = draft
        self.fast_decode = fast_decode
        self.transport: Transport = "shm"
        self.shard_paths = [self.root / shard.path for shard in self.manifest.shards]
        # A staging cache fills this directory while we read (and may evict shards we are done with): wait for each.
        self.cache = (CacheReader(self.root, heartbeat_timeout_s=stager_timeout_s) if is_cached(self.root)
                      else None)
        self.shard_wait_s = shard_wait_s
        self.shard_starts = [shard.first_index for shard in self.manifest.shards]
        self.shard_sizes = [shard.num_samples for shard in self.manifest.shards]
        self.decoded = self._decode_cache(decode_cache, decode_cache_bytes)
        self._owner_pid: int | None = None
        self._open: dict[int, _OpenShard] = {}
        self._rows: dict[int, ShardRows | None] = {}

    def _cache_ids(self) -> list[str]:
        """What the decode cache keeps rows of, one id per stored image column of a shard: the shard's sha256 (an
        encoded shard has one image column; decoded shards are read as stored: nothing to keep)."""
        return [shard.sha256 for shard in self.manifest.shards] if self.layout == "encoded" else []

    def _decode_cache(self, directory: str | os.PathLike[str] | None, budget: int | None) -> DecodeCache | None:
        if directory is None:
            return None
        ids = self._cache_ids()
        if not ids:
            return None
        if budget is None or budget <= 0:
            raise DatasetError(f"{directory}: a decode cache needs a budget in bytes (decode_cache_bytes)")
        decoder = "simplejpeg" if self.fast_decode and fast_decoder_available() else "pil"
        cache = DecodeCache(directory, budget, DecodeKey(self.image_size, self.draft, decoder))
        try:
            cache.prepare(ids)
        except OSError as exc:
            raise DatasetError(f"{directory}: cannot use as the decode cache: {exc.strerror or exc}") from exc
        return cache

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_owner_pid"] = None
        state["_open"] = {}
        state["_rows"] = {}
        return state

    @property
    def classes(self) -> list[str]:
        return list(self.manifest.classes)

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

    def _shard(self, shard_index: int) -> _OpenShard:
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

    def _open_shard(self, shard_index: int) -> _OpenShard:
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
            return self._check_shard(handle, shard_index)
        except (KeyError, DatasetError) as exc:
            handle.close()
            if isinstance(exc, DatasetError):
                raise
            raise DatasetError(f"{path}: missing dataset {exc}") from exc

    def _check_shard(self, handle: h5py.File, shard_index: int) -> _OpenShard:
        """Validate a shard against the format and the manifest, then describe it for reading."""
        path, count = self.shard_paths[shard_index], self.shard_sizes[shard_index]
        if handle.attrs.get("format") != FORMAT_NAME or handle.attrs.get("layout") != self.layout:
            raise DatasetError(f"{path}: not a {FORMAT_NAME} shard of layout {self.layout}")
        labels = handle["labels"][:]
        if self.layout == "decoded":
            payload, offsets = handle["images"], None
            expected = (count, self.image_size, self.image_size, 3)
            if payload.shape != expected:
                raise DatasetError(f"{path}: images are {payload.shape}, the manifest implies {expected}")
        else:
            payload, offsets = handle["data"], handle["offsets"][:]
            if len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != payload.shape[0]:
                raise DatasetError(f"{path}: offsets do not describe {count} samples of the data array")
        if len(labels) != count:
            raise DatasetError(f"{path}: {len(labels)} labels, the manifest says {count} samples")
        # The format keeps payloads contiguous and unfiltered, so h5py only supplies the byte offset and
        # the bytes go straight from the page cache into the batch (about twice as fast as read_direct).
        contiguous = payload.chunks is None and payload.compression is None and payload.dtype == np.uint8
        return _OpenShard(
            file=handle,
            payload=payload,
            payload_offset=payload.id.get_offset() if contiguous else None,
            fd=os.open(path, os.O_RDONLY),
            labels=labels,
            offsets=offsets,
        )

    def _locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for {len(self)} samples")
        shard_index = bisect.bisect_right(self.shard_starts, index) - 1
        return shard_index, index - self.shard_starts[shard_index]

    def _shard_runs(self, indices: Sequence[int]) -> Iterator[tuple[int, int, int, int]]:
        """(position in batch, shard, first local index, length): contiguous runs split at shard
        boundaries."""
        for position, first, length in contiguous_runs(indices):
            while length > 0:
                shard_index, local = self._locate(first)
                take = min(length, self.shard_sizes[shard_index] - local)
                yield position, shard_index, local, take
                position, first, length = position + take, first + take, length - take

    def __getitems__(self, indices: Sequence[int]) -> tuple[Any, Any]:
        size = self.image_size
        images = uint8_batch((len(indices), size, size, 3), self.transport)
        labels = np.empty(len(indices), dtype=np.int64)
        out = images.numpy() if isinstance(images, torch.Tensor) else images
        for position, shard_index, local, length in self._shard_runs(indices):
            shard = self._shard(shard_index)
            labels[position : position + length] = shard.labels[local : local + length]
            if self.layout == "decoded":
                shard.read_into(out[position : position + length], local, size * size * 3)
                continue
            self._decode_run(shard_index, shard, out[position : position + length], local)
        if self.transport == "pipe":
            return images, labels
        return images, torch.from_numpy(labels)

    def _decode_run(self, shard_index: int, shard: _OpenShard, out: np.ndarray, local: int) -> None:
        """Samples [local, local + len(out)) of an encoded shard into `out`: kept rows are read back, the others
        are read from the shard in one call, decoded, and kept when the decode cache has room."""
        rows = self._shard_rows(shard_index)
        missing = list(range(len(out))) if rows is None else rows.read(local, out)
        if not missing:
            return
        assert shard.offsets is not None
        first, last = local + missing[0], local + missing[-1]
        begin, end = int(shard.offsets[first]), int(shard.offsets[last + 1])
        blob = np.empty(end - begin, dtype=np.uint8)
        shard.read_into(blob, begin, 1)
        for k in missing:
            start = int(shard.offsets[local + k]) - begin
            stop = int(shard.offsets[local + k + 1]) - begin
            try:
                decode_into(blob.data[start:stop], out[k], draft=self.draft, use_simplejpeg=self.fast_decode)
            except OSError as exc:
                path = self.shard_paths[shard_index]
                raise DatasetError(f"{path}: sample {local + k} does not decode: {exc}") from exc
            cache = self.decoded
            if rows is not None and cache is not None and cache.writable:
                try:
                    rows.write(local + k, out[k])
                except OSError:
                    cache.writable = False  # a full file system: keep decoding, keep reading what is there

    def _shard_rows(self, shard_index: int) -> ShardRows | None:
        if self.decoded is None:
            return None
        if shard_index not in self._rows:
            info = self.manifest.shards[shard_index]
            try:
                self._rows[shard_index] = self.decoded.open_shard(info.sha256, info.num_samples)
            except OSError:
                self.decoded.writable = False
                self._rows[shard_index] = None
        return self._rows[shard_index]

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        images, labels = self.__getitems__([index])
        return torch.as_tensor(images[0]), int(labels[0])


class JpegFolderDataset(Dataset[tuple[torch.Tensor, int]]):
    """The study's baseline: ROOT/<class>/<file>.jpg, one file open and one decode per sample.

    Decoding defaults to what torchvision's ImageFolder does (full-resolution PIL decode); the images then
    get the same resize and the same per-batch device transforms as the HDF5 path. draft=True gives it our
    fast decode.
    """

    def __init__(self, root: str | os.PathLike[str], *, image_size: int = 224, draft: bool = False) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise DatasetError(f"{self.root}: not a directory")
        self.classes = sorted(entry.name for entry in self.root.iterdir() if entry.is_dir())
        self.samples: list[tuple[str, int]] = [
            (str(path), label)
            for label, name in enumerate(self.classes)
            for path in sorted((self.root / name).rglob("*"))
            if path.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.samples:
            raise DatasetError(f"{self.root}: no images found in class subdirectories")
        self.image_size = image_size
        self.draft = draft

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        try:
            pixels = decode_file(path, self.image_size, draft=self.draft)
        except OSError as exc:
            raise DatasetError(f"{path}: does not decode: {exc}") from exc
        return torch.from_numpy(pixels), label


def keep_batch(batch: Any) -> Any:
    """collate_fn for datasets whose `__getitems__` already returns the batch."""
    return batch


def numpy_collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample collation into numpy arrays (the pipe transport: nothing is placed in /dev/shm)."""
    images = np.stack([np.asarray(image) for image, _ in samples])
    return images, np.asarray([label for _, label in samples], dtype=np.int64)


def make_loader(
    dataset: Dataset[Any],
    batch_sampler: Sampler[list[int]],
    *,
    workers: int,
    prefetch_factor: int = 2,
    multiprocessing_context: str | None = None,
    persistent_workers: bool = False,
    pin_memory: bool = False,
    transport: Transport = "shm",
) -> DataLoader[Any]:
    """A DataLoader wired for uint8 batches: batched reads for HDF5, per-sample collation otherwise.

    Batches may arrive as numpy arrays (transport "pipe"); pass them through `to_tensors`. The workers leave the
    process group, out of reach of a SIGTERM or SIGINT sent to it (workloads/train/stop.py).
    """
    batched = hasattr(dataset, "__getitems__")
    if batched:
        dataset.transport = transport  # type: ignore[attr-defined]
    collate = keep_batch if batched else (numpy_collate if transport == "pipe" else None)
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        collate_fn=collate,
        prefetch_factor=prefetch_factor if workers > 0 else None,
        multiprocessing_context=multiprocessing_context if workers > 0 else None,
        persistent_workers=persistent_workers and workers > 0,
        pin_memory=pin_memory,
        # a SIGTERM to the process group must not kill the workers (PyTorch's die of it, which the loader reports
        # as a crash): they leave the group; the main process decides when to stop, and stops them
        worker_init_fn=ignore_stop_signals if workers > 0 else None,
    )
