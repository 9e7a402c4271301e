"""The trainer's input side: the dataset it opens (a packed dataset through the public data API, or a JPEG
folder), its epoch order and loader, and the record of the dataset a checkpoint keeps (so a resume is refused on
other data)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workloads.data.api import Placement, make_feeder, wait_for_manifest
from workloads.data.api import open_dataset as open_packed
from workloads.data.format.manifest import MANIFEST_NAME
from workloads.data.moving.cache import CacheFeeder
from workloads.data.reading.dataset import (
    DatasetError,
    DataUnavailableError,
    HDF5Dataset,
    JpegFolderDataset,
    make_loader,
)
from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.data.reading.shm import plan_shared_memory, shm_available_bytes
from workloads.train.checkpoint import CheckpointError
from workloads.train.config import ConfigError, TrainConfig, flag_of
from workloads.train.runtime import Distributed, Reporter

MIN_RANK_BATCH = 2  # samples per rank and step the sampler keeps to (a tail step is merged into the one before)


def open_dataset(config: TrainConfig) -> HDF5Dataset | JpegFolderDataset:
    path = Path(config.data)
    manifest = path if path.name == MANIFEST_NAME else path / MANIFEST_NAME
    if config.wait_for_data_s > 0 and not wait_for_manifest(manifest, config.wait_for_data_s, config.stager_timeout_s):
        folder = path.is_dir() and any(entry.is_dir() and not entry.name.startswith(".") for entry in path.iterdir())
        if not folder:
            raise DataUnavailableError(f"{manifest}: did not appear within {config.wait_for_data_s:g}s "
                                       "(--wait-for-data); is the staging sidecar running?")
    if os.path.lexists(manifest):
        dataset = open_packed(path, image_size=config.image_size, shard_wait_s=config.shard_wait_s,
                              stager_timeout_s=config.stager_timeout_s, decode_cache=config.decode_cache,
                              decode_cache_bytes=config.decode_cache_bytes)
        if not isinstance(dataset, HDF5Dataset):  # a records dataset
            dataset.close()
            raise DatasetError(f"{manifest}: a records dataset (fields {', '.join(dataset.field_names)}); the bundled "
                               "trainer trains image classification on image-folder packs: train it with your own "
                               "script through workloads.data.api (see examples/)")
        return dataset
    if path.is_dir():
        return JpegFolderDataset(path, image_size=config.image_size or 256)
    if not path.exists():
        raise DatasetError(f"{path}: no such file or directory")
    raise DatasetError(f"{path}: neither a packed dataset (manifest.json) nor a folder of class sub-folders")


@dataclass
class TrainData:
    dataset: HDF5Dataset | JpegFolderDataset
    sampler: ElasticBatchSampler
    loader: Any
    feeder: CacheFeeder | None  # this node's plan for its staging cache (local rank 0 only)


def prepare_data(config: TrainConfig, env: Distributed, device: torch.device, reporter: Reporter) -> TrainData:
    """Dataset index, sampler, shared-memory check and loader (the study's data_preparation)."""
    dataset = open_dataset(config)
    placement = Placement(env.rank, env.world_size, env.local_rank, env.local_world_size)
    # A folder of files is one "shard": its samples are shuffled one by one across the whole folder.
    try:
        sampler = ElasticBatchSampler(
            dataset.shard_sizes if isinstance(dataset, HDF5Dataset) else [len(dataset)],
            config.batch_size,
            seed=config.seed,
            shuffle_shards=config.shuffle_shards,
            block_size=config.block_size,
            canonical_nodes=config.canonical_nodes or placement.nodes,
            rank=placement.rank,
            world_size=placement.world_size,
            local_world_size=placement.local_world_size,
            min_rank_batch=MIN_RANK_BATCH,  # BatchNorm cannot train on a batch of one: no such tail batch
        )
    except ValueError as exc:
        field, _, why = str(exc).partition(": ")
        raise ConfigError(f"--{field.replace('_', '-')}: {why}" if why else str(exc)) from exc
    batch_bytes = config.batch_size * dataset.image_size * dataset.image_size * 3
    plan = plan_shared_memory(batch_bytes, config.workers, config.prefetch_factor, shm_available_bytes())
    reporter.emit(
        "shm_check",
        transport=plan.transport,
        available_bytes=plan.available_bytes,
        needed_bytes=plan.needed_bytes,
        message=plan.message,
    )
    if plan.transport == "pipe":
        print(f"warning: {plan.message}", file=sys.stderr)
    loader = make_loader(
        dataset,
        sampler,
        workers=config.workers,
        prefetch_factor=config.prefetch_factor,
        multiprocessing_context=config.mp_context,
        persistent_workers=True,
        pin_memory=device.type == "cuda",
        transport=plan.transport,
    )
    feeder = make_feeder(dataset, sampler, placement) if isinstance(dataset, HDF5Dataset) else None
    return TrainData(dataset, sampler, loader, feeder)


def dataset_identity(dataset: HDF5Dataset | JpegFolderDataset) -> dict[str, Any]:
    """What the checkpoint records of the dataset, by content: a packed dataset's layout, classes and every shard's
    sha256 and sample count, in manifest order (the global sample order is a function of exactly these); a folder's
    classes and every file's path and size. `digest` covers all of it."""
    if isinstance(dataset, HDF5Dataset):
        manifest = dataset.manifest
        record: dict[str, Any] = {
            "kind": "packed", "layout": manifest.layout, "classes": list(manifest.classes),
            "num_samples": manifest.num_samples,
            "shards": [[shard.sha256, shard.num_samples] for shard in manifest.shards],
        }
    else:
        files = hashlib.sha256()
        for file, label in dataset.samples:
            relative = os.path.relpath(file, dataset.root)
            try:
                size = os.stat(file).st_size
            except OSError:
                size = -1
            files.update(f"{relative}\t{size}\t{label}\n".encode(errors="surrogateescape"))
        record = {"kind": "folder", "classes": list(dataset.classes), "num_samples": len(dataset),
                  "files": files.hexdigest()}
    record["digest"] = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return record


def identity_difference(saved: dict[str, Any], now: dict[str, Any]) -> str:
    """What differs between two dataset records, in a few words."""
    if saved.get("kind") != now["kind"]:
        return f"a {saved.get('kind')} dataset then, a {now['kind']} one now"
    if saved.get("classes") != now["classes"]:
        return "other classes"
    if saved.get("num_samples") != now["num_samples"]:
        return f"{saved.get('num_samples')} samples then, {now['num_samples']} now"
    if now["kind"] == "folder":
        return "other files (paths or sizes)"
    if saved.get("layout") != now["layout"]:
        return f"layout {saved.get('layout')} then, {now['layout']} now"
    before, after = saved.get("shards") or [], now["shards"]
    if len(before) != len(after):
        return f"{len(before)} shards then, {len(after)} now (another shard layout)"
    if sorted(map(tuple, before)) == sorted(map(tuple, after)):
        return "the same shards in another order"
    for number, (then, here) in enumerate(zip(before, after, strict=True)):
        if list(then) != list(here):
            return (f"shard {number} differs (sha256 {str(then[0])[:12]}... with {then[1]} samples then, "
                    f"{here[0][:12]}... with {here[1]} now)")
    return "another dataset record"


def position_sampler(sampler: ElasticBatchSampler, epoch: int, resumed_epoch: int,
                     resumed_position: dict[str, Any] | None, where: Path) -> None:
    """Put the sampler at the start of `epoch`, or where the checkpoint (`resumed_position` in `resumed_epoch`)
    stopped inside it."""
    if epoch != resumed_epoch or resumed_position is None:
        sampler.set_epoch(epoch)
        return
    try:
        sampler.load_state_dict(resumed_position)
    except ValueError as exc:
        field, _, why = str(exc).partition(": ")
        flag = flag_of(field) if _is_field(field) else "--resume"
        raise CheckpointError(f"{flag}: {where} stopped mid-epoch {epoch}: {why or exc}; use the same value "
                              "to finish this epoch") from exc


def _is_field(name: str) -> bool:
    try:
        flag_of(name)
    except KeyError:
        return False
    return True


# sun_path holds 107 characters; multiprocessing puts its sockets at <tmp>/pymp-XXXXXXXX/listener-XXXXXXXX.
_SOCKET_PATH_MAX = 107
_WORKER_SOCKET_SUFFIX = len("/pymp-12345678/listener-12345678")


def check_worker_tmpdir(workers: int) -> None:
    """DataLoader workers hand batches over through a Unix socket under the temp dir; past the sun_path limit the
    hand-over fails inside a feeder thread and the trainer waits forever, so a too-long TMPDIR fails now."""
    if workers == 0:
        return
    tmp = tempfile.gettempdir()
    if len(tmp) + _WORKER_SOCKET_SUFFIX > _SOCKET_PATH_MAX:
        limit = _SOCKET_PATH_MAX - _WORKER_SOCKET_SUFFIX
        raise ConfigError(f"TMPDIR: {tmp}: {len(tmp)} characters, too long for the data workers' sockets "
                         f"(at most {limit}); point TMPDIR at a shorter directory or use --workers 0")
