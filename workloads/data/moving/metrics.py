"""Prometheus metrics of the stager: how far staging is, how full the staging cache is, how often S3 pushed back.

Next to the trainer's data-wait share these answer "is the GPU waiting on staging": a cache that stays full while
the trainer waits means the reader is slow; an empty cache and a flat bytes rate mean the object store is; many
evictions per epoch mean the budget is small for the reader's order (every evicted shard is fetched again).
The byte gauges keep their `window` names from the rolling-window stager, so dashboards and alerts carry on.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from workloads.data.format.errors import DataToolError
from workloads.metrics_http import MetricsServer

STAGE_METRICS_PORT_ENV = "STAGE_METRICS_PORT"


class _ServedMetrics:
    """A tool's metrics in a registry of their own, served on /metrics."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry or CollectorRegistry()
        self._endpoint = MetricsServer(self.registry)

    def serve(self, port: int, addr: str) -> int:
        """Serve /metrics on addr:port (0: a free port); returns the port."""
        try:
            return self._endpoint.serve(port, addr)
        except OSError as exc:
            raise DataToolError("--metrics-port", f"cannot listen on {addr}:{port}: {exc.strerror or exc}") from exc

    def close(self) -> None:
        self._endpoint.close()


class StageMetrics(_ServedMetrics):
    """The stager's metrics in a registry of their own (no process-global state)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self.bytes = Counter("ml_stage_bytes", "Shard bytes downloaded (every ranged GET that completed)", registry=r)
        self.retries = Counter("ml_stage_retries", "Requests retried after throttling or a dropped connection",
                               registry=r)
        self.mismatches = Counter("ml_stage_checksum_mismatches", "Shards downloaded again after a sha256 mismatch",
                                  registry=r)
        self.shards_staged = Counter("ml_stage_shards_staged", "Shards downloaded and verified by this stager",
                                     registry=r)
        self.shards = Gauge("ml_stage_shards", "Shards in the dataset's manifest", registry=r)
        self.dataset_bytes = Gauge("ml_stage_dataset_bytes", "Bytes of all shards in the manifest", registry=r)
        self.shards_ready = Gauge("ml_stage_shards_ready", "Shards verified on local disk and readable now",
                                  registry=r)
        self.shards_evicted = Counter("ml_stage_shards_evicted", "Shards the staging cache deleted to make room for "
                                      "shards the reader needs sooner", registry=r)
        self.window_used = Gauge("ml_stage_window_used_bytes", "Shard bytes held on local disk, including "
                                 "downloads in flight", registry=r)
        self.window_capacity = Gauge("ml_stage_window_capacity_bytes", "Staging-cache budget (no budget: the "
                                     "dataset's size)", registry=r)
        self.done = Gauge("ml_stage_done", "1 once the stager has staged everything it was asked for", registry=r)

    def dataset(self, shards: int, total_bytes: int, budget_bytes: int | None) -> None:
        self.shards.set(shards)
        self.dataset_bytes.set(total_bytes)
        self.window_capacity.set(total_bytes if budget_bytes is None else budget_bytes)

    def state(self, ready: int, held_bytes: int, done: bool) -> None:
        self.shards_ready.set(ready)
        self.window_used.set(held_bytes)
        self.done.set(1 if done else 0)


PACK_METRICS_PORT_ENV = "PACK_METRICS_PORT"


class PackMetrics(_ServedMetrics):
    """A pack slice's metrics (what `submit watch` turns into images/s and shards done)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        super().__init__(registry)
        r = self.registry
        self.images = Counter("ml_pack_images", "Source files this slice has been through (usable or skipped)",
                              registry=r)
        self.skipped = Counter("ml_pack_skipped", "Source files skipped as unusable", registry=r)
        self.shards = Gauge("ml_pack_shards", "Planned shards this slice owns", registry=r)
        self.shards_done = Gauge("ml_pack_shards_done", "Shards of this slice in the bucket with their record",
                                 registry=r)
