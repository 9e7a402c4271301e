"""The training run: data, model, DDP, timings as JSON lines, checkpoint/resume.

Timings follow the study (pytorch/examples imagenet, instrumented): model_loading, data_preparation, and per
epoch epoch_time with the per-batch split into data_time (waiting for the next batch) and compute_time
(transfer, augmentation, forward, backward, step), plus throughput and GPU utilisation when a GPU is
present.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from workloads.data.api import (
    Placement,
    iter_batches,
    make_feeder,
    wait_for_manifest,
)
from workloads.data.api import open_dataset as open_packed
from workloads.data.format.manifest import MANIFEST_NAME
from workloads.data.moving.cache import CacheFeeder
from workloads.data.reading.dataset import (
    DatasetError,
    DataUnavailableError,
    HDF5Dataset,
    JpegFolderDataset,
    make_loader,
    to_tensors,
)
from workloads.data.reading.records_dataset import RecordsDataset
from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.data.reading.shm import plan_shared_memory, shm_available_bytes
from workloads.data.reading.transforms import random_resized_crop_flip_normalize
from workloads.train.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    CheckpointMirror,
    CheckpointStoreError,
    capture_rng,
    load_checkpoint,
    require_training_state,
    restore_rng,
    save_checkpoint,
)
from workloads.train.metrics import RunShape, TrainMetrics
from workloads.train.models import MODELS


def rank_batch_size(global_batch_size: int, world_size: int) -> int:
    """Each rank's share of a fixed global batch; a world size that does not divide it is a config error."""
    if global_batch_size % world_size:
        raise ConfigError(f"--global-batch-size: {global_batch_size} is not divisible by the world size "
                          f"{world_size} (nodes x processes per node)")
    return global_batch_size // world_size


@dataclass(frozen=True)
class TrainConfig:
    data: str
    model: str = "resnet50"
    epochs: int = 1
    batch_size: int = 256
    # Each step's samples over all ranks; each rank then takes global_batch_size / world_size (batch_size is
    # ignored). Fixed across world sizes, so an elastic gang that shrinks or grows keeps its epoch order and its
    # optimisation (same learning rate, same steps).
    global_batch_size: int | None = None
    workers: int = 4
    prefetch_factor: int = 2
    amp: str | None = None  # "bf16"
    channels_last: bool = False
    width: int = 64  # ResNet stem channels; 64 is the standard model
    crop_size: int = 224
    image_size: int | None = None  # decode size for JPEG sources (encoded shards, folders)
    block_size: int = 1  # samples shuffled in blocks of this many consecutive ones (1: one by one)
    wait_for_data_s: float = 0.0  # wait this long for DATA/manifest.json (a staging sidecar is starting)
    shard_wait_s: float = 3600.0  # staging cache: the longest wait for one shard
    stager_timeout_s: float = 60.0  # staging cache: no stager heartbeat for this long means no stager is running
    decode_cache: str | None = None  # encoded datasets: directory where decoded samples are kept (see decode_cache.py)
    decode_cache_bytes: int | None = None  # its budget
    shuffle_shards: int = 4  # shards whose samples are shuffled together (see workloads/data/reading/sampler.py)
    canonical_nodes: int | None = None  # streams of the epoch order; None: the first run's node count
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    deterministic: bool = False
    checkpoint_dir: str | None = None
    checkpoint_uri: str | None = None  # s3://bucket/prefix: mirror of the checkpoint (pushed on save, pulled on resume)
    checkpoint_every: int = 0  # steps; 0 = only at epoch end
    resume: bool = False
    log_every: int = 10
    mp_context: str | None = None
    stop_after_steps: int | None = None  # SIGKILL itself after this many steps (preemption drills, tests)
    allow_unverified_checkpoint: bool = False  # resume from a checkpoint without a sha256 (older trainers)
    metrics_port: int = 0  # Prometheus endpoint of local rank 0 (rank r: port + r); 0 = not served
    metrics_addr: str = "127.0.0.1"  # a pod listens on 0.0.0.0 (METRICS_ADDR)
    # The longest a collective (all-reduce, barrier) may wait for the other ranks; a lost peer then ends the run
    # (the disruption exit code) instead of hanging it for NCCL's or gloo's own default.
    collective_timeout_s: float = 600.0

    def validate(self) -> None:
        """Every numeric field finite and in range, before anything is read or built (ValueError per field)."""
        positive = ("epochs", "batch_size", "prefetch_factor", "width", "crop_size", "block_size", "shuffle_shards",
                    "log_every")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be a positive integer, got {value!r}")
        for name in ("workers", "checkpoint_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be >= 0, got {value!r}")
        if not isinstance(self.metrics_port, int) or not 0 <= self.metrics_port < 65536:
            raise ConfigError(f"--metrics-port: must be a TCP port (1-65535) or 0 for off, got {self.metrics_port!r}")
        for name, value in (("image_size", self.image_size), ("stop_after_steps", self.stop_after_steps),
                            ("canonical_nodes", self.canonical_nodes), ("global_batch_size", self.global_batch_size)):
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')}: must be positive, got {value!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr: must be a finite number > 0, got {self.lr!r}")
        if not (math.isfinite(self.momentum) and self.momentum >= 0):
            raise ConfigError(f"momentum: must be a finite number >= 0, got {self.momentum!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"weight_decay: must be a finite number >= 0, got {self.weight_decay!r}")
        if (self.decode_cache is None) != (self.decode_cache_bytes is None):
            raise ConfigError("--decode-cache and --decode-cache-size: give both or neither")
        if self.decode_cache_bytes is not None and self.decode_cache_bytes <= 0:
            raise ConfigError(f"--decode-cache-size: must be more than 0 bytes, got {self.decode_cache_bytes!r}")
        if not (math.isfinite(self.wait_for_data_s) and self.wait_for_data_s >= 0):
            raise ConfigError(f"--wait-for-data: must be a finite number of seconds >= 0, got {self.wait_for_data_s!r}")
        for flag, seconds in (("--shard-timeout", self.shard_wait_s), ("--stager-timeout", self.stager_timeout_s),
                              ("--collective-timeout", self.collective_timeout_s)):
            if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
                raise ConfigError(f"{flag}: must be a finite number of seconds > 0, got {seconds!r}")


class ConfigError(ValueError):
    """A bad argument or setting: the CLI exits with the config-error code (the Job fails at once, no retry)."""


class TrainingDiverged(ValueError):
    """The loss became NaN or infinite: the weights would be garbage from here on (a config error: --lr)."""


class Disrupted(BaseException):
    """The run was stopped from outside, not by a fault of its own (a BaseException, like KeyboardInterrupt: no
    `except Exception` on the way turns it into another error): a stop signal (SIGTERM from the kubelet on a
    drain, a Spot notice or a preemption; SIGINT), after which the last checkpoint was written when training had
    started, or a peer rank that was lost. The CLI exits with the disruption code, which the Job does not count."""

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step  # the step the checkpoint holds (None: nothing was written)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """SIGTERM and SIGINT ask the run to stop. Before the first step nothing is lost, so the signal ends the run at
    once (Disrupted); once training runs it only sets a flag: every rank finishes the step in flight, the ranks agree
    on the flag in the step's all-reduce, rank 0 writes the checkpoint (the others wait at a barrier) and they stop.
    A second signal while stopping changes nothing (the checkpoint is not torn)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.immediate = True  # before the training loop: stop where we are
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        self.signum = signum if first else self.signum
        if first and self.immediate:
            raise Disrupted(f"stopped by {signal.Signals(signum).name} before training started (nothing to save)")

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach only the main thread; an embedding caller handles them itself
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: JSON has no such tokens, and log pipelines reject Python's."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


@dataclass(frozen=True)
class Distributed:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int = 1

    @classmethod
    def from_env(cls) -> Distributed:
        """torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE); a plain run is rank 0 of 1."""
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        return cls(
            int(os.environ.get("RANK", 0)),
            world_size,
            int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("LOCAL_WORLD_SIZE", world_size)),
        )

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


class Reporter:
    """JSON lines on stdout, from rank 0 only (every rank's figures are reduced first where it matters)."""

    def __init__(self, rank: int, stream: TextIO | None = None) -> None:
        self.enabled = rank == 0
        self.stream = stream or sys.stdout  # looked up now: whatever stdout is when the run starts

    def emit(self, event: str, **fields: Any) -> None:
        if self.enabled:
            self.stream.write(json.dumps(_json_safe({"event": event, **fields}), allow_nan=False) + "\n")
            self.stream.flush()


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
        if isinstance(dataset, RecordsDataset):
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


def check_checkpoint_dir(directory: str) -> None:
    """A checkpoint directory that cannot hold files fails now, not after an epoch of training."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"--checkpoint-dir: {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}-{random.getrandbits(32):08x}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"--checkpoint-dir: {path}: not writable: {exc.strerror or exc}") from exc


def _batchnorm_training(model: nn.Module, training: bool) -> None:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(training)


def _gpu_utilisation(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.utilization(device))
    except Exception:  # needs NVML (nvidia-ml-py); absent -> not reported
        return None


def _step_seed(seed: int, epoch: int, batch: int, rank: int) -> int:
    """Augmentation randomness as a pure function of the position, so resume needs no generator state."""
    return int(np.random.SeedSequence([seed, epoch, batch, rank]).generate_state(1)[0])


def _configure_determinism(config: TrainConfig) -> None:
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


@dataclass
class _Data:
    dataset: HDF5Dataset | JpegFolderDataset
    sampler: ElasticBatchSampler
    loader: Any
    feeder: CacheFeeder | None  # this node's plan for its staging cache (local rank 0 only)


@dataclass
class _Model:
    model: nn.Module  # what the step calls (DDP-wrapped when distributed)
    core: nn.Module  # what checkpoints hold
    optimizer: torch.optim.Optimizer
    epoch: int = 0
    batch: int = 0
    step: int = 0
    loader: dict[str, Any] | None = None  # the sampler's position in `epoch` (None: its start)
    canonical_nodes: int | None = None  # the stream count the checkpoint's order was made with


def _prepare_data(config: TrainConfig, env: Distributed, device: torch.device, reporter: Reporter) -> _Data:
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
    return _Data(dataset, sampler, loader, feeder)


def _prepare_model(
    config: TrainConfig,
    env: Distributed,
    device: torch.device,
    dataset: HDF5Dataset | JpegFolderDataset,
    reporter: Reporter,
    mirror: CheckpointMirror | None = None,
) -> _Model:
    """Build, move and wrap the model, make the optimiser, and load the checkpoint when resuming."""
    core: nn.Module = MODELS[config.model](len(dataset.classes), config.width).to(device)
    if config.channels_last:
        core = core.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimizer = torch.optim.SGD(
        core.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    state = _Model(model=core, core=core, optimizer=optimizer)
    saved = None
    if config.resume and config.checkpoint_dir:
        if mirror is not None and env.local_rank == 0 and not (Path(config.checkpoint_dir) / CHECKPOINT_NAME).exists():
            # this node's disk is new: continue from the mirror
            pulled = mirror.pull(config.checkpoint_dir, allow_unverified=config.allow_unverified_checkpoint)
            reporter.emit("checkpoint_pulled", uri=config.checkpoint_uri, found=pulled)
        if env.world_size > 1:
            dist.barrier()  # every rank of the node reads the file local rank 0 pulled
        saved = load_checkpoint(
            config.checkpoint_dir, map_location=device, allow_unverified=config.allow_unverified_checkpoint
        )
    if saved is not None:
        where = Path(config.checkpoint_dir or "") / CHECKPOINT_NAME
        require_training_state(saved, where)
        check_resumable(saved, config, env, dataset, where)
        try:
            core.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{where}: does not fit this model: {str(exc).strip().splitlines()[0]}") from exc
        state.epoch, state.batch, state.step = saved["epoch"], saved["batch"], saved["step"]
        state.loader = saved.get("loader")
        state.canonical_nodes = saved.get("canonical_nodes")
        restore_rng(saved["rng"])
        reporter.emit("resumed", epoch=state.epoch, batch=state.batch, step=state.step)
    if env.world_size > 1:
        state.model = DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None)
    return state


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


def _identity_difference(saved: dict[str, Any], now: dict[str, Any]) -> str:
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


def check_resumable(
    saved: dict[str, Any], config: TrainConfig, env: Distributed, dataset: HDF5Dataset | JpegFolderDataset,
    where: Path,
) -> None:
    """A checkpoint of another model, width or dataset is refused (a config error, so the Job fails at once instead
    of retrying), and so is a mid-epoch checkpoint without the loader position an exact resume needs. The dataset
    must be the one the checkpoint records by content (every shard's sha256, sample count and place); a checkpoint
    without such a record is refused. Another world size or batch size is fine: the sampler continues with exactly
    the samples not yet seen."""
    before = saved["config"]
    for name, now in (("model", config.model), ("width", config.width)):
        then = before.get(name, now)
        if then != now:
            raise CheckpointError(f"--{name}: {where} was written with --{name} {then}, this run has {now}")
    identity = saved.get("dataset")
    current = dataset_identity(dataset)
    if not isinstance(identity, dict) or not isinstance(identity.get("digest"), str):
        held = "no record of its dataset" if identity is None else "its dataset only by class names and sample count"
        raise CheckpointError(
            f"--resume: {where} holds {held} (written by an older trainer), so resuming cannot check that "
            f"{config.data} holds the same samples in the same order; resume it with that trainer, or start afresh"
        )
    if identity["digest"] != current["digest"]:
        raise CheckpointError(f"--data: {where} was trained on another dataset than {config.data}: "
                              f"{_identity_difference(identity, current)}")
    if saved["batch"] > 0 and saved["epoch"] < config.epochs and not isinstance(saved.get("loader"), dict):
        raise CheckpointError(
            f"--resume: {where} stopped mid-epoch ({saved['epoch']}, batch {saved['batch']}) without the loader "
            "position this trainer resumes from (written by an older trainer); resume it with that trainer, or "
            "start the epoch again from a checkpoint taken at an epoch end"
        )


def _position_sampler(sampler: ElasticBatchSampler, state: _Model, epoch: int, where: Path) -> None:
    """Put the sampler at the start of `epoch`, or where the checkpoint stopped inside it."""
    if epoch != state.epoch or state.loader is None:
        sampler.set_epoch(epoch)
        return
    try:
        sampler.load_state_dict(state.loader)
    except ValueError as exc:
        field, _, why = str(exc).partition(": ")
        flag = f"--{field.replace('_', '-')}" if field in {f.name for f in fields(TrainConfig)} else "--resume"
        raise CheckpointError(f"{flag}: {where} stopped mid-epoch {epoch}: {why or exc}; use the same value "
                              "to finish this epoch") from exc


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


def train(
    config: TrainConfig, reporter: Reporter | None = None, metrics: TrainMetrics | None = None
) -> dict[str, Any]:
    """Run the configured training; returns the last epoch's summary (also emitted as an "epoch" event).

    `metrics` receives every step's figures (the CLI serves them over HTTP); without it they go to a private
    registry nobody reads, which keeps the loop free of "is monitoring on" branches. SIGTERM and SIGINT stop the
    run after the step in flight with a last checkpoint (StopRequest), raising Disrupted; the previous handlers
    are back when this returns."""
    stop = StopRequest()
    stop.install()
    try:
        return _train(config, reporter, metrics, stop)
    finally:
        stop.restore()


def _train(
    config: TrainConfig, reporter: Reporter | None, metrics: TrainMetrics | None, stop: StopRequest
) -> dict[str, Any]:
    if config.model not in MODELS:
        raise ConfigError(f"--model: unknown model {config.model!r} (choose from {', '.join(MODELS)})")
    if config.amp not in (None, "bf16"):
        raise ConfigError(f"--amp: unsupported {config.amp!r} (only bf16)")
    if config.checkpoint_uri and not config.checkpoint_dir:
        # Only a mirror was given: checkpoints are written locally first, then uploaded.
        config = replace(config, checkpoint_dir=str(Path(tempfile.gettempdir()) / "ml-cluster-checkpoints"))
    if config.resume and not config.checkpoint_dir:
        raise ConfigError("--resume: needs --checkpoint-dir or --checkpoint-uri")
    config.validate()
    check_worker_tmpdir(config.workers)
    env = Distributed.from_env()
    if config.global_batch_size is not None:
        config = replace(config, batch_size=rank_batch_size(config.global_batch_size, env.world_size))
    if config.checkpoint_dir:
        check_checkpoint_dir(config.checkpoint_dir)
    mirror = CheckpointMirror(config.checkpoint_uri) if config.checkpoint_uri else None
    if mirror is not None and env.local_rank == 0:
        mirror.probe()
    reporter = reporter or Reporter(env.rank)
    metrics = metrics or TrainMetrics()
    if env.world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo",
                                timeout=timedelta(seconds=config.collective_timeout_s))
    device = torch.device(f"cuda:{env.local_rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _configure_determinism(config)
    run_start = time.perf_counter()
    reporter.emit("config", **asdict(config), world_size=env.world_size, device=str(device))

    started = time.perf_counter()
    data = _prepare_data(config, env, device, reporter)
    sampler, loader = data.sampler, data.loader
    reporter.emit(
        "data_preparation",
        seconds=time.perf_counter() - started,
        samples=len(data.dataset),
        image_size=data.dataset.image_size,
        batches_per_epoch=sampler.batches_per_epoch,
    )
    metrics.started(RunShape(epochs=config.epochs, batches_per_epoch=sampler.batches_per_epoch,
                             batch_size=config.batch_size, world_size=env.world_size, rank=env.rank))
    started = time.perf_counter()
    state = _prepare_model(config, env, device, data.dataset, reporter, mirror)
    if config.canonical_nodes is None and state.canonical_nodes is not None:
        sampler.set_canonical_nodes(state.canonical_nodes)  # the resumed run's order, whatever the node count now
    where = Path(config.checkpoint_dir or "") / CHECKPOINT_NAME
    reporter.emit(
        "model_loading",
        seconds=time.perf_counter() - started,
        model=config.model,
        parameters=sum(p.numel() for p in state.core.parameters()),
    )

    identity = dataset_identity(data.dataset)

    # Where this run started and when it took its first step: `submit status` reads them from the first_step event
    # and from every batch event (a log's tail is enough) to report each incident's steps lost and time to resume.
    resumed_from = state.step
    first_step_time: float | None = None

    def checkpoint(epoch: int, batch: int, loader: dict[str, Any] | None) -> float:
        """Rank 0 writes; returns the seconds spent (reported apart from data and compute time)."""
        started = time.perf_counter()
        if config.checkpoint_dir and env.rank == 0:
            try:
                written = save_checkpoint(
                    config.checkpoint_dir,
                    {
                        "model": state.core.state_dict(),
                        "optimizer": state.optimizer.state_dict(),
                        "epoch": epoch,
                        "batch": batch,
                        "step": state.step,
                        "rng": capture_rng(),
                        "config": asdict(config),
                        "world_size": env.world_size,
                        "dataset": identity,
                        "loader": loader,
                        "canonical_nodes": sampler.canonical_nodes,
                    },
                )
            except OSError as exc:  # disk full, quota: the previous checkpoint is still in place
                target = Path(config.checkpoint_dir) / CHECKPOINT_NAME
                raise CheckpointStoreError(f"{target}: cannot write checkpoint: {exc.strerror or exc}") from exc
            wrote = time.perf_counter()
            if mirror is not None:
                mirror.push(written)
            # bytes and seconds (write, then mirror) are what terminationGracePeriodSeconds is sized from
            reporter.emit("checkpoint", epoch=epoch, batch=batch, step=state.step,
                          uploaded=config.checkpoint_uri if mirror is not None else None,
                          bytes=written.stat().st_size, write_seconds=wrote - started,
                          mirror_seconds=time.perf_counter() - wrote if mirror is not None else None)
        return time.perf_counter() - started

    def stop_now(epoch: int, batch: int) -> None:
        """Every rank, after the agreed last step and its checkpoint: rank 0 has written it, the others wait for
        that at the barrier, then all raise Disrupted."""
        name = signal.Signals(stop.signum).name if stop.signum is not None else "a stop on another rank"
        reporter.emit("stopped", reason=name, epoch=epoch, batch=batch, step=state.step,
                      checkpointed=bool(config.checkpoint_dir))
        if env.world_size > 1:
            dist.barrier()
            dist.destroy_process_group()
        saved = f"checkpoint at step {state.step}" if config.checkpoint_dir else "no --checkpoint-dir: nothing saved"
        raise Disrupted(f"stopped by {name} after step {state.step} ({saved})",
                        step=state.step if config.checkpoint_dir else None)

    criterion = nn.CrossEntropyLoss()
    autocast_dtype = torch.bfloat16 if config.amp == "bf16" else None
    input_dtype = autocast_dtype if device.type == "cuda" and autocast_dtype else torch.float32
    summary: dict[str, Any] = {}
    num_classes = len(data.dataset.classes)
    show_progress = env.rank == 0 and sys.stderr.isatty()
    terminal = os.get_terminal_size(sys.stderr.fileno()) if show_progress else os.terminal_size((0, 0))
    state.model.train()
    stop.immediate = False  # from here on a stop signal ends the run at a step boundary, with a checkpoint
    stopping = False  # the ranks' agreed answer (all-reduced every step) to "did any rank get a stop signal?"
    for epoch in range(state.epoch, config.epochs):
        _position_sampler(sampler, state, epoch, where)
        first_batch = state.batch if epoch == state.epoch and state.loader is not None else 0
        iteration_batches = len(sampler)  # what is left of the epoch (all of it, unless resumed mid-epoch)
        if iteration_batches == 0:
            continue
        if data.feeder:
            data.feeder.start_epoch(last_epoch=epoch == config.epochs - 1)
        metrics.epoch_started(epoch, first_batch)
        epoch_start = time.perf_counter()
        data_time = compute_time = checkpoint_time = 0.0
        samples = 0
        utilisation: list[float] = []
        batch_index = first_batch
        progress = tqdm(
            total=first_batch + iteration_batches,
            initial=first_batch,
            desc=f"epoch {epoch + 1}/{config.epochs}",
            unit="batch",
            file=sys.stderr,
            disable=not show_progress,
            dynamic_ncols=terminal.columns > 0,
            ncols=None if terminal.columns > 0 else 100,  # a terminal that reports no size (a bare pty)
            nrows=None if terminal.lines > 0 else 24,  # tqdm hides every bar below nrows, 0 included
            leave=True,
        )
        waited = time.perf_counter()
        for batch in iter_batches(loader):
            got = time.perf_counter()
            images, labels = to_tensors(batch)
            if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
                bad = int(labels.max()) if int(labels.max()) >= num_classes else int(labels.min())
                raise DatasetError(
                    f"{config.data}: label {bad} in epoch {epoch} batch {batch_index}, but the dataset lists "
                    f"{num_classes} classes"
                )
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            generator = torch.Generator().manual_seed(_step_seed(config.seed, epoch, batch_index, env.rank))
            inputs = random_resized_crop_flip_normalize(
                images,
                config.crop_size,
                generator=generator,
                dtype=input_dtype,
                channels_last=config.channels_last,
            )
            # The sampler never makes a step of one sample per rank unless one sample is all that is left (an
            # elastic resume near an epoch's end): BatchNorm then uses its running statistics for this step
            # instead of failing on a batch it cannot normalise.
            lone = len(labels) < min(MIN_RANK_BATCH, config.batch_size)  # --batch-size 1 keeps training BN
            if lone:
                _batchnorm_training(state.core, False)
            try:
                with torch.autocast(
                    device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None
                ):
                    loss = criterion(state.model(inputs), labels)
            finally:
                if lone:
                    _batchnorm_training(state.core, True)
            loss_value = float(loss.detach())
            finite = math.isfinite(loss_value)
            stopping = stop.requested
            if env.world_size > 1:  # every rank stops together, before any rank steps (one collective for both)
                flag = torch.tensor([1.0 if finite else 0.0, -1.0 if stopping else 0.0], device=device)
                dist.all_reduce(flag, op=dist.ReduceOp.MIN)
                finite, stopping = bool(flag[0].item() == 1.0), bool(flag[1].item() < 0)
            if not finite:
                progress.close()
                raise TrainingDiverged(
                    f"loss: not finite ({loss_value}) at epoch {epoch} batch {batch_index} (step {state.step + 1}); "
                    "stopped before updating the weights, the last checkpoint is intact (lower --lr?)"
                )
            state.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            state.optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            done = time.perf_counter()
            step_data, step_compute = got - waited, done - got
            data_time += step_data
            compute_time += step_compute
            samples += len(labels)
            metrics.step(step_data, step_compute, len(labels), loss_value)
            batch_index += 1
            state.step += 1
            if first_step_time is None:
                first_step_time = time.time()
                reporter.emit("first_step", step=state.step, resumed_from=resumed_from, time=first_step_time)
            if state.step % max(1, config.log_every) == 0:
                gpu = _gpu_utilisation(device)
                if gpu is not None:
                    utilisation.append(gpu)
                reporter.emit(
                    "batch",
                    epoch=epoch,
                    batch=batch_index - 1,
                    step=state.step,
                    loss=loss_value,
                    data_time=step_data,
                    compute_time=step_compute,
                    gpu_utilization=gpu,
                    resumed_from=resumed_from,
                    first_step_time=first_step_time,
                )
            progress.set_postfix_str(
                f"loss {loss_value:.4f}, {len(labels) * env.world_size / max(done - waited, 1e-9):.0f} samples/s",
                refresh=False,
            )
            progress.update(1)
            done_in_iteration = batch_index - first_batch
            if data.feeder:
                data.feeder.advance(done_in_iteration)
            epoch_ends = done_in_iteration == iteration_batches
            if (config.checkpoint_every and state.step % config.checkpoint_every == 0 or stopping) and not epoch_ends:
                checkpoint_time += checkpoint(epoch, batch_index, sampler.state_dict(done_in_iteration))
            if stopping and not epoch_ends:
                progress.close()
                stop_now(epoch, batch_index)
            if config.stop_after_steps is not None and state.step >= config.stop_after_steps:
                reporter.emit("killing_self", step=state.step)
                os.kill(os.getpid(), signal.SIGKILL)
            waited = time.perf_counter()
        progress.close()
        epoch_time = time.perf_counter() - epoch_start
        total_samples = samples * env.world_size
        summary = {
            "epoch": epoch,
            "epoch_time": epoch_time,
            "data_time": data_time,
            "compute_time": compute_time,
            "checkpoint_time": checkpoint_time,
            "batches": batch_index - first_batch,
            "samples": total_samples,
            "throughput": total_samples / epoch_time if epoch_time > 0 else 0.0,
            "data_share": data_time / epoch_time if epoch_time > 0 else 0.0,
            "gpu_utilization": sum(utilisation) / len(utilisation) if utilisation else None,
        }
        reporter.emit("epoch", **summary)
        checkpoint(epoch + 1, 0, None)  # after the epoch line: epoch_time above excludes this one
        if stopping and epoch + 1 < config.epochs:  # the agreed stop fell on the epoch's last step
            stop_now(epoch + 1, 0)
    if data.feeder:
        data.feeder.finish()
    metrics.finished()
    reporter.emit("done", total_seconds=time.perf_counter() - run_start, steps=state.step)
    if env.world_size > 1:
        dist.barrier()
        # torn down here, not by the interpreter's exit: a gloo group left to the C++ destructors aborted a finished
        # rank now and then (SIGABRT, "terminate called without an active exception"), which the Job counts
        dist.destroy_process_group()
    return summary
