"""Train on a mixture of packed datasets: `MixedData`, the mixture's `PackedData` (workloads/data/api.py).

    from workloads.data.mixed import MixedData, MixtureSource

    sources = [MixtureSource("/data/web", weight=0.7), MixtureSource("/data/code", weight=0.3)]
    data = MixedData.open(sources, batch_size=256)                  # local packs (or staged copies)
    data = MixedData.open([MixtureSource(remote="s3://b/web", weight=0.7),  # staged through ONE staging cache:
                           MixtureSource(remote="s3://b/code", weight=0.3)],  # the budget is shared by the sources
                          batch_size=256, staging_dir="/scratch/mix", budget_bytes=50 << 30)
    with data:
        data.loader(LoaderSettings(workers=6))
        for epoch in range(data.start_epoch, epochs):
            for images, labels, sources in data.batches(epoch):     # image packs: + int64 (N,) source of each
                ...                                                 # records: the dict gains "source"
                state = data.state_dict()

A source's share is a weight, a fixed number of `samples` per epoch or `repeat` (times its size), optionally capped
(`cap`); `epoch_samples` sets the epoch's size (default: the weighted sources' samples together, plus the fixed
ones). The order is a pure function of (seed, epoch, shares, source sizes), each global batch holds every source's
share to within one sample, and a state resumes sample-exact on any world size (workloads/data/reading/mixture.py).

The sources must read alike: all image-folder packs of one image size and the same classes, or all records
datasets whose read fields (`fields`, default all) agree in name, type, dtype and shape. Anything else is refused
with the first source that differs. Either every source has a `remote` (one stager, started by local rank 0, stages
them into STAGING_DIR/0, /1, ... with one budget: the plan lists every source's shards in the order the mixture first
uses them, workloads/data/moving/mixture_stage.py) or none has.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from workloads.data.api import (
    SIDECAR_START_TIMEOUT_S,
    STAGER_START_TIMEOUT_S,
    LoaderSettings,
    Placement,
    StagerProcess,
    check_stager_state,
    open_dataset,
    stager_tail,
    start_stager,
)
from workloads.data.epochs import EpochBatches, settled_loader
from workloads.data.format.manifest import MANIFEST_NAME
from workloads.data.moving.cache import HEARTBEAT_TIMEOUT_S, SHARD_WAIT_S, CacheFeeder, CacheReader
from workloads.data.moving.mixture_stage import SourceCache, source_dir
from workloads.data.reading.dataset import (
    DatasetError,
    DataUnavailableError,
    Transport,
    uint8_batch,
)
from workloads.data.reading.mixture import MixtureBatchSampler, MixtureShare
from workloads.data.reading.records_dataset import RecordsDataset, records_to_tensors
from workloads.data.stager_process import stopped_on_error

SOURCE_FIELD = "source"


@dataclass(frozen=True)
class MixtureSource:
    """One source of a mixture: a packed dataset at `path` (local), or at `remote` (s3://bucket/prefix, staged), and
    its share of an epoch (one of weight, samples, repeat; none: weight 1), optionally capped."""

    path: str | None = None
    remote: str | None = None
    weight: float | None = None
    samples: int | None = None
    repeat: float | None = None
    cap: int | None = None

    @property
    def share(self) -> MixtureShare:
        return MixtureShare(weight=self.weight, samples=self.samples, repeat=self.repeat, cap=self.cap)


def _describe(dataset: RecordsDataset) -> Any:
    if dataset.reads_records:
        return ("records", [spec.model_dump() for spec in dataset.fields], dataset.image_size)
    return ("images", dataset.image_size, dataset.classes)


def check_agree(datasets: Sequence[RecordsDataset]) -> None:
    """Refuse sources that do not read alike (the first that differs from source 0, naming what differs)."""
    first = _describe(datasets[0])
    for number, dataset in enumerate(datasets[1:], start=1):
        this = _describe(dataset)
        if this[0] != first[0]:
            raise DatasetError(f"sources[{number}]: {dataset.root} is a {this[0]} dataset, sources[0] a {first[0]} "
                               "dataset: a mixture's sources must read alike")
        if this != first:
            what = ("fields" if this[0] == "records" and this[1] != first[1] else
                    "image size" if this[-1 if this[0] == "records" else 1] != first[-1 if first[0] == "records"
                                                                              else 1] else "classes")
            raise DatasetError(f"sources[{number}]: {dataset.root}: its {what} differ from sources[0]'s "
                               f"({datasets[0].root}): a mixture's sources must read alike")
    if first[0] == "records" and SOURCE_FIELD in [spec["name"] for spec in first[1]]:
        raise DatasetError(f"fields: {SOURCE_FIELD!r} is a field of {datasets[0].root}; a mixture's batches carry "
                           f"the source of each sample under that name: read the other fields (fields=[...])")


class MixtureDataset(Dataset[Any]):
    """The sources' samples laid end to end (source k's sample i is `starts[k] + i`); each batch of global indices
    is read from every source in runs, as the single dataset reads, and carries the source of each sample."""

    def __init__(self, datasets: Sequence[RecordsDataset]) -> None:
        check_agree(datasets)
        self.datasets = list(datasets)
        self.sizes = [len(d) for d in self.datasets]
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        self.records = self.datasets[0].reads_records
        self._transport: Transport = "shm"
        for dataset in self.datasets:
            dataset.transport = "pipe"  # numpy from each source, copied once into the batch

    @property
    def transport(self) -> Transport:
        return self._transport

    @transport.setter
    def transport(self, value: Transport) -> None:
        self._transport = value

    def __len__(self) -> int:
        return int(sum(self.sizes))

    def sample_bytes(self) -> int:
        first = self.datasets[0]
        return first.sample_bytes() if first.reads_records else first.image_size ** 2 * 3

    def __getitems__(self, indices: Sequence[int]) -> Any:
        index = np.asarray(indices, dtype=np.int64)
        owners = np.searchsorted(self.starts, index, side="right") - 1
        parts = []
        for source, dataset in enumerate(self.datasets):
            positions = np.flatnonzero(owners == source)
            if len(positions):
                parts.append((positions, dataset.__getitems__((index[positions] - self.starts[source]).tolist())))
        batch = self._merge_records(len(index), parts) if self.records else self._merge_images(len(index), parts)
        sources = owners if self._transport == "pipe" else torch.from_numpy(owners)
        if isinstance(batch, dict):
            return {**batch, SOURCE_FIELD: sources}
        return (*batch, sources)

    def _merge_images(self, count: int, parts: list[tuple[np.ndarray, Any]]) -> tuple[Any, Any]:
        size = self.datasets[0].image_size
        images = uint8_batch((count, size, size, 3), self._transport)
        out = images.numpy() if isinstance(images, torch.Tensor) else images
        labels = np.empty(count, dtype=np.int64)
        for positions, (part_images, part_labels) in parts:
            out[positions] = part_images
            labels[positions] = part_labels
        return images, labels if self._transport == "pipe" else torch.from_numpy(labels)

    def _merge_records(self, count: int, parts: list[tuple[np.ndarray, Any]]) -> Any:
        first = self.datasets[0]
        assert first.reads_records
        merged: dict[str, Any] = {}
        for number, spec in enumerate(first.fields):
            values = [(positions, part[number] if first.as_tuple else part[spec.name]) for positions, part in parts]
            if spec.type == "image" or spec.fixed:
                sample = values[0][1]
                if spec.type == "image":
                    column: Any = uint8_batch((count, *sample.shape[1:]), self._transport)
                    target = column.numpy() if isinstance(column, torch.Tensor) else column
                else:
                    column = target = np.empty((count, *sample.shape[1:]), dtype=sample.dtype)
                for positions, value in values:
                    target[positions] = value
                if spec.type != "image" and self._transport != "pipe":
                    column = records_to_tensors({spec.name: column})[spec.name]
            else:
                column = [None] * count
                for positions, value in values:
                    for position, item in zip(positions.tolist(), value, strict=True):
                        column[position] = item
            merged[spec.name] = column
        return tuple(merged.values()) if first.as_tuple else merged

    def close(self) -> None:
        for dataset in self.datasets:
            dataset.close()


def _wait_for_sources(staging: Path, count: int, timeout_s: float, stager: StagerProcess | None) -> None:
    """Wait for STAGING/k/manifest.json of every source; fail at once when the stager failed or exited."""
    deadline = time.monotonic() + timeout_s
    manifests = [source_dir(staging, k) / MANIFEST_NAME for k in range(count)]
    while not all(os.path.lexists(path) for path in manifests):
        check_stager_state(staging, staging)
        if stager is not None and stager.process.poll() not in (None, 0):
            raise DataUnavailableError(f"{staging}: the stager exited with {stager.process.returncode}"
                                       + stager_tail(stager))
        if time.monotonic() > deadline:
            missing = next(path for path in manifests if not os.path.lexists(path))
            raise DataUnavailableError(f"{missing}: did not appear within {timeout_s:g}s; is the stager running?"
                                       + stager_tail(stager))
        time.sleep(0.05)


@dataclass
class MixedData(EpochBatches):
    """A mixture of packed datasets opened for training (see the module docstring); build it with `open`."""

    dataset: MixtureDataset
    sampler: MixtureBatchSampler
    placement: Placement
    feeder: CacheFeeder | None = None
    start_epoch: int = 0
    stager_summary: str | None = None
    _loader: DataLoader[Any] | None = None
    _stager: StagerProcess | None = None
    _done: int = 0
    _total: int = -1
    _positioned: bool = False
    _closed: bool = field(default=False, repr=False)

    @classmethod
    def open(cls, sources: Sequence[MixtureSource], *, batch_size: int, staging_dir: str | os.PathLike[str] | None
             = None, endpoint_url: str | None = None, budget_bytes: int | None = None, stager_workers: int = 8,
             epoch_samples: int | None = None, image_size: int | None = None, seed: int = 0, shuffle: bool = True,
             shuffle_shards: int = 4, block_size: int = 1, min_rank_batch: int = 1,
             placement: Placement | None = None, wait_for_data_s: float = STAGER_START_TIMEOUT_S,
             shard_wait_s: float = SHARD_WAIT_S, stager_timeout_s: float = HEARTBEAT_TIMEOUT_S,
             fields: Sequence[str] | None = None, as_tuple: bool = False, stager: bool = True) -> MixedData:
        """Open every source and the mixture's sampler. staging_dir, endpoint_url, budget_bytes, stager_workers:
        remote sources' shared staging (see the module docstring); stager=False: a staging sidecar serves
        staging_dir (the Job spec's dataset.mixture); the others are PackedData.open's."""
        placement = placement or Placement.from_env()
        sources = list(sources)
        if not sources:
            raise ValueError("sources: a mixture needs at least one source")
        remotes = [s.remote for s in sources]
        for number, source in enumerate(sources):
            if (source.path is None) == (source.remote is None):
                raise ValueError(f"sources[{number}]: give path (a local pack) or remote (staged), one of them")
        staged = remotes[0] is not None
        if any((remote is not None) != staged for remote in remotes):
            raise ValueError("sources: every source has a remote (staged together) or none has")
        if staged and staging_dir is None:
            raise ValueError("staging_dir: needed with remote sources (the shared staging cache lives there)")
        if budget_bytes is not None and not staged:
            raise ValueError("budget_bytes: needs remote sources (the stager fetches from them)")
        staging = Path(staging_dir) if staging_dir is not None else None
        process = None
        if staged and stager and placement.local_rank == 0:
            assert staging is not None
            process = start_stager([str(r) for r in remotes], staging, endpoint_url, budget_bytes, stager_workers)
        with stopped_on_error(process):
            if staging is not None:
                _wait_for_sources(staging, len(sources), wait_for_data_s, process)
            roots = ([source_dir(staging, k) for k in range(len(sources))] if staging is not None
                     else [Path(str(s.path)) for s in sources])
            datasets = [open_dataset(root, image_size=image_size, shard_wait_s=shard_wait_s,
                                     stager_timeout_s=stager_timeout_s, fields=fields, as_tuple=as_tuple)
                        for root in roots]
            if staging is not None:
                for k, dataset in enumerate(datasets):
                    dataset.cache = SourceCache(CacheReader(staging, heartbeat_timeout_s=stager_timeout_s),  # type: ignore[assignment]
                                                k)
            mixture = MixtureDataset(datasets)
            sampler = MixtureBatchSampler([d.shard_sizes for d in datasets], [s.share for s in sources], batch_size,
                                          epoch_samples=epoch_samples, seed=seed, shuffle=shuffle,
                                          shuffle_shards=shuffle_shards, block_size=block_size, rank=placement.rank,
                                          world_size=placement.world_size,
                                          local_world_size=placement.local_world_size,
                                          min_rank_batch=min_rank_batch)
            feeder = None
            if staging is not None and placement.local_rank == 0:
                names = [f"{k}/{shard.path}" for k, d in enumerate(datasets) for shard in d.manifest.shards]
                sizes = [shard.bytes for d in datasets for shard in d.manifest.shards]
                feeder = CacheFeeder(CacheReader(staging, heartbeat_timeout_s=stager_timeout_s), names, sizes,
                                     sampler)
        return cls(dataset=mixture, sampler=sampler, placement=placement, feeder=feeder, _stager=process)

    @classmethod
    def from_env(cls, *, batch_size: int, **options: Any) -> MixedData:
        """In a Job whose spec has dataset.mixture: DATA_DIR (where the sidecar stages the sources) and DATA_MIXTURE
        (each source's uri and share, JSON) are set by the renderer; the pod's staging sidecar serves them."""
        path, text = os.environ.get("DATA_DIR"), os.environ.get("DATA_MIXTURE")
        if not path or not text:
            raise ValueError("DATA_DIR, DATA_MIXTURE: not set (a Job spec with dataset.mixture sets them)")
        try:
            sources = [MixtureSource(remote=item["uri"], weight=item.get("weight"), samples=item.get("samples"),
                                     repeat=item.get("repeat"), cap=item.get("cap")) for item in json.loads(text)]
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"DATA_MIXTURE: not a list of sources with uri and share ({exc})") from None
        options.setdefault("wait_for_data_s", SIDECAR_START_TIMEOUT_S)
        return cls.open(sources, batch_size=batch_size, staging_dir=path, stager=False, **options)

    def __len__(self) -> int:
        """Samples of one epoch of the mixture (all ranks together)."""
        return self.sampler.epoch_samples

    @property
    def epoch_samples(self) -> list[int]:
        """Samples each source gives to every epoch."""
        return list(self.sampler.counts)

    def loader(self, settings: LoaderSettings | None = None) -> DataLoader[Any]:
        """The DataLoader over this rank's batches (made once; iterate it through `batches`)."""
        if self._loader is None:
            self._loader = settled_loader(self.dataset, self.sampler, settings or LoaderSettings(),
                                          self.dataset.sample_bytes(), warn=False)
        return self._loader

    def batches(self, epoch: int, *, last_epoch: bool = False) -> Iterator[Any]:
        """This rank's batches of `epoch` (from the saved position after load_state_dict): image packs give
        (images, labels, sources), records a dict with "source" added (a tuple: sources last)."""
        if self.dataset.records:
            return self._epoch(epoch, last_epoch, records_to_tensors)
        return self._epoch(epoch, last_epoch, lambda batch: tuple(torch.as_tensor(v) for v in batch))

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches handed out so far: any world size continues from it sample-exact."""
        state = self.sampler.state_dict(self._done)
        if self._done == self._total:
            zeros = [0] * len(self.sampler.counts)
            state = {**state, "epoch": self.sampler.epoch + 1, "consumed": zeros,
                     "plan": {"start": zeros, "global_batch": self.sampler.batch_size * self.sampler.world_size}}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self.start_epoch = self.sampler.epoch
        self._positioned = True
