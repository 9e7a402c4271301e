"""Prometheus metrics of a training run, served over HTTP for the cluster's Prometheus and `submit watch`.

The loop reports what it already measures (time waiting for the next batch, time for the whole step, samples,
loss, position); everything a dashboard needs is derived by PromQL from counters and histograms, so any window
can be chosen at query time:

    data-wait share   rate(ml_train_data_wait_seconds_sum[5m]) / rate(ml_train_step_seconds_sum[5m])
    samples/s         rate(ml_train_samples_total[5m])

GPU utilisation and memory are read when Prometheus scrapes (NVML through nvidia-ml-py), not in the step: an NVML
call per step would cost more than the figure is worth. On a CPU-only run those series are simply absent.

Every process of a Job serves its own endpoint: torchrun starts one process per GPU, so a process listens on the
base port plus its local rank (see `metrics_port_for`), and Prometheus scrapes each rank of each pod.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from workloads.metrics_http import DEFAULT_METRICS_ADDR, MetricsServer

METRICS_PORT_ENV = "METRICS_PORT"

# A step of a small model on a fast GPU takes milliseconds; a large one, or a starved loader, seconds to minutes.
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Waiting for data is sub-millisecond when the loader keeps up; the interesting tail is long.
WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def metrics_port_for(base: int, local_rank: int) -> int:
    """The port of one process: base + local rank (0 keeps metrics off for every rank)."""
    if base == 0:
        return 0
    port = base + local_rank
    if not 0 < port < 65536:
        raise ValueError(f"--metrics-port: {base} + local rank {local_rank} is not a TCP port")
    return port



class MetricsPortError(ValueError):
    """The configured metrics port cannot be listened on (taken, not allowed): a config error of the pod."""

class _GpuCollector(Collector):
    """GPU utilisation and memory of this process's device, read from NVML at scrape time."""

    def __init__(self, device_index: int) -> None:
        self.device_index = device_index
        self._lock = threading.Lock()
        self._handle: Any = None
        self._failed = False

    def _nvml(self) -> Any:
        with self._lock:
            if self._handle is None and not self._failed:
                try:
                    import pynvml  # nvidia-ml-py; the driver's libnvidia-ml is only on GPU nodes

                    pynvml.nvmlInit()
                    self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device_index)
                except Exception:  # no driver, no library: report nothing rather than fail a scrape
                    self._failed = True
            return self._handle

    def collect(self) -> Iterator[GaugeMetricFamily]:
        handle = self._nvml()
        if handle is None:
            return
        import pynvml

        try:
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        except Exception:
            return
        labels = ["gpu"]
        value = [str(self.device_index)]
        utilisation = GaugeMetricFamily("ml_train_gpu_utilization_ratio",
                                        "Share of the last sample period the GPU was busy (NVML), 0..1", labels=labels)
        utilisation.add_metric(value, rates.gpu / 100.0)
        used = GaugeMetricFamily("ml_train_gpu_memory_used_bytes", "GPU memory in use on the device (NVML)",
                                 labels=labels)
        used.add_metric(value, float(memory.used))
        total = GaugeMetricFamily("ml_train_gpu_memory_total_bytes", "GPU memory of the device (NVML)", labels=labels)
        total.add_metric(value, float(memory.total))
        yield utilisation
        yield used
        yield total


class _FilesystemCollector(Collector):
    """Size and use of the file systems a run depends on, read at scrape time: /dev/shm (DataLoader batches; a full
    one is a bus error) and the data directory (on staged Jobs the node's NVMe RAID, shared with the stager)."""

    def __init__(self, volumes: dict[str, str]) -> None:
        self.volumes = dict(volumes)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        size = GaugeMetricFamily("ml_train_filesystem_size_bytes", "Size of the file system holding a volume the "
                                 "run uses", labels=["volume"])
        used = GaugeMetricFamily("ml_train_filesystem_used_bytes", "Bytes in use on that file system",
                                 labels=["volume"])
        for volume, path in sorted(self.volumes.items()):
            try:
                stat = os.statvfs(path)
            except OSError:  # not there (a CPU laptop run without /dev/shm, a manifest path): no series
                continue
            size.add_metric([volume], float(stat.f_blocks * stat.f_frsize))
            used.add_metric([volume], float((stat.f_blocks - stat.f_bfree) * stat.f_frsize))
        yield size
        yield used


@dataclass(frozen=True)
class RunShape:
    """What the run will do, known once the data is indexed: the denominators of progress and ETA."""

    epochs: int
    batches_per_epoch: int
    batch_size: int
    world_size: int
    rank: int


class TrainMetrics:
    """The trainer's metrics in a registry of their own (no process-global state: tests run several trainers)."""

    def __init__(self, registry: CollectorRegistry | None = None, gpu_index: int | None = None,
                 volumes: dict[str, str] | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.step_seconds = Histogram("ml_train_step_seconds", "Wall time of a training step: waiting for the batch "
                                      "plus compute", buckets=STEP_BUCKETS, registry=r)
        self.data_wait_seconds = Histogram("ml_train_data_wait_seconds", "Time a step waited for its batch from the "
                                           "data loader", buckets=WAIT_BUCKETS, registry=r)
        self.samples = Counter("ml_train_samples", "Samples this rank trained on", registry=r)
        self.steps = Counter("ml_train_steps", "Optimiser steps this rank took", registry=r)
        # goodput (infra/monitoring/goodput.py): the step a restarted gang must pass before its work is new again,
        # and the time the loop was blocked saving checkpoints
        self.global_step = Gauge("ml_train_global_step", "The run's optimiser step (resumed runs continue it)",
                                 registry=r)
        self.checkpoint_stall = Counter("ml_train_checkpoint_stall_seconds", "Seconds the training loop was blocked "
                                        "saving checkpoints", registry=r)
        self.loss = Gauge("ml_train_loss", "Loss of the last step on this rank", registry=r)
        self.epoch = Gauge("ml_train_epoch", "Current epoch, 0-based", registry=r)
        self.epochs = Gauge("ml_train_epochs", "Epochs the run trains for", registry=r)
        self.epoch_batch = Gauge("ml_train_epoch_batches_done", "Batches done in the current epoch", registry=r)
        self.epoch_batches = Gauge("ml_train_epoch_batches", "Batches per epoch on this rank", registry=r)
        self.batch_size = Gauge("ml_train_batch_size", "Samples per batch on this rank", registry=r)
        self.world_size = Gauge("ml_train_world_size", "Processes in the run", registry=r)
        self.rank = Gauge("ml_train_rank", "This process's global rank", registry=r)
        self.start_time = Gauge("ml_train_start_time_seconds", "Unix time the run started", registry=r)
        self.done = Gauge("ml_train_done", "1 once the run has finished its last epoch", registry=r)
        self._endpoint = MetricsServer(self.registry)
        if gpu_index is not None:
            r.register(_GpuCollector(gpu_index))
        if volumes:
            r.register(_FilesystemCollector(volumes))

    # -- what the loop reports ----------------------------------------------------------------------------------
    def started(self, shape: RunShape) -> None:
        self.start_time.set(time.time())
        self.epochs.set(shape.epochs)
        self.epoch_batches.set(shape.batches_per_epoch)
        self.batch_size.set(shape.batch_size)
        self.world_size.set(shape.world_size)
        self.rank.set(shape.rank)

    def epoch_started(self, epoch: int, first_batch: int) -> None:
        self.epoch.set(epoch)
        self.epoch_batch.set(first_batch)

    def step(self, data_wait_s: float, compute_s: float, samples: int, loss: float,
             global_step: int | None = None) -> None:
        self.data_wait_seconds.observe(data_wait_s)
        if global_step is not None:
            self.global_step.set(global_step)
        self.step_seconds.observe(data_wait_s + compute_s)
        self.samples.inc(samples)
        self.steps.inc()
        self.epoch_batch.inc()
        self.loss.set(loss)

    def checkpointed(self, stall_s: float) -> None:
        self.checkpoint_stall.inc(max(0.0, stall_s))

    def finished(self) -> None:
        self.done.set(1)

    # -- serving ------------------------------------------------------------------------------------------------
    def serve(self, port: int, addr: str = DEFAULT_METRICS_ADDR) -> int:
        """Serve /metrics on addr:port (port 0: a free one, for tests); returns the port."""
        try:
            return self._endpoint.serve(port, addr)
        except OSError as exc:
            raise MetricsPortError(f"--metrics-port: cannot listen on {addr}:{port}: {exc.strerror or exc}") \
                from exc

    def close(self) -> None:
        self._endpoint.close()


