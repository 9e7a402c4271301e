"""Step reports for your own training loop: the figures the bundled trainer reports, one line per step.

Measured goodput (docs/monitoring.md, "Measured goodput") needs to know when a run steps, how long it waited for
data and how long a checkpoint blocked it. The bundled trainer reports that itself; `StepReport` does it for your
own loop:

    from workloads.data.api import StepReport

    report = StepReport()                                            # rank 0 prints; $METRICS_PORT: ml_train_*
    for epoch in range(data.start_epoch, epochs):
        for images, labels in report.timed(data.batches(epoch)):     # the wait for each batch, apart (optional)
            ...                                                      # your step
            report.step(step, samples=len(labels), loss=loss)        # the one line
            if step % every == 0:
                with report.saving(step):                            # the checkpoint's stall, apart (optional)
                    save(step)

What it reports, with the bundled trainer's names (workloads/train/epoch.py, workloads/train/metrics.py):
- rank 0's stdout, JSON lines: "first_step" {step, time}; "batch" {epoch, step, loss, samples, data_time,
  compute_time} per step; "checkpoint" {step, stall_seconds, write_seconds} per save (`saving`, `save_started`);
  "checkpoint_written" {step, write_seconds, mirror_seconds} when an asynchronous save's background write ends
  (`written`);
- with $METRICS_PORT set (the rendered Jobs set it), every rank serves ml_train_steps_total, ml_train_global_step,
  ml_train_data_wait_seconds, ml_train_step_seconds, ml_train_samples_total, ml_train_checkpoint_stall_seconds_total
  on that port plus its local rank ($METRICS_ADDR, default 127.0.0.1): the series the goodput recording rules read.

A step's time runs from the end of the one before it (or of a `saving` block, or the moment `timed` was first asked
for a batch of the epoch) to `step()`: `data_time` is the part spent inside `timed`'s iterator waiting for the
batch, `compute_time` the rest. Without `timed`, the first step also counts everything since the StepReport was made
(make it just before the loop) and data_time is 0. A `saving` block's time belongs to no step.

A framework that saves from a hook of its own (Lightning's ModelCheckpoint) cannot wrap the save in a block: call
`save_started(step)` from the hook that sees it begin (a Callback's on_save_checkpoint); the save ends when `timed`
is next asked for a batch, or at `save_done()` (the end of training), whichever comes first.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from workloads.metrics_http import metrics_addr, port_number
from workloads.torchenv import torchrun_env
from workloads.train.metrics import METRICS_PORT_ENV, TrainMetrics, metrics_port_for
from workloads.train.runtime import Reporter

T = TypeVar("T")
__all__ = ["StepReport"]


def _env_port() -> int:
    try:
        return port_number(os.environ.get(METRICS_PORT_ENV) or "0")
    except argparse.ArgumentTypeError as exc:
        raise ValueError(f"{METRICS_PORT_ENV}: {exc}") from None


class StepReport:
    """Reports each step of your loop as the bundled trainer does (see the module's text).

    metrics_port: the base port of /metrics (default $METRICS_PORT; 0 or unset: no endpoint); this rank listens on
    it plus its local rank. rank, local_rank: default from torchrun's environment."""

    def __init__(self, *, metrics_port: int | None = None, rank: int | None = None,
                 local_rank: int | None = None) -> None:
        env = torchrun_env()
        self.rank = env.rank if rank is None else rank
        self.reporter = Reporter(self.rank)
        self.metrics: TrainMetrics | None = None
        base = metrics_port if metrics_port is not None else _env_port()
        if base:
            self.metrics = TrainMetrics()
            self.metrics.serve(metrics_port_for(base, env.local_rank if local_rank is None else local_rank),
                               metrics_addr())
            self.metrics.world_size.set(env.world_size)
            self.metrics.rank.set(self.rank)
            self.metrics.start_time.set(time.time())
        self.epoch: int | None = None
        self._since = time.perf_counter()  # the start of the step now running
        self._waited = 0.0  # of it, the seconds spent waiting for its batch
        self.first_step_time: float | None = None
        self._saving: tuple[int, float] | None = None  # a save begun by save_started: its step and start

    def timed(self, batches: Iterable[T], epoch: int | None = None) -> Iterator[T]:
        """`batches`, with the time each one took to arrive counted as the next step's data_time; `epoch` (or
        one more than the last one) goes into the step events."""
        self.epoch = epoch if epoch is not None else (0 if self.epoch is None else self.epoch + 1)
        if self.metrics is not None:
            self.metrics.epoch.set(self.epoch)
        iterator = iter(batches)
        self._since, self._waited = time.perf_counter(), 0.0
        try:
            while True:
                self.save_done()  # the loop asks for its next batch: a save begun since the last step is over
                asked = time.perf_counter()
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
                self._waited += time.perf_counter() - asked
                yield batch
        finally:  # a loop left early closes the batches too (their own clean-up runs now, not at collection)
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    def step(self, step: int, *, samples: int = 0, loss: float | Any = None) -> None:
        """Step `step` (the run's optimiser step, continuing after a resume) is done on this rank."""
        now = time.perf_counter()
        total = max(0.0, now - self._since)
        data_time = min(self._waited, total)
        value = None if loss is None else float(loss)
        if self.first_step_time is None:
            self.first_step_time = time.time()
            self.reporter.emit("first_step", step=step, time=self.first_step_time)
        self.reporter.emit("batch", epoch=self.epoch, step=step, loss=value, samples=samples, data_time=data_time,
                           compute_time=total - data_time)
        if self.metrics is not None:
            self.metrics.step(data_time, total - data_time, samples, 0.0 if value is None else value,
                              global_step=step)
        self._since, self._waited = time.perf_counter(), 0.0

    @contextmanager
    def saving(self, step: int) -> Iterator[None]:
        """The block saves a checkpoint of `step`: its time is the loop's checkpoint stall, not a step's."""
        self.save_started(step)
        try:
            yield
        finally:
            self.save_done()

    def save_started(self, step: int) -> None:
        """A save of `step` begins now (for a save made by a framework's hook; else use `saving`); one still open
        ends first."""
        self.save_done()
        self._saving = (step, time.perf_counter())

    def save_done(self) -> None:
        """The save `save_started` began is over: its "checkpoint" event (nothing when no save is open)."""
        if self._saving is None:
            return
        step, started = self._saving
        self._saving = None
        seconds = time.perf_counter() - started
        self.reporter.emit("checkpoint", step=step, stall_seconds=seconds, write_seconds=seconds)
        if self.metrics is not None:
            self.metrics.checkpointed(seconds)
        self._since, self._waited = time.perf_counter(), 0.0

    def written(self, step: int, write_seconds: float, mirror_seconds: float | None = None) -> None:
        """An asynchronous save of `step` (its stall timed by `saving`) has finished writing in the background:
        rank 0's "checkpoint_written" event {step, write_seconds, mirror_seconds}, the in-flight time the goodput
        model charges a failure with (workloads/jobspec/goodput.py)."""
        self.reporter.emit("checkpoint_written", step=step, write_seconds=write_seconds, mirror_seconds=mirror_seconds)

    def close(self) -> None:
        """End a save still open (save_done) and stop serving /metrics (the process's end does that too)."""
        self.save_done()
        if self.metrics is not None:
            self.metrics.close()
