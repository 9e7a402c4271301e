"""The bundled trainer's checkpointer: what a checkpoint holds of a run, when it may be resumed, and saving it
through the sharded checkpointer (workloads/train/sharded.py), the code path examples/train_fsdp.py uses.

A save is asynchronous: the DDP state (model, optimiser, torch RNG) is staged in host memory and the next step goes
on; every rank writes its share (DCP spreads the replicated DDP tensors over the ranks) into
--checkpoint-dir/step-N/ in the background, a manifest with every file's sha256 last, then copies its files to
--checkpoint-uri (s3://bucket/prefix, or a shared directory such as EFS or FSx). A periodic save due while the
previous one is still in flight on any rank is skipped (--checkpoint-if-busy skip, a "checkpoint_skipped" event) or
waits for it (wait); an epoch's end, a stop and the end of the run always wait for the save in flight, at most
--collective-timeout seconds (a stop: at most what is left of its grace period, stop_wait_s), after which the run
exits with the disruption code and resumes from the previous complete checkpoint. The run's
position (epoch, batch, step, the sampler's state, the dataset's record, the settings) is the manifest's meta, so a
resume checks it before anything is loaded. A checkpoint loads into another world size (DCP reshards; the sampler
continues with exactly the samples not yet seen).

An older trainer's whole-state `last.pt` (with its sha256 sidecar, or its object under --checkpoint-uri) is read
only while no complete sharded checkpoint exists in either tier: --resume then loads it, verified as before, and
the next save is sharded. From then on it is never read again and may be deleted.
"""

from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from workloads.data.reading.dataset import HDF5Dataset, JpegFolderDataset
from workloads.train.checkpoint import (
    CHECKPOINT_NAME,
    CheckpointError,
    CheckpointMirror,
    load_checkpoint,
    require_training_state,
    restore_rng,
)
from workloads.train.config import TrainConfig
from workloads.train.inputs import dataset_identity, identity_difference
from workloads.train.runtime import Distributed, Reporter
from workloads.train.tiers import (
    MANIFEST,
    CheckpointDamaged,
    Manifest,
    local_steps,
    read_local_manifest,
    step_dir_name,
)

STOP_EXIT_MARGIN_S = 2.0  # a stop's barrier, the process group's teardown and the exit, after its save

if TYPE_CHECKING:
    from workloads.train.sharded import SaveReport, ShardedCheckpointer


def _sharded() -> Any:
    """workloads.train.sharded, imported when a checkpoint is first used: torch.distributed.checkpoint pulls in
    DTensor's operators (seconds of start-up), which a run without --checkpoint-dir (or --help) never needs."""
    from workloads.train import sharded

    return sharded


def check_checkpoint_dir(directory: str, flag: str = "--checkpoint-dir") -> None:
    """A checkpoint directory that cannot hold files fails now, not after an epoch of training."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{flag}: {path}: exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}-{random.getrandbits(32):08x}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as exc:
        raise CheckpointError(f"{flag}: {path}: not writable: {exc.strerror or exc}") from exc


def probe_remote(uri: str) -> None:
    """The remote tier, before any training: an S3 bucket that does not exist or denies access is a config error,
    one that does not answer is CheckpointStoreError; a directory (EFS, FSx) must be writable."""
    if uri.startswith("s3://"):
        CheckpointMirror(uri).probe()
    elif "://" in uri:
        raise CheckpointError(f"--checkpoint-uri: {uri}: neither s3://bucket/prefix nor a directory")
    else:
        check_checkpoint_dir(uri, "--checkpoint-uri")


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


def _rank0_buffers(state: TrainState) -> None:
    """Give every rank rank 0's buffers (BatchNorm's running statistics) before a save. DDP broadcasts them from
    rank 0 at the start of each forward, so the other ranks' own copies are never used again; but DCP writes each
    replicated tensor from whichever rank its planner picks, so without this a checkpoint mixes ranks' statistics and
    a resumed run's buffers differ from an uninterrupted one's (the weights do not)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    if not getattr(state.model, "broadcast_buffers", False):
        return
    with torch.no_grad():
        for buffer in state.core.buffers():
            dist.broadcast(buffer, src=0)


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


def _saved(manifest: Manifest, where: Path) -> dict[str, Any]:
    """A sharded checkpoint's meta as the run's record (what check_resumable reads); CheckpointError without it."""
    meta = dict(manifest.meta)
    missing = [key for key in ("epoch", "batch", "step", "config") if key not in meta]
    if missing or not isinstance(meta.get("config"), dict):
        lacks = ", ".join(missing) or "config"
        raise CheckpointError(f"{where / MANIFEST}: not a checkpoint of this trainer (no {lacks} in its meta; "
                              "written by another script?)")
    return {**meta, "world_size": manifest.world_size}


def latest_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The newest complete checkpoint in a local tier, loaded whole on this one process: the run's record (epoch,
    batch, step, world_size, loader, ...) with "model" and "optimizer" as full state dicts. None when there is
    none. For tools and checks; a run resumes through Checkpointer.restore."""
    root = Path(directory)
    for step in local_steps(root):
        folder = root / step_dir_name(step)
        if not (folder / MANIFEST).exists():
            continue
        try:
            whole = _sharded().load_whole(folder)
        except CheckpointDamaged:
            continue
        manifest = read_local_manifest(folder)
        assert manifest is not None
        return {**_saved(manifest, folder), "model": whole["model"], "optimizer": whole["optim"]}
    return None


def stop_wait_s(config: TrainConfig, signalled_at: float | None, now: float | None = None) -> float:
    """How long a stop may wait for its save: --collective-timeout, and under torchrun's agent no longer than what
    is left of TORCH_ELASTIC_SHUTDOWN_TIMEOUT since the signal (the rendered Jobs set it to the grace period less a
    margin; the agent SIGKILLs its workers then) less STOP_EXIT_MARGIN_S for the barrier and the exit. A save not
    done by then is given up: the previous complete checkpoint stands and the run still exits with the disruption
    code (a SIGKILL mid-stop would leave the same checkpoint, but as a failure the Job may count)."""
    limit = config.collective_timeout_s
    try:
        shutdown = float(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", ""))
    except ValueError:
        return limit
    elapsed = 0.0 if signalled_at is None else max(0.0, (time.monotonic() if now is None else now) - signalled_at)
    return max(0.0, min(limit, shutdown - elapsed - STOP_EXIT_MARGIN_S))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Checkpointer:
    """Saves the run (every rank its share, in the background) and restores it; see the module docstring. Every
    method is collective: every rank calls it, in the same order."""

    def __init__(self, config: TrainConfig, env: Distributed, reporter: Reporter) -> None:
        self.config = config
        self.env = env
        self.reporter = reporter
        self.directory = config.checkpoint_dir
        self.where = Path(config.checkpoint_dir or "")  # what a resume came from, for the messages that name it
        self.sharded: ShardedCheckpointer | None = (
            _sharded().ShardedCheckpointer(config.checkpoint_dir, config.checkpoint_uri, log=_say,
                                           timeout_s=config.collective_timeout_s)
            if config.checkpoint_dir else None)
        # the save in flight, not yet reported: its report, epoch, batch and the seconds its call blocked the loop
        self._pending: tuple[SaveReport, int, int, float] | None = None

    @property
    def enabled(self) -> bool:
        return self.sharded is not None

    def restore(self, state: TrainState, dataset: HDF5Dataset | JpegFolderDataset, device: torch.device) -> None:
        """Load the newest complete checkpoint into `state` when resuming (local tier, else the remote one, on any
        world size), else an older trainer's last.pt; nothing to resume leaves `state` at its start."""
        config = self.config
        if not (config.resume and self.sharded is not None):
            return

        def check(manifest: Manifest, folder: Path) -> None:
            check_resumable(_saved(manifest, folder), config, self.env, dataset, folder)

        manifest = self.sharded.load(_sharded().TrainingState(state.core, state.optimizer), check,
                                     announce_fresh=False)
        if manifest is not None:
            self.where = self.sharded.local / step_dir_name(manifest.step)
            meta = manifest.meta
            state.epoch, state.batch, state.step = int(meta["epoch"]), int(meta["batch"]), int(meta["step"])
            state.loader = meta.get("loader")
            state.canonical_nodes = meta.get("canonical_nodes")
        elif not self._restore_legacy(state, dataset, device):
            if self.env.rank == 0:
                _say(f"checkpoint: no complete checkpoint in {self.sharded.searched}; starting fresh")
            return
        self.reporter.emit("resumed", epoch=state.epoch, batch=state.batch, step=state.step)

    def _restore_legacy(self, state: TrainState, dataset: HDF5Dataset | JpegFolderDataset,
                        device: torch.device) -> bool:
        """An older trainer's last.pt (local, else pulled from an S3 --checkpoint-uri), verified by its sha256;
        False when there is none."""
        config, env = self.config, self.env
        assert self.directory is not None
        target = Path(self.directory) / CHECKPOINT_NAME
        uri = config.checkpoint_uri or ""
        if uri.startswith("s3://") and env.local_rank == 0 and not target.exists():
            CheckpointMirror(uri).pull(self.directory, allow_unverified=config.allow_unverified_checkpoint)
        if env.world_size > 1:
            dist.barrier()  # every rank of the node reads the file local rank 0 pulled
        saved = load_checkpoint(self.directory, map_location=device,
                                allow_unverified=config.allow_unverified_checkpoint)
        if saved is None:
            return False
        require_training_state(saved, target)
        check_resumable(saved, config, env, dataset, target)
        try:
            state.core.load_state_dict(saved["model"])
            state.optimizer.load_state_dict(saved["optimizer"])
        except (RuntimeError, KeyError, ValueError) as exc:
            raise CheckpointError(f"{target}: does not fit this model: {str(exc).strip().splitlines()[0]}") from exc
        state.epoch, state.batch, state.step = saved["epoch"], saved["batch"], saved["step"]
        state.loader = saved.get("loader")
        state.canonical_nodes = saved.get("canonical_nodes")
        restore_rng(saved["rng"])
        self.where = target
        if env.rank == 0:
            _say(f"checkpoint: no complete sharded checkpoint in {self.sharded.searched if self.sharded else target}; "
                 f"resumed from {target}, an older trainer's whole-state file (read once: the next save is sharded)")
        return True

    def save(self, state: TrainState, epoch: int, batch: int, loader: dict[str, Any] | None,
             identity: dict[str, Any], canonical_nodes: int, *, periodic: bool = False) -> float:
        """Start an asynchronous save of this step; returns the seconds the training loop was blocked (waiting for
        the previous save, then staging this one in host memory), which is reported apart from data and compute.
        periodic: an every-N-steps save, skipped while the previous one is in flight (--checkpoint-if-busy skip)."""
        started = time.perf_counter()
        if self.sharded is None:
            return 0.0
        if periodic and self.config.checkpoint_if_busy == "skip" and self.sharded.busy():
            self.sharded.skipped += 1
            self.reporter.emit("checkpoint_skipped", epoch=epoch, batch=batch, step=state.step,
                               in_flight=self.sharded.in_flight, skipped=self.sharded.skipped)
            return time.perf_counter() - started
        previous = self.sharded.wait()
        self._report(previous)
        _rank0_buffers(state)
        meta = {"epoch": epoch, "batch": batch, "step": state.step, "config": asdict(self.config),
                "dataset": identity, "loader": loader, "canonical_nodes": canonical_nodes}
        report = self.sharded.save(_sharded().TrainingState(state.core, state.optimizer), state.step, meta)
        blocked = time.perf_counter() - started
        if report is not previous:  # not a step saved (or resumed from) already
            self._pending = (report, epoch, batch, blocked)
        return blocked

    def finish(self, timeout_s: float | None = None) -> SaveReport | None:
        """Wait for the save in flight (a stop, the end of the run) and report it; the last save's report.
        CheckpointTimeout when it is still in flight after timeout_s (default: --collective-timeout)."""
        if self.sharded is None:
            return None
        last = self.sharded.wait(timeout_s)
        self._report(last)
        return last

    def _report(self, done: SaveReport | None) -> None:
        """The "checkpoint" event of a finished save: bytes (all ranks, this rank's share), the loop's stall (staging
        the state; blocked_seconds: the whole call, the wait for the previous save included), the local write and the
        remote copy (what terminationGracePeriodSeconds is sized from)."""
        if self._pending is None or done is None or self._pending[0] is not done:
            return
        _, epoch, batch, blocked = self._pending
        self._pending = None
        self.reporter.emit("checkpoint", epoch=epoch, batch=batch, step=done.step, complete=done.complete,
                           uploaded=self.config.checkpoint_uri, bytes=done.total_bytes, rank_bytes=done.rank_bytes,
                           stall_seconds=done.stall_s, blocked_seconds=blocked, write_seconds=done.local_write_s,
                           mirror_seconds=done.remote_s, error=done.error)
