"""The training run: data, model, DDP, timings as JSON lines, checkpoint/resume.

Timings follow the study (pytorch/examples imagenet, instrumented): model_loading, data_preparation, and per
epoch epoch_time with the per-batch split into data_time (waiting for the next batch) and compute_time
(transfer, augmentation, forward, backward, step), plus throughput and GPU utilisation when a GPU is
present.

The run is put together here; its parts live beside it: the settings (config.py), the process's place and voice
(runtime.py), the input side (inputs.py), one step (step.py), one epoch (epoch.py) and the checkpointer
(checkpointer.py).
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workloads.data.reading.dataset import HDF5Dataset, JpegFolderDataset
from workloads.train.checkpoint import CheckpointStoreError
from workloads.train.checkpointer import (
    Checkpointer,
    TrainState,
    check_checkpoint_dir,
    check_resumable,
    probe_remote,
)
from workloads.train.config import ConfigError, TrainConfig, rank_batch_size
from workloads.train.epoch import Run, run_epoch
from workloads.train.inputs import (
    MIN_RANK_BATCH,
    check_worker_tmpdir,
    dataset_identity,
    open_dataset,
    prepare_data,
)
from workloads.train.metrics import RunShape, TrainMetrics
from workloads.train.models import MODELS
from workloads.train.runtime import (
    STOP_SIGNALS,
    Disrupted,
    Distributed,
    Reporter,
    StopRequest,
    TrainingDiverged,
)
from workloads.train.step import Stepper, configure_determinism

__all__ = [
    "MIN_RANK_BATCH", "STOP_SIGNALS", "ConfigError", "Disrupted", "Distributed", "Reporter", "StopRequest",
    "TrainConfig", "TrainingDiverged", "check_checkpoint_dir", "check_resumable", "check_worker_tmpdir",
    "dataset_identity", "open_dataset", "rank_batch_size", "train",
]


def _prepare_model(
    config: TrainConfig,
    env: Distributed,
    device: torch.device,
    dataset: HDF5Dataset | JpegFolderDataset,
    checkpointer: Checkpointer,
) -> TrainState:
    """Build and move the model, make the optimiser, load the checkpoint when resuming, wrap it for DDP."""
    core: nn.Module = MODELS[config.model](len(dataset.classes), config.width).to(device)
    if config.channels_last:
        core = core.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimizer = torch.optim.SGD(
        core.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    state = TrainState(model=core, core=core, optimizer=optimizer)
    checkpointer.restore(state, dataset, device)
    if env.world_size > 1:
        state.model = DistributedDataParallel(core, device_ids=[device.index] if device.type == "cuda" else None)
    return state


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


def _checked(config: TrainConfig, env: Distributed) -> TrainConfig:
    """The configuration as this run uses it, every setting checked before anything is read or built."""
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
    if config.global_batch_size is not None:
        config = replace(config, batch_size=rank_batch_size(config.global_batch_size, env.world_size))
    if config.checkpoint_dir:
        check_checkpoint_dir(config.checkpoint_dir)
    return config


def _start(config: TrainConfig, env: Distributed) -> torch.device:
    """Join the process group (when there is one) and pick this rank's device."""
    if env.world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo",
                                timeout=timedelta(seconds=config.collective_timeout_s))
    device = torch.device(f"cuda:{env.local_rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    configure_determinism(config)
    return device


def _set_up(config: TrainConfig, env: Distributed, reporter: Reporter, metrics: TrainMetrics,
            stop: StopRequest) -> Run:
    """Everything before the first step: the group, the data (data_preparation) and the model (model_loading)."""
    if config.checkpoint_uri and env.local_rank == 0:
        probe_remote(config.checkpoint_uri)
    device = _start(config, env)
    reporter.emit("config", **asdict(config), world_size=env.world_size, device=str(device))
    started = time.perf_counter()
    data = prepare_data(config, env, device, reporter)
    sampler = data.sampler
    reporter.emit("data_preparation", seconds=time.perf_counter() - started, samples=len(data.dataset),
                  image_size=data.dataset.image_size, batches_per_epoch=sampler.batches_per_epoch)
    metrics.started(RunShape(epochs=config.epochs, batches_per_epoch=sampler.batches_per_epoch,
                             batch_size=config.batch_size, world_size=env.world_size, rank=env.rank))
    started = time.perf_counter()
    checkpointer = Checkpointer(config, env, reporter)
    state = _prepare_model(config, env, device, data.dataset, checkpointer)
    if config.canonical_nodes is None and state.canonical_nodes is not None:
        sampler.set_canonical_nodes(state.canonical_nodes)  # the resumed run's order, whatever the node count now
    reporter.emit("model_loading", seconds=time.perf_counter() - started, model=config.model,
                  parameters=sum(p.numel() for p in state.core.parameters()))
    return Run(config=config, env=env, device=device, reporter=reporter, metrics=metrics, stop=stop, data=data,
               state=state, checkpointer=checkpointer, stepper=Stepper(config, env, device, len(data.dataset.classes)),
               identity=dataset_identity(data.dataset), resumed_from=state.step,
               show_progress=env.rank == 0 and sys.stderr.isatty())


def _train(
    config: TrainConfig, reporter: Reporter | None, metrics: TrainMetrics | None, stop: StopRequest
) -> dict[str, Any]:
    env = Distributed.from_env()
    config = _checked(config, env)
    reporter = reporter or Reporter(env.rank)
    metrics = metrics or TrainMetrics()
    run_start = time.perf_counter()
    run = _set_up(config, env, reporter, metrics, stop)
    summary: dict[str, Any] = {}
    run.state.model.train()
    stop.immediate = False  # from here on a stop signal ends the run at a step boundary, with a checkpoint
    for epoch in range(run.state.epoch, config.epochs):
        epoch_summary = run_epoch(run, epoch)
        if epoch_summary is None:
            continue
        summary = epoch_summary
        reporter.emit("epoch", **summary)
        run.checkpoint(epoch + 1, 0, None)  # after the epoch line: epoch_time above excludes this one
        if run.stopping and epoch + 1 < config.epochs:  # the agreed stop fell on the epoch's last step
            run.stop_now(epoch + 1, 0)
    last = run.checkpointer.finish()  # the last save completes (both tiers) before the run reports done
    if run.checkpointer.enabled and last is not None and not last.complete:
        # a periodic save that failed leaves the previous one standing; the final one holds the trained weights
        raise CheckpointStoreError(f"{config.checkpoint_dir}: the final checkpoint (step {last.step}) was not "
                                   f"saved: {last.error}; a rerun with --resume continues from the last complete one")
    if run.data.feeder:
        run.data.feeder.finish()
    metrics.finished()
    reporter.emit("done", total_seconds=time.perf_counter() - run_start, steps=run.state.step)
    if env.world_size > 1:
        dist.barrier()
        # torn down here, not by the interpreter's exit: a gloo group left to the C++ destructors aborted a finished
        # rank now and then (SIGABRT, "terminate called without an active exception"), which the Job counts
        dist.destroy_process_group()
    return summary
