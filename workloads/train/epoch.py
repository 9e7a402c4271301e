"""One epoch of the run: the sampler positioned, steps taken and reported (JSON lines, metrics, progress bar),
checkpoints every --checkpoint-every steps, and the agreed stop (a checkpoint, then every rank leaves)."""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from tqdm import tqdm

from workloads.data.api import iter_batches
from workloads.train.checkpointer import Checkpointer, TrainState, stop_wait_s
from workloads.train.config import TrainConfig
from workloads.train.inputs import TrainData, position_sampler
from workloads.train.metrics import TrainMetrics
from workloads.train.runtime import Disrupted, Distributed, Reporter, StopRequest
from workloads.train.step import Stepper
from workloads.train.tiers import CheckpointTimeout


def gpu_utilisation(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    try:
        return float(torch.cuda.utilization(device))
    except Exception:  # needs NVML (nvidia-ml-py); absent -> not reported
        return None


@dataclass
class Run:
    """What every epoch of one run shares."""

    config: TrainConfig
    env: Distributed
    device: torch.device
    reporter: Reporter
    metrics: TrainMetrics
    stop: StopRequest
    data: TrainData
    state: TrainState
    checkpointer: Checkpointer
    stepper: Stepper
    identity: dict[str, Any]  # the dataset's record, kept in every checkpoint
    # Where this run started and when it took its first step: `submit status` reads them from the first_step event
    # and from every batch event (a log's tail is enough) to report each incident's steps lost and time to resume.
    resumed_from: int = 0
    first_step_time: float | None = None
    stopping: bool = False  # the ranks' agreed answer (all-reduced every step) to "did any rank get a stop signal?"
    show_progress: bool = field(default=False)

    def checkpoint(self, epoch: int, batch: int, loader: dict[str, Any] | None, *, periodic: bool = False) -> float:
        stall = self.checkpointer.save(self.state, epoch, batch, loader, self.identity,
                                       self.data.sampler.canonical_nodes, periodic=periodic)
        self.metrics.checkpointed(stall)
        return stall

    def stop_now(self, epoch: int, batch: int) -> None:
        """Every rank, after the agreed last step and the start of its checkpoint: the save completes (local tier,
        then the remote one) or fails (the last complete checkpoint stands), then all raise Disrupted."""
        stop, state = self.stop, self.state
        name = signal.Signals(stop.signum).name if stop.signum is not None else "a stop on another rank"
        try:
            saved = self.checkpointer.finish(stop_wait_s(self.config, stop.signalled_at))
        except CheckpointTimeout as exc:  # given up within the grace period: the previous checkpoint stands
            print(exc, file=sys.stderr, flush=True)
            saved = None
        complete = saved is not None and saved.complete and saved.step == state.step
        self.reporter.emit("stopped", reason=name, epoch=epoch, batch=batch, step=state.step, checkpointed=complete)
        if self.env.world_size > 1:
            dist.barrier()
            dist.destroy_process_group()
        if not self.checkpointer.enabled:
            outcome = "no --checkpoint-dir: nothing saved"
        elif complete:
            outcome = f"checkpoint at step {state.step}"
        else:
            outcome = "its checkpoint failed; the last complete one stands"
        raise Disrupted(f"stopped by {name} after step {state.step} ({outcome})",
                        step=state.step if complete else None)


def _progress_bar(run: Run, epoch: int, first_batch: int, batches: int) -> tqdm:
    terminal = os.get_terminal_size(sys.stderr.fileno()) if run.show_progress else os.terminal_size((0, 0))
    return tqdm(
        total=first_batch + batches,
        initial=first_batch,
        desc=f"epoch {epoch + 1}/{run.config.epochs}",
        unit="batch",
        file=sys.stderr,
        disable=not run.show_progress,
        dynamic_ncols=terminal.columns > 0,
        ncols=None if terminal.columns > 0 else 100,  # a terminal that reports no size (a bare pty)
        nrows=None if terminal.lines > 0 else 24,  # tqdm hides every bar below nrows, 0 included
        leave=True,
    )


@dataclass
class _Tally:
    first_batch: int
    batch_index: int
    data_time: float = 0.0
    compute_time: float = 0.0
    checkpoint_time: float = 0.0
    samples: int = 0
    utilisation: list[float] = field(default_factory=list)


def _report_step(run: Run, epoch: int, tally: _Tally, loss: float, step_data: float, step_compute: float) -> None:
    state = run.state
    if run.first_step_time is None:
        run.first_step_time = time.time()
        run.reporter.emit("first_step", step=state.step, resumed_from=run.resumed_from, time=run.first_step_time)
    if state.step % max(1, run.config.log_every) == 0:
        gpu = gpu_utilisation(run.device)
        if gpu is not None:
            tally.utilisation.append(gpu)
        run.reporter.emit(
            "batch",
            epoch=epoch,
            batch=tally.batch_index - 1,
            step=state.step,
            loss=loss,
            data_time=step_data,
            compute_time=step_compute,
            gpu_utilization=gpu,
            resumed_from=run.resumed_from,
            first_step_time=run.first_step_time,
        )


def run_epoch(run: Run, epoch: int) -> dict[str, Any] | None:
    """Train what is left of `epoch`; returns its summary (None when nothing was left of it). A stop agreed on
    mid-epoch checkpoints and raises Disrupted; one agreed on the epoch's last step is left to the caller
    (`run.stopping`), which checkpoints the epoch's end first."""
    config, state, data = run.config, run.state, run.data
    sampler = data.sampler
    position_sampler(sampler, epoch, state.epoch, state.loader, run.checkpointer.where)
    first_batch = state.batch if epoch == state.epoch and state.loader is not None else 0
    iteration_batches = len(sampler)  # what is left of the epoch (all of it, unless resumed mid-epoch)
    if iteration_batches == 0:
        return None
    if data.feeder:
        data.feeder.start_epoch(last_epoch=epoch == config.epochs - 1)
    run.metrics.epoch_started(epoch, first_batch)
    epoch_start = time.perf_counter()
    tally = _Tally(first_batch, first_batch)
    progress = _progress_bar(run, epoch, first_batch, iteration_batches)
    try:
        waited = time.perf_counter()
        for batch in iter_batches(data.loader):
            got = time.perf_counter()
            result = run.stepper.step(state, batch, epoch, tally.batch_index, run.stop)
            run.stopping = result.stopping
            done = time.perf_counter()
            step_data, step_compute = got - waited, done - got
            tally.data_time += step_data
            tally.compute_time += step_compute
            tally.samples += result.samples
            tally.batch_index += 1
            state.step += 1
            run.metrics.step(step_data, step_compute, result.samples, result.loss, state.step)
            _report_step(run, epoch, tally, result.loss, step_data, step_compute)
            progress.set_postfix_str(
                f"loss {result.loss:.4f}, "
                f"{result.samples * run.env.world_size / max(done - waited, 1e-9):.0f} samples/s",
                refresh=False,
            )
            progress.update(1)
            done_in_iteration = tally.batch_index - first_batch
            if data.feeder:
                data.feeder.advance(done_in_iteration)
            epoch_ends = done_in_iteration == iteration_batches
            every = config.checkpoint_every and state.step % config.checkpoint_every == 0
            if (every or run.stopping) and not epoch_ends:
                tally.checkpoint_time += run.checkpoint(epoch, tally.batch_index,
                                                        sampler.state_dict(done_in_iteration),
                                                        periodic=not run.stopping)
            if run.stopping and not epoch_ends:
                progress.close()
                run.stop_now(epoch, tally.batch_index)
            if config.stop_after_steps is not None and state.step >= config.stop_after_steps:
                run.reporter.emit("killing_self", step=state.step)
                os.kill(os.getpid(), signal.SIGKILL)
            waited = time.perf_counter()
    finally:
        progress.close()
    return _summary(run, epoch, tally, time.perf_counter() - epoch_start)


def _summary(run: Run, epoch: int, tally: _Tally, epoch_time: float) -> dict[str, Any]:
    total_samples = tally.samples * run.env.world_size
    return {
        "epoch": epoch,
        "epoch_time": epoch_time,
        "data_time": tally.data_time,
        "compute_time": tally.compute_time,
        "checkpoint_time": tally.checkpoint_time,
        "batches": tally.batch_index - tally.first_batch,
        "samples": total_samples,
        "throughput": total_samples / epoch_time if epoch_time > 0 else 0.0,
        "data_share": tally.data_time / epoch_time if epoch_time > 0 else 0.0,
        "gpu_utilization": sum(tally.utilisation) / len(tally.utilisation) if tally.utilisation else None,
    }

