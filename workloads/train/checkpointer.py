"""The bundled trainer's checkpointer: what a checkpoint holds of a run (model, optimiser, position, RNG, the
dataset's record), when it may be resumed, and writing it (rank 0) and its mirror.

The file format and its atomic install live in workloads/train/checkpoint.py."""

from __future__ import annotations

import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workloads.data.reading.dataset import HDF5Dataset, JpegFolderDataset
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
from workloads.train.config import TrainConfig
from workloads.train.inputs import dataset_identity, identity_difference
from workloads.train.runtime import Distributed, Reporter


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


@dataclass
class TrainState:
    model: nn.Module  # what the step calls (DDP-wrapped when distributed)
    core: nn.Module  # what checkpoints hold
    optimizer: torch.optim.Optimizer
    epoch: int = 0
    batch: int = 0
    step: int = 0
    loader: dict[str, Any] | None = None  # the sampler's position in `epoch` (None: its start)
    canonical_nodes: int | None = None  # the stream count the checkpoint's order was made with


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
                              f"{identity_difference(identity, current)}")
    if saved["batch"] > 0 and saved["epoch"] < config.epochs and not isinstance(saved.get("loader"), dict):
        raise CheckpointError(
            f"--resume: {where} stopped mid-epoch ({saved['epoch']}, batch {saved['batch']}) without the loader "
            "position this trainer resumes from (written by an older trainer); resume it with that trainer, or "
            "start the epoch again from a checkpoint taken at an epoch end"
        )


class Checkpointer:
    """Writes the run's checkpoint (rank 0; the others go on) and its mirror, and restores a run from it."""

    def __init__(self, config: TrainConfig, env: Distributed, reporter: Reporter,
                 mirror: CheckpointMirror | None) -> None:
        self.config = config
        self.env = env
        self.reporter = reporter
        self.mirror = mirror
        self.directory = config.checkpoint_dir
        self.where = Path(config.checkpoint_dir or "") / CHECKPOINT_NAME

    @property
    def enabled(self) -> bool:
        return bool(self.directory)

    def restore(self, state: TrainState, dataset: HDF5Dataset | JpegFolderDataset, device: torch.device) -> None:
        """Load the checkpoint into `state` when resuming (pulled from the mirror first when this node's disk has
        none); nothing to resume leaves `state` at its start."""
        config, env = self.config, self.env
        if not (config.resume and self.directory):
            return
        if self.mirror is not None and env.local_rank == 0 and not self.where.exists():
            # this node's disk is new: continue from the mirror
            pulled = self.mirror.pull(self.directory, allow_unverified=config.allow_unverified_checkpoint)
            self.reporter.emit("checkpoint_pulled", uri=config.checkpoint_uri, found=pulled)
        if env.world_size > 1:
            dist.barrier()  # every rank of the node reads the file local rank 0 pulled
        saved = load_checkpoint(self.directory, map_location=device,
                                allow_unverified=config.allow_unverified_checkpoint)
        if saved is None:
            return
        require_training_state(saved, self.where)
        check_resumable(saved, config, env, dataset, self.where)
        try:
            state.core.load_state_dict(saved["model"])
            state.optimizer.load_state_dict(saved["optimizer"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{self.where}: does not fit this model: {str(exc).strip().splitlines()[0]}") from exc
        state.epoch, state.batch, state.step = saved["epoch"], saved["batch"], saved["step"]
        state.loader = saved.get("loader")
        state.canonical_nodes = saved.get("canonical_nodes")
        restore_rng(saved["rng"])
        self.reporter.emit("resumed", epoch=state.epoch, batch=state.batch, step=state.step)

    def save(self, state: TrainState, epoch: int, batch: int, loader: dict[str, Any] | None,
             identity: dict[str, Any], canonical_nodes: int) -> float:
        """Rank 0 writes; returns the seconds spent (reported apart from data and compute time)."""
        started = time.perf_counter()
        if not (self.directory and self.env.rank == 0):
            return time.perf_counter() - started
        try:
            written = save_checkpoint(
                self.directory,
                {
                    "model": state.core.state_dict(),
                    "optimizer": state.optimizer.state_dict(),
                    "epoch": epoch,
                    "batch": batch,
                    "step": state.step,
                    "rng": capture_rng(),
                    "config": asdict(self.config),
                    "world_size": self.env.world_size,
                    "dataset": identity,
                    "loader": loader,
                    "canonical_nodes": canonical_nodes,
                },
            )
        except OSError as exc:  # disk full, quota: the previous checkpoint is still in place
            raise CheckpointStoreError(f"{self.where}: cannot write checkpoint: {exc.strerror or exc}") from exc
        wrote = time.perf_counter()
        if self.mirror is not None:
            self.mirror.push(written)
        # bytes and seconds (write, then mirror) are what terminationGracePeriodSeconds is sized from
        self.reporter.emit("checkpoint", epoch=epoch, batch=batch, step=state.step,
                           uploaded=self.config.checkpoint_uri if self.mirror is not None else None,
                           bytes=written.stat().st_size, write_seconds=wrote - started,
                           mirror_seconds=time.perf_counter() - wrote if self.mirror is not None else None)
        return time.perf_counter() - started
