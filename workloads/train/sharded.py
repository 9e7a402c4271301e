"""Sharded, asynchronous, verified checkpoints through torch.distributed.checkpoint (DCP), in two tiers.

    from workloads.train.sharded import ShardedCheckpointer, TrainingState

    ckpt = ShardedCheckpointer("/nvme/ckpt", remote="s3://bucket/run-7/ckpt", keep=3)
    state = TrainingState(model, optimizer, scheduler)         # FSDP2 / DTensor, DDP or a plain module
    resumed = ckpt.load(state)                                  # None: nothing complete anywhere (a line says so)
    ...
    ckpt.save_if_idle(state, step, meta={"data": data.state_dict()})   # every N steps; None: skipped (busy)
    ...
    ckpt.save(state, step, meta={"data": data.state_dict()})   # a stop, the end: waits for the save in flight
    ckpt.wait()                                                  # before exiting: the save in flight completes

Every rank writes its own shards (DCP's FileSystemWriter) into the local tier's `step-N/` folder; a background
thread then hashes each rank's files, rank 0 writes the manifest (sha256 and size of every file) LAST, each rank
copies its files to the remote tier (S3, or an EFS/FSx directory), and rank 0 puts the remote manifest after all of
them. Host memory is bounded to one staged copy of the rank's state (a state on the GPU: pinned host buffers the
first save allocates and every later save reuses, held for the run, workloads/train/pinned.py; a state on the CPU:
fresh host memory per save, freed after it): save() first waits for the previous one, and
save_if_idle() (the periodic save) is skipped while the previous one is still in flight on any rank, so the loop
never waits for a background write (a state written slower than the save interval is saved as often as the disks
allow). The newest complete checkpoint is then at most (2 + skipped) x interval - 1 steps old: the save started last
may be in flight, the one before it is complete, and each save skipped since adds an interval.

A load takes the newest checkpoint that is complete for every rank: the local tier when its folder verifies against
its manifest, else the remote tier's copy, downloaded to the local tier and verified on the way. A folder without a
manifest, or with a file missing, short or altered, is skipped with one line naming the file, and the previous
good checkpoint is loaded (or the run starts fresh, saying so). DCP reshards on load: a checkpoint written by 2
ranks loads into 3.

Every wait has a deadline, `timeout_s` (the bundled trainer passes its --collective-timeout; 600 s when not
given): the checkpointer's two groups are made with it, so a collective whose peer is gone (the background
thread's gather, busy()'s all-reduce) raises torch's DistError after it, and wait() raises CheckpointTimeout
(one line naming the step) when the save in flight has not finished by then; its background thread is a daemon and
never holds the process's exit. A stop calls wait(timeout_s=...) with what is left of its grace period: a save
that cannot finish in it is given up (the previous complete checkpoint stands) rather than SIGKILLed mid-stop.

All collectives of the checkpointer run on a process group of its own (gloo), so the background thread's never
interleave with the training step's. A "local" directory every node mounts (EFS, FSx: the bundled trainer's
--checkpoint-dir on a shared claim) is found at start (rank 0 leaves a probe file, the others look for it) and then
tended (cleared, manifested, pruned) by rank 0 alone instead of every node's local rank 0. Saving a step already
saved (or resumed from) is a no-op.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from workloads.train.pinned import CachedStagingWriter, wants_cached_staging
from workloads.train.tiers import (
    MANIFEST,
    CheckpointDamaged,
    CheckpointTimeout,
    Manifest,
    RemoteTier,
    file_digest,
    local_steps,
    read_local_manifest,
    remote_tier,
    step_dir_name,
    to_prune,
    verify_folder,
    write_atomic,
)

METADATA = ".metadata"  # DCP's global metadata file (rank 0 writes it)
DEFAULT_TIMEOUT_S = 600.0  # every wait's deadline when the caller gives none (the trainer's --collective-timeout)
# A one-process run (no process group) is what no_dist says; DCP warns about it on every save and load.
warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized, "
                        r"assuming the intent is to (save|load) in a single process")


class TrainingState:
    """The model, optimiser and (optional) LR scheduler as one DCP Stateful: state_dict() gives DCP's sharded view
    (FSDP2 DTensors stay sharded, DDP's "module." prefix is dropped), load_state_dict() puts a resharded state
    back. The torch RNG of rank 0 rides along (augmentation that must resume exactly should be seeded by position,
    as the bundled trainer's is)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any | None = None) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler

    def state_dict(self) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_state, "optim": optim_state, "rng": torch.get_rng_state()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if isinstance(state.get("rng"), torch.Tensor):
            torch.set_rng_state(state["rng"])


class CheckpointMismatch(ValueError):
    """A complete, verified checkpoint that is not this model's: a config error, never skipped silently."""


@dataclass
class SaveReport:
    """What one save cost: the training loop's stall (staging into host memory), the local write, the copy to
    the remote tier, and this rank's bytes (the shard size grace periods are sized from)."""

    step: int
    stall_s: float
    rank_bytes: int = 0
    total_bytes: int = 0
    local_write_s: float | None = None
    remote_s: float | None = None
    complete: bool = False
    error: str | None = None


def _why(exc: BaseException) -> str:
    """One line for a failure; DCP's CheckpointException (a BaseException) carries each rank's own failure."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        exc = first[0] if isinstance(first, tuple) else first  # (exception, its stack) per rank
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class ShardedCheckpointer:
    """See the module docstring. Every method is collective: call it on every rank, in the same order."""

    def __init__(self, local_dir: str | Path, remote: str | RemoteTier | None = None, *, keep: int = 3,
                 process_group: dist.ProcessGroup | None = None, local_rank: int | None = None,
                 log: Callable[[str], None] = _say, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if keep < 1:
            raise ValueError(f"keep: must be at least 1 (the newest good checkpoint is never deleted), got {keep}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s: must be above 0 (every wait has a deadline), got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.local = Path(local_dir)
        self.remote = remote_tier(remote) if isinstance(remote, str) else remote
        self.keep = keep
        self.log = log
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank)) if local_rank is None else local_rank
        # a group of its own: the background thread's collectives never meet the training step's
        deadline = timedelta(seconds=self.timeout_s)
        self.group = (process_group or dist.new_group(backend="gloo", timeout=deadline)) if self.distributed else None
        # and one for the loop's question "is a save still in flight on any rank?", asked while the background
        # thread may be in a collective on self.group
        self.control = dist.new_group(backend="gloo", timeout=deadline) if self.distributed else None
        self._thread: threading.Thread | None = None
        self._writer: CachedStagingWriter | None = None  # a state on the GPU: one writer, its pinned copy kept
        self._on_gpu: bool | None = None  # whether the state holds CUDA tensors: asked at the first save only
        self._in_flight: int | None = None
        self._complete_step: int | None = None  # the step this run saved or resumed, complete: saved again = no-op
        self.last: SaveReport | None = None
        self.skipped = 0  # periodic saves skipped (save_if_idle) because the previous one was still in flight
        self.local.mkdir(parents=True, exist_ok=True)
        # the rank that tends the local folder (clears, writes the manifest, prunes, downloads): local rank 0 of each
        # node, or rank 0 alone when the "local" directory is one file system every node mounts (EFS, FSx)
        shared = self._local_is_shared()  # collective: every rank asks
        self.tends_local = self.local_rank == 0 and (self.rank == 0 or not shared)

    # -- collectives on the checkpointer's own group ------------------------------------------------------------
    def _gather(self, value: Any) -> list[Any]:
        if not self.distributed:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.group)
        return out

    def _broadcast(self, value: Any) -> Any:
        if not self.distributed:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.group)

    def _local_is_shared(self) -> bool:
        """Whether rank 0's local directory is this rank's too (a shared file system): rank 0 leaves a probe file
        there, the other ranks look for it."""
        if not self.distributed:
            return False
        probe = self.local / f".probe-{os.getpid()}-{time.time_ns()}" if self.rank == 0 else None
        if probe is not None:
            probe.touch()
        name = self._broadcast(probe.name if probe is not None else None)
        seen = self._gather(self.rank != 0 and self.local_rank == 0 and (self.local / name).exists())
        if probe is not None:
            probe.unlink(missing_ok=True)
        return any(seen)

    # -- save -----------------------------------------------------------------------------------------------------
    def save(self, state: Any, step: int, meta: dict[str, Any] | None = None) -> SaveReport:
        """Snapshot `state` (a Stateful or a DCP state dict) into host memory and return; the write, the
        manifest and the remote copy happen in the background. Waits for the previous save first."""
        self.wait()
        if step == self._complete_step and self.last is not None:
            return self.last  # saved (or resumed from) already, complete: the same step holds the same state
        folder = self.local / step_dir_name(step)
        if self.tends_local and folder.exists():
            shutil.rmtree(folder)  # a partial of the same step from an earlier attempt
        self._barrier()
        started = time.perf_counter()
        future = dcp.async_save({"state": state}, process_group=self.group, no_dist=not self.distributed,
                                **self._storage(state, folder))
        if not isinstance(future, Future):  # newer DCP: an AsyncSaveResponse
            future = future.upload_completion
        report = SaveReport(step=step, stall_s=time.perf_counter() - started)
        self.last = report
        self._in_flight = step
        self._thread = threading.Thread(target=self._complete, args=(future, folder, step, dict(meta or {}), report,
                                                                     started), name=f"checkpoint-{step}", daemon=True)
        self._thread.start()
        return report

    def _storage(self, state: Any, folder: Path) -> dict[str, Any]:
        """async_save's storage arguments: a state holding CUDA tensors goes through the one writer kept for the run
        (workloads/train/pinned.py: its staged copy pinned and reused, the step's folder passed per save); any other
        state through a writer of its own per save, its staged copy in fresh host memory held during the save."""
        if self._on_gpu is None:  # a Stateful without .model would build its whole state dict to answer
            self._on_gpu = wants_cached_staging(state)
        if not self._on_gpu:
            return {"storage_writer": dcp.FileSystemWriter(folder, sync_files=True)}
        if self._writer is None:
            self._writer = CachedStagingWriter(folder, self.log)
        return {"storage_writer": self._writer, "checkpoint_id": folder}

    def busy(self) -> bool:
        """Whether a save is still in flight on any rank: the same answer on every rank (one 1-element all-reduce
        on the control group)."""
        mine = self._thread is not None and self._thread.is_alive()
        if not self.distributed:
            return mine
        flag = torch.tensor([int(mine)], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.control)
        return bool(flag.item())

    def save_if_idle(self, state: Any, step: int, meta: dict[str, Any] | None = None) -> SaveReport | None:
        """A periodic save: save() when no save is in flight on any rank, else None (skipped, the loop not blocked;
        the next interval tries again). Never queued: host memory holds one staged copy. A stop, an epoch's end or
        the run's end calls save(), which waits."""
        if self.busy():
            self.skipped += 1
            return None
        return self.save(state, step, meta)

    @property
    def in_flight(self) -> int | None:
        """The step of the save started last and not yet waited for (it may have finished meanwhile)."""
        return self._in_flight

    def wait(self, timeout_s: float | None = None) -> SaveReport | None:
        """Block until the save in flight (if any) is complete or has failed; returns its report. CheckpointTimeout
        when it is still in flight after `timeout_s` (default: the checkpointer's timeout_s); it stays in flight
        (a later wait may still see it finish)."""
        if self._thread is not None:
            limit = self.timeout_s if timeout_s is None else max(0.0, timeout_s)
            self._thread.join(limit)
            if self._thread.is_alive():
                raise CheckpointTimeout(f"checkpoint: step {self._in_flight} still not written after {limit:g} s "
                                        "(a hung disk, store or peer); the previous complete checkpoint stands")
            self._thread = None
            self._in_flight = None
        return self.last

    def _own_files(self, folder: Path) -> dict[str, dict[str, Any]]:
        names = [path.name for path in folder.glob(f"__{self.rank}_*.distcp")]
        if self.rank == 0:
            names.append(METADATA)
        records = {}
        for name in sorted(names):
            digest, size = file_digest(folder / name)
            records[name] = {"sha256": digest, "bytes": size}
        return records

    def _complete(self, future: Future, folder: Path, step: int, meta: dict[str, Any], report: SaveReport,
                  started: float) -> None:
        try:
            future.result()
            mine: dict[str, dict[str, Any]] | None = self._own_files(folder)
            error = None
        except (Exception, dcp.CheckpointException) as exc:  # disk full, a rank that failed: the previous stands
            mine, error = None, _why(exc)
        results = self._gather((mine, error))
        report.local_write_s = time.perf_counter() - started
        failed = [(rank, why) for rank, (files, why) in enumerate(results) if files is None]
        if failed:
            rank, why = failed[0]
            report.error = f"rank {rank}: {why}"
            self.log(f"checkpoint: step {step} not written ({report.error}); the previous complete checkpoint "
                     "stands")
            return
        files: dict[str, dict[str, Any]] = {}
        for part, _ in results:
            files.update(part)
        manifest = Manifest(step, self.world_size, files, meta)
        report.rank_bytes = sum(entry["bytes"] for entry in (mine or {}).values())
        report.total_bytes = manifest.total_bytes
        if self.tends_local and all((folder / name).exists() for name in files):
            try:
                write_atomic(folder / MANIFEST, manifest.to_bytes())  # last: the local copy is complete
            except OSError as exc:  # the disk filled up at the last moment: this local copy stays partial
                self.log(f"checkpoint: step {step}: {folder / MANIFEST} not written ({_why(exc)}); the local copy "
                         "is partial")
        if self.remote is not None:
            self._copy_remote(folder, step, mine or {}, manifest, report)
        else:
            report.complete = True
        if report.complete:
            self._complete_step = step
        self._prune()

    def _copy_remote(self, folder: Path, step: int, mine: dict[str, dict[str, Any]], manifest: Manifest,
                     report: SaveReport) -> None:
        assert self.remote is not None
        copied = time.perf_counter()
        try:
            for name in mine:
                self.remote.put(folder / name, step, name)
            error = None
        except Exception as exc:  # the store is down or full: the remote tier keeps its previous checkpoint
            error = _why(exc)
        errors = [why for why in self._gather(error) if why]
        if not errors and self.rank == 0:
            try:
                self.remote.put_manifest(step, manifest.to_bytes())  # after every rank's files
            except Exception as exc:
                errors.append(_why(exc))
        errors = [why for why in self._gather(errors[0] if errors else None) if why]
        report.remote_s = time.perf_counter() - copied
        if errors:
            report.error = errors[0]
            self.log(f"checkpoint: step {step} not copied to {self.remote.uri} ({errors[0]}); the previous "
                     "complete copy there stands")
            return
        report.complete = True

    def _prune(self) -> None:
        """Keep the newest `keep` complete checkpoints per tier; never the only good one, never the one in flight."""
        if self.tends_local:
            complete = [step for step in local_steps(self.local)
                        if (self.local / step_dir_name(step) / MANIFEST).exists()]
            for step in to_prune(complete, local_steps(self.local), self.keep, None):
                shutil.rmtree(self.local / step_dir_name(step), ignore_errors=True)
        if self.remote is not None and self.rank == 0:
            try:
                steps = self.remote.steps()
                complete = [step for step in steps if self._remote_manifest(step) is not None]
                for step in to_prune(complete, steps, self.keep, None):
                    self.remote.delete(step)
            except Exception as exc:  # retention is housekeeping: a failure here costs space, not a checkpoint
                self.log(f"checkpoint: pruning {self.remote.uri} failed ({exc}); older checkpoints stay")

    def _remote_manifest(self, step: int) -> Manifest | None:
        assert self.remote is not None
        try:
            return self.remote.manifest(step)
        except CheckpointDamaged:
            return None

    # -- load -----------------------------------------------------------------------------------------------------
    def candidates(self) -> list[int]:
        """Steps with a manifest in either tier, newest first (rank 0's view, shared with every rank)."""
        steps: set[int] = set()
        if self.rank == 0:
            steps.update(step for step in local_steps(self.local)
                         if (self.local / step_dir_name(step) / MANIFEST).exists())
            if self.remote is not None:
                try:
                    steps.update(self.remote.steps())
                except Exception as exc:
                    self.log(f"checkpoint: cannot list {self.remote.uri} ({exc}); only the local tier is searched")
        return sorted(self._broadcast(steps), reverse=True)

    def _ensure_local(self, step: int) -> str | None:
        """Make this node's local folder of `step` complete and verified (downloading from the remote tier when
        it is not); None when it is, else why not."""
        folder = self.local / step_dir_name(step)
        why = "no manifest in the local tier"
        try:
            manifest = read_local_manifest(folder)
            if manifest is not None:
                verify_folder(folder, manifest)
                return None
        except CheckpointDamaged as exc:
            why = str(exc)
        if self.remote is None:
            return why
        try:
            manifest = self.remote.manifest(step)
            if manifest is None:
                return f"{why}; {self.remote.uri}/{step_dir_name(step)}: no manifest (partial)"
            (folder / MANIFEST).unlink(missing_ok=True)  # partial until every file is down and checked
            folder.mkdir(parents=True, exist_ok=True)
            for name, entry in sorted(manifest.files.items()):
                local = folder / name
                if local.exists() and file_digest(local)[0] == entry["sha256"]:
                    continue
                digest = self.remote.get(step, name, local)
                if digest != entry["sha256"]:
                    local.unlink(missing_ok=True)
                    return f"{self.remote.uri}/{step_dir_name(step)}/{name}: sha256 does not match the manifest"
            write_atomic(folder / MANIFEST, manifest.to_bytes())
            return None
        except CheckpointDamaged as exc:
            return str(exc)
        except Exception as exc:
            return f"{self.remote.uri}/{step_dir_name(step)}: {type(exc).__name__}: {exc}"

    def load(self, state: Any, check: Callable[[Manifest, Path], None] | None = None, *,
             announce_fresh: bool = True) -> Manifest | None:
        """Load the newest checkpoint complete for every rank into `state` (resharded to this world size); its
        manifest (with the caller's `meta`), or None when there is none (the run starts fresh; a line says so
        unless announce_fresh is False). `check(manifest, folder)` runs on every rank before anything is loaded
        and may refuse the checkpoint by raising (another model, dataset or order: a config error)."""
        self.wait()
        for step in self.candidates():
            why = self._ensure_local(step) if self.tends_local else None
            problems = [problem for problem in self._gather(why) if problem]
            if problems:
                if self.rank == 0:
                    self.log(f"checkpoint: step {step} skipped: {problems[0]}; trying an older one")
                continue
            folder = self.local / step_dir_name(step)
            manifest = read_local_manifest(folder)
            assert manifest is not None
            if check is not None:
                check(manifest, folder)
            try:
                dcp.load({"state": state}, storage_reader=dcp.FileSystemReader(folder), process_group=self.group,
                         no_dist=not self.distributed)
            except dcp.CheckpointException as exc:  # verified, but not this model's (other shapes or names)
                raise CheckpointMismatch(f"{folder}: does not load into this model: {_why(exc)}") from None
            self._complete_step, self.last = step, SaveReport(step=step, stall_s=0.0, complete=True)
            if self.rank == 0:
                self.log(f"checkpoint: resumed from step {step} ({manifest.world_size} ranks then, "
                         f"{self.world_size} now)")
            return manifest
        if self.rank == 0 and announce_fresh:
            self.log(f"checkpoint: no complete checkpoint in {self.searched}; starting fresh")
        return None

    @property
    def searched(self) -> str:
        return str(self.local) if self.remote is None else f"{self.local} or {self.remote.uri}"

    def close(self) -> None:
        self.wait()
        self._writer = None  # its pinned host copy goes with it


def load_whole(folder: str | Path) -> dict[str, Any]:
    """A verified checkpoint folder loaded whole into this one process, without a process group: {"model",
    "optim", ...} with full (unsharded) tensors, as torch's own dcp_to_torch_save reads one. For tools and checks
    (the chaos harness compares final weights with it); a training run loads resharded through
    ShardedCheckpointer.load. CheckpointDamaged when the folder is partial or does not match its manifest."""
    path = Path(folder)
    manifest = read_local_manifest(path)
    if manifest is None:
        raise CheckpointDamaged(f"{path / MANIFEST}: missing (the checkpoint is partial)")
    verify_folder(path, manifest)
    whole: dict[str, Any] = {}
    _load_state_dict(whole, storage_reader=dcp.FileSystemReader(path), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    return whole["state"]
