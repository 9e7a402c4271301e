"""Datasets that turn stored images into uint8 batches: packed image folders (both layouts) and the study's
baseline, a folder of JPEG files.

HDF5Dataset is the one reader of packed shards (records_dataset.RecordsDataset) with the fields an image folder holds,
image and label, returned as `(images uint8 (N, S, S, 3), labels int64 (N,))`: handles opened lazily per process,
the staging cache's waits and evictions, batched contiguous reads and the decode cache are that reader's.

Use `make_loader` (or pass `collate_fn=keep_batch`): `__getitems__` already returns the collated batch. With
transport="pipe" (see workloads/data/reading/shm.py) batches are numpy arrays, which workers pickle through their
pipe instead of /dev/shm; `to_tensors` turns either into tensors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from workloads.data.format.jpeg import decode_file
from workloads.data.format.manifest import MANIFEST_NAME
from workloads.data.reading.batches import (
    Batch,
    DatasetError,
    DataUnavailableError,
    Transport,
    contiguous_runs,
    to_tensors,
    uint8_batch,
)
from workloads.data.reading.decode_cache import ShardRows
from workloads.data.reading.records_dataset import RecordsDataset
from workloads.data.reading.workers import ignore_stop_signals

__all__ = ["IMAGE_SUFFIXES", "Batch", "DataUnavailableError", "DatasetError", "HDF5Dataset", "JpegFolderDataset",
           "Transport", "contiguous_runs", "keep_batch", "make_loader", "numpy_collate", "to_tensors", "uint8_batch"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class HDF5Dataset(RecordsDataset):
    """Samples of a packed image folder (a directory holding manifest.json, or the manifest path itself).

    decoded layout: images come back as stored (S x S x 3).
    encoded layout: stored bytes are decoded in the calling process (a worker) to image_size x image_size x 3,
    straight into the batch; `draft`, `fast_decode`, `decode_cache` and `decode_cache_bytes` are RecordsDataset's.
    """

    reads_records = False

    def __init__(self, root: str | os.PathLike[str], **options: Any) -> None:
        """options: RecordsDataset's image_size, draft, fast_decode, shard_wait_s, stager_timeout_s, decode_cache and
        decode_cache_bytes (the fields are image and label, the batch a tuple)."""
        super().__init__(root, fields=["image", "label"], as_tuple=True, **options)

    def _check_layout(self) -> None:
        if self.layout == "records":
            names = ", ".join(spec.name for spec in self.manifest.fields or [])
            raise DatasetError(f"{self.root / MANIFEST_NAME}: a records dataset (fields {names}): read it with "
                               "open_dataset or RecordsDataset")

    def _shard_rows(self, shard_index: int) -> ShardRows | None:
        """The decode cache's rows of a shard's images (None: no cache, or no room)."""
        return self._field_rows(shard_index, "image")

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
    process group, out of reach of a SIGTERM or SIGINT sent to it (workloads/data/reading/workers.py).
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
