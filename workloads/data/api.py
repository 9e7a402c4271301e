"""The data path as a library: read a packed dataset from your own training script.

One object, `PackedData`, sets up everything the bundled trainer uses to keep a GPU fed: the HDF5 reader
(`HDF5Dataset`: batched contiguous reads, lazily opened per process), the epoch order (`ElasticBatchSampler`: global,
shard-local, resumable sample-exact with another world size), the staging cache's feeder (it tells the stager which
shards come next, so a budget smaller than the dataset still streams), and a DataLoader wired for uint8 batches:

    from workloads.data.api import LoaderSettings, PackedData

    data = PackedData.open("/data/imagenet", batch_size=256)       # a packed dataset on local disk, or a staged copy
    data = PackedData.open("/scratch/imagenet", batch_size=256,    # through the staging cache, in this process
                           remote="s3://my-bucket/imagenet-hdf5", budget_bytes=50 << 30)
    data = PackedData.from_env(batch_size=256)                     # in a Job: DATA_DIR / DATA_STAGING from the spec

    with data:
        loader = data.loader(LoaderSettings(workers=6))            # once; persistent workers across epochs
        for epoch in range(data.start_epoch, epochs):
            for images, labels in data.batches(epoch):              # uint8 (N, S, S, 3) and int64 (N,)
                ...                                                  # your step
                state = data.state_dict()                           # the position after the batch just trained

A records dataset (image + caption, token sequences, any typed fields: workloads/data/format/records.py) reads the same
way; each batch is then a dict of its fields (or a tuple in the order of `fields`):

    data = PackedData.open("/data/laion-subset", batch_size=256, fields=["image", "caption"])
    for batch in data.batches(epoch):                               # {"image": uint8 (N, S, S, 3), "caption": [str]}
        ...

Resume: `data.load_state_dict(state)` before the loop; `data.start_epoch` is then the saved epoch and
`batches(epoch)` continues after the last batch the state counted. A state is valid for any world size and batch
size (see workloads/data/reading/sampler.py).

Distributed: rank, world size and ranks per node come from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE) unless given. Every rank constructs its own PackedData; ranks must step together (one batch each
per step, as DDP does), because local rank 0 tells the node's stager what the whole node reads next.

Stopping: a pod is stopped with SIGTERM (a drain, a Spot reclaim, a preemption). `StopSignal` turns it into a step
every rank agrees on, your checkpoint, and the exit code the Jobs retry without counting (workloads/train/stop.py):

    with StopSignal() as stop:
        for epoch in range(data.start_epoch, epochs):
            for images, labels in data.batches(epoch):
                ...                                                 # your step
                stop.check(lambda: save(step))                      # the checkpoint callback, then exit 43

Step reports: `StepReport` gives measured goodput the figures the bundled trainer reports (each step's time, its
wait for data, a checkpoint's stall), one line per step (workloads/train/steps.py):

    report = StepReport()
    for images, labels in report.timed(data.batches(epoch)):
        ...                                                 # your step
        report.step(step, samples=len(labels), loss=loss)

Errors: a dataset that cannot be read is a `DatasetError` (a ValueError naming the file: retrying cannot help); data
that is not there now (the stager failed or stopped, a shard not staged in time) is a `DataUnavailableError` (a
RuntimeError: a new pod may succeed); a bad argument is a ValueError naming it. Errors raised in DataLoader workers
come out of `PackedData.batches` (and `iter_batches`) as the same one-line errors.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from workloads.data.epochs import EpochBatches, LoaderSettings, iter_batches, settled_loader
from workloads.data.format.manifest import MANIFEST_NAME, load_manifest
from workloads.data.moving.cache import (
    HEARTBEAT_TIMEOUT_S,
    SHARD_WAIT_S,
    CacheFeeder,
    CacheTooSmall,
    heartbeat_age,
    is_cached,
    read_stager_state,
)
from workloads.data.reading.dataset import (
    Batch,
    DatasetError,
    DataUnavailableError,
    HDF5Dataset,
    to_tensors,
)
from workloads.data.reading.records_dataset import RecordsDataset, pad_sequences, records_to_tensors
from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.data.reading.transforms import random_resized_crop_flip_normalize
from workloads.data.reading.workers import ignore_stop_signals
from workloads.data.stager_process import (
    StagerProcess,
    stager_exit,
    stager_tail,
    start_stager,
    stop_stager,  # noqa: F401  (importable from here, as before)
    stopped_on_error,
)
from workloads.safeio import StateFileError
from workloads.torchenv import torchrun_env
from workloads.train.steps import StepReport
from workloads.train.stop import StopSignal

__all__ = [
    "CacheTooSmall",
    "DataUnavailableError",
    "DatasetError",
    "LoaderSettings",
    "PackedData",
    "Placement",
    "RecordsDataset",
    "StepReport",
    "StopSignal",
    "ignore_stop_signals",
    "iter_batches",
    "make_feeder",
    "make_sampler",
    "open_dataset",
    "pad_sequences",
    "random_resized_crop_flip_normalize",
    "wait_for_manifest",
]
# Also importable from here, as before: HDF5Dataset, Batch, StagerProcess, start_stager, stop_stager, stager_tail.

# How long to wait for a stager to publish the manifest: one this process starts (it must first list the bucket),
# or a staging sidecar of the same pod (it may start after the training container).
STAGER_START_TIMEOUT_S = 600.0
SIDECAR_START_TIMEOUT_S = 1800.0
_NOTICE_AFTER_S = 10.0


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job: torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE, and its
    data-parallel group. Under tensor or context parallelism the ranks of one model replica must see the same
    batch: `dp_rank` / `dp_size` (from a device mesh: `with_mesh`) say which replica this rank belongs to and how
    many there are, and the sampler splits the epoch over replicas only. Without them every rank is a replica."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    dp_rank: int | None = None
    dp_size: int | None = None

    def __post_init__(self) -> None:
        if (self.dp_rank is None) != (self.dp_size is None):
            raise ValueError("dp_rank, dp_size: give both or neither")
        if self.dp_size is not None and self.dp_rank is not None:
            if self.dp_size < 1 or self.world_size % self.dp_size:
                raise ValueError(f"dp_size: {self.dp_size} does not divide the world size {self.world_size}")
            if not 0 <= self.dp_rank < self.dp_size:
                raise ValueError(f"dp_rank: {self.dp_rank} is not in 0..{self.dp_size - 1}")

    @classmethod
    def from_env(cls) -> Placement:
        """torchrun's environment (workloads.torchenv); a plain run is rank 0 of 1."""
        return cls(*torchrun_env())

    def with_mesh(self, mesh: Any, dim: str = "dp") -> Placement:
        """This placement with the data-parallel rank and size of `mesh` (a torch DeviceMesh) along `dim`; the
        mesh's other dimensions (tensor, context parallel) are peers that read identical batches."""
        group = mesh[dim]  # the 1-D sub-mesh of this rank's data-parallel peers
        return replace(self, dp_rank=int(group.get_local_rank()), dp_size=int(group.size()))

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def data_rank(self) -> int:
        """The rank the sampler splits by: the data-parallel rank (the global rank without a group)."""
        return self.rank if self.dp_rank is None else self.dp_rank

    @property
    def data_world_size(self) -> int:
        return self.world_size if self.dp_size is None else self.dp_size

    @property
    def data_local_world_size(self) -> int:
        """Data-parallel replicas per node (model-parallel peers within a node count once)."""
        return max(1, self.local_world_size * self.data_world_size // max(1, self.world_size))


def check_stager_state(root: Path, where: Path) -> None:
    """DataUnavailableError (naming `where`) when the stager serving ROOT wrote that it failed, or when its state
    file cannot be read."""
    try:
        state = read_stager_state(root)
    except StateFileError as exc:
        raise DataUnavailableError(str(exc)) from exc
    if state is not None and state.error:
        raise DataUnavailableError(f"{where}: the stager failed: {state.error}")


def wait_for_manifest(root: str | os.PathLike[str], timeout_s: float,
                      stager_timeout_s: float = HEARTBEAT_TIMEOUT_S,
                      notice_after_s: float = _NOTICE_AFTER_S,
                      owned: Callable[[], str | None] | None = None) -> bool:
    """Wait up to `timeout_s` for a stager to write ROOT/manifest.json; True once it is there. While waiting, the
    stager's state and heartbeat are re-checked (a stager that failed, or none running, is a DataUnavailableError
    at once rather than at the deadline) and the wait is logged to stderr. `owned`: for a stager this process
    started, says why it is gone once it has exited (the child is watched, not a file it may never write)."""
    path = Path(root)
    manifest = path if path.name == MANIFEST_NAME else path / MANIFEST_NAME
    root = manifest.parent
    started = time.monotonic()
    next_notice = started + notice_after_s
    while not os.path.lexists(manifest):
        now = time.monotonic()
        waited = now - started
        if now >= started + timeout_s:
            return False
        gone = owned() if owned is not None else None
        if gone is not None and not os.path.lexists(manifest):
            raise DataUnavailableError(f"{manifest}: not written: {gone}")
        if is_cached(root):
            check_stager_state(root, manifest)
            age = heartbeat_age(root)
            if (waited if age is None else age) > stager_timeout_s:
                raise DataUnavailableError(f"{manifest}: not written, and no stager is running (no heartbeat for "
                                           f"{waited if age is None else age:.0f}s)")
        if now >= next_notice:
            print(f"waiting for {manifest} (a stager writes it; {waited:.0f}s of {timeout_s:g}s)", file=sys.stderr,
                  flush=True)
            next_notice = now + 60.0
        time.sleep(0.05)
    return True


def open_dataset(root: str | os.PathLike[str], *, image_size: int | None = None,
                 shard_wait_s: float = SHARD_WAIT_S, stager_timeout_s: float = HEARTBEAT_TIMEOUT_S,
                 decode_cache: str | os.PathLike[str] | None = None,
                 decode_cache_bytes: int | None = None, fields: Sequence[str] | None = None,
                 as_tuple: bool = False) -> RecordsDataset:
    """The reader of a packed dataset (ROOT holds manifest.json): a local pack, a staged copy, or a directory a
    staging cache fills (detected by ROOT/.cache/: each read then waits for its shard, up to `shard_wait_s`).

    An image-folder pack gives an HDF5Dataset ((images, labels) batches); a records dataset a RecordsDataset (a dict
    of the fields per batch, or with `as_tuple` a tuple in the order of `fields`; see records_dataset.py).
    image_size: the decode size of encoded images (the decoded layout holds one size; asking another is an error).
    decode_cache / decode_cache_bytes: encoded images only: keep decoded samples there for the next epochs.
    fields: a records dataset's fields to read (default all, in manifest order)."""
    manifest_path = Path(root) if Path(root).name == MANIFEST_NAME else Path(root) / MANIFEST_NAME
    try:
        records = load_manifest(manifest_path).layout == "records"
    except (OSError, ValueError):
        records = False  # HDF5Dataset reports what is wrong with the manifest, as one line
    if records:
        dataset: RecordsDataset = RecordsDataset(root, fields=fields, as_tuple=as_tuple, image_size=image_size,
                                                 draft=True, decode_cache=decode_cache,
                                              decode_cache_bytes=decode_cache_bytes, shard_wait_s=shard_wait_s,
                                              stager_timeout_s=stager_timeout_s)
    elif fields is not None or as_tuple:
        raise ValueError(f"fields, as_tuple: {root} is an image-folder pack (images, labels), not a records dataset")
    else:
        dataset = HDF5Dataset(root, image_size=image_size, draft=True, decode_cache=decode_cache,
                              decode_cache_bytes=decode_cache_bytes, shard_wait_s=shard_wait_s,
                              stager_timeout_s=stager_timeout_s)
    if len(dataset) == 0:
        raise DatasetError(f"{dataset.root}: the manifest lists no samples")
    if not dataset.classes and not records:
        raise DatasetError(f"{dataset.root / MANIFEST_NAME}: the manifest lists no classes")
    return dataset


def make_sampler(shard_sizes: Sequence[int], batch_size: int, placement: Placement, *, seed: int = 0,
                 shuffle: bool = True, shuffle_shards: int = 4, block_size: int = 1,
                 canonical_nodes: int | None = None, min_rank_batch: int = 1) -> ElasticBatchSampler:
    """This rank's batch sampler: `batch_size` samples per rank and step; the epoch's order cut into
    `canonical_nodes` streams (default: the node count), each shuffled over spans of `shuffle_shards` shards.
    Keep canonical_nodes fixed across restarts with another node count (a state_dict carries it)."""
    return ElasticBatchSampler(shard_sizes, batch_size, seed=seed, shuffle=shuffle, shuffle_shards=shuffle_shards,
                               block_size=block_size, canonical_nodes=canonical_nodes or placement.nodes,
                               rank=placement.data_rank, world_size=placement.data_world_size,
                               local_world_size=placement.data_local_world_size, min_rank_batch=min_rank_batch)


def make_feeder(dataset: RecordsDataset, sampler: ElasticBatchSampler, placement: Placement) -> CacheFeeder | None:
    """The staging cache's feeder for this node, run by local rank 0 (None elsewhere, and without a cache)."""
    if dataset.cache is None or placement.local_rank != 0:
        return None
    shards = dataset.manifest.shards
    return CacheFeeder(dataset.cache, [shard.path for shard in shards], [shard.bytes for shard in shards], sampler)


@dataclass
class PackedData(EpochBatches):
    """A packed dataset opened for training: reader, sampler, staging-cache feeder and DataLoader (see the module
    docstring). Build it with `PackedData.open` or `PackedData.from_env`."""

    dataset: RecordsDataset
    sampler: ElasticBatchSampler
    placement: Placement
    feeder: CacheFeeder | None = None
    start_epoch: int = 0
    stager_summary: str | None = None  # after close: the last line of the stager this object started
    _loader: DataLoader[Any] | None = None
    _stager: StagerProcess | None = None
    _done: int = 0  # batches of the current iteration handed out (the position state_dict reports)
    _total: int = -1  # batches in the current iteration
    _positioned: bool = False  # load_state_dict set the position of `start_epoch`
    _closed: bool = field(default=False, repr=False)

    # -- construction ---------------------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        batch_size: int,
        remote: str | None = None,
        endpoint_url: str | None = None,
        budget_bytes: int | None = None,
        stager_workers: int = 8,
        image_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_shards: int = 4,
        block_size: int = 1,
        canonical_nodes: int | None = None,
        min_rank_batch: int = 1,
        placement: Placement | None = None,
        wait_for_data_s: float | None = None,
        shard_wait_s: float = SHARD_WAIT_S,
        stager_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        decode_cache: str | os.PathLike[str] | None = None,
        decode_cache_bytes: int | None = None,
        fields: Sequence[str] | None = None,
        as_tuple: bool = False,
    ) -> PackedData:
        """Open the packed dataset in PATH.

        remote: s3://bucket/prefix of the packed dataset. Local rank 0 then starts a stager process
        (`python -m workloads.data stage`) that fetches it into PATH, verified by sha256: all of it (a staged copy)
        or, with `budget_bytes`, at most that many bytes of shards at once, in the order this node reads them (the
        staging cache). endpoint_url: an S3-compatible store (COS, MinIO); credentials and region come from the
        usual AWS environment (AWS_REGION or AWS_DEFAULT_REGION). Without remote, PATH is read as it is: a local
        pack, a copy an init container staged, or a directory a staging sidecar fills.

        wait_for_data_s: how long to wait for PATH/manifest.json (default: 600 s with remote, 1800 s when PATH holds
        a staging sidecar's .cache/ or is the Job's DATA_DIR with DATA_STAGING=cache, else no wait).
        min_rank_batch: the smallest batch a rank may get at an epoch's tail (2 when the model has BatchNorm).
        fields, as_tuple: a records dataset's fields to read, and a tuple in that order instead of a dict. The
        other arguments are open_dataset's and make_sampler's.
        """
        placement = placement or Placement.from_env()
        root = Path(path)
        if budget_bytes is not None and remote is None:
            raise ValueError("budget_bytes: needs remote (the stager fetches from it)")
        if budget_bytes is not None and (not isinstance(budget_bytes, int) or budget_bytes < 1 << 20):
            raise ValueError(f"budget_bytes: must be at least 1 MiB (and the largest shard), got {budget_bytes!r}")
        stager = None
        if remote is not None and placement.local_rank == 0:
            stager = start_stager(remote, root, endpoint_url, budget_bytes, stager_workers)
        with stopped_on_error(stager):
            if wait_for_data_s is None:
                sidecar = is_cached(root) or (os.environ.get("DATA_STAGING") == "cache"
                                              and os.environ.get("DATA_DIR") == str(path))
                wait_for_data_s = (STAGER_START_TIMEOUT_S if remote is not None
                                   else SIDECAR_START_TIMEOUT_S if sidecar else 0.0)
            owned = None if stager is None else functools.partial(stager_exit, stager)
            if wait_for_data_s > 0 and not wait_for_manifest(root, wait_for_data_s, stager_timeout_s, owned=owned):
                raise DataUnavailableError(f"{root / MANIFEST_NAME}: did not appear within {wait_for_data_s:g}s; is "
                                           "the stager running?" + stager_tail(stager))
            if stager is not None and stager.process.poll() not in (None, 0):
                raise DataUnavailableError(f"{remote}: the stager exited with {stager.process.returncode}"
                                           + stager_tail(stager))
            dataset = open_dataset(root, image_size=image_size, shard_wait_s=shard_wait_s,
                                   stager_timeout_s=stager_timeout_s, decode_cache=decode_cache,
                                   decode_cache_bytes=decode_cache_bytes, fields=fields, as_tuple=as_tuple)
            sampler = make_sampler(dataset.shard_sizes, batch_size, placement, seed=seed, shuffle=shuffle,
                                   shuffle_shards=shuffle_shards, block_size=block_size,
                                   canonical_nodes=canonical_nodes, min_rank_batch=min_rank_batch)
            feeder = make_feeder(dataset, sampler, placement)
        return cls(dataset=dataset, sampler=sampler, placement=placement, feeder=feeder, _stager=stager)

    @classmethod
    def from_env(cls, *, batch_size: int, **options: Any) -> PackedData:
        """In a Job rendered from a spec with a dataset: DATA_DIR (its mountPath) and DATA_STAGING (copy, cache or
        none) are set by the renderer; with `staging: cache` the sidecar stager serves this reader."""
        path = os.environ.get("DATA_DIR")
        if not path:
            raise ValueError("DATA_DIR: not set (a Job spec with a dataset sets it to dataset.mountPath)")
        return cls.open(path, batch_size=batch_size, **options)

    # -- reading --------------------------------------------------------------------------------------------------
    @property
    def classes(self) -> list[str]:
        return self.dataset.classes

    @property
    def num_classes(self) -> int:
        return len(self.dataset.classes)

    @property
    def image_size(self) -> int:
        return self.dataset.image_size

    def __len__(self) -> int:
        """Samples in the dataset (all ranks together)."""
        return len(self.dataset)

    def loader(self, settings: LoaderSettings | None = None) -> DataLoader[Any]:
        """The DataLoader over this rank's batches (made once; iterate it through `batches`)."""
        if self._loader is None:
            sample_bytes = (self.dataset.sample_bytes() if self.dataset.reads_records
                            else self.image_size * self.image_size * 3)
            self._loader = settled_loader(self.dataset, self.sampler, settings or LoaderSettings(), sample_bytes,
                                          warn=True)
        return self._loader

    def batches(self, epoch: int, *, last_epoch: bool = False) -> Iterator[Batch]:
        """This rank's batches of `epoch`: (images uint8 (N, S, S, 3), labels int64 (N,)) tensors (a records
        dataset: a dict, or tuple, of its fields; see records_dataset.py), from the epoch's start or, after
        load_state_dict for this epoch, from the saved position. last_epoch: no epoch follows (the stager fetches
        nothing for one)."""
        convert = records_to_tensors if self.dataset.reads_records else to_tensors
        return self._epoch(epoch, last_epoch, convert)

    # -- resume ---------------------------------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """The position after the batches of the current epoch handed out so far (call it after the step of the
        batch just received): any world size or batch size continues from it sample-exact. Once every batch of
        the epoch was handed out, it is the start of the next epoch. batches: how many of this pass's batches were
        trained, for a framework that fetches ahead (Lightning asks for the next batch before the step of this
        one); at most the number handed out."""
        done = self._done if batches is None else batches
        if not isinstance(done, int) or not 0 <= done <= self._done:
            raise ValueError(f"batches: must be an integer in [0, {self._done}] (the batches handed out), "
                             f"got {batches!r}")
        state = self.sampler.state_dict(done)
        if done == self._total:
            state = {**state, "epoch": self.sampler.epoch + 1, "offsets": [0] * len(state["offsets"])}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state_dict: start_epoch becomes its epoch, and batches(start_epoch) goes on after it.
        The saved order's stream count (canonical_nodes) is kept, whatever the node count now."""
        order = state.get("order") if isinstance(state, dict) else None
        if isinstance(order, dict) and isinstance(order.get("canonical_nodes"), int):
            self.sampler.set_canonical_nodes(order["canonical_nodes"])
        self.sampler.load_state_dict(state)
        self.start_epoch = self.sampler.epoch
        self._positioned = True
