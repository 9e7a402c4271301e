"""`ml-cluster:monitoring`: collect the Jobs', the stager's and DCGM's metrics.

Off by default. When on, the Jobs' namespace admits the monitoring namespace to the metrics ports (it denies all
other ingress), and one of:

- `in-cluster`: kube-prometheus-stack in `namespace` (Prometheus, operator, Grafana, node exporter), retention and
  storage sized here, alerts and the "is my GPU starving?" dashboard installed with it;
- `remote-write`: a Prometheus that already runs elsewhere, or Amazon Managed Service for Prometheus (sigv4), is
  the store; the scrape side still runs here.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from infra.config.base import DnsLabel, Quantity, StrictModel
from infra.config.external import ExternalRelease
from workloads.k8snames import DNS1123_SUBDOMAIN_PATTERN

# Prometheus durations as its flags accept them (--storage.tsdb.retention.time, scrape_interval): 15d, 12h, 30s.
_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


class AlertThresholds(StrictModel):
    data_wait_share: float = Field(default=0.3, gt=0, lt=1)
    """share of step time spent waiting for data"""
    gpu_idle_utilization: float = Field(default=0.05, ge=0, lt=1)
    """below this the GPU counts as idle"""
    nvme_full_ratio: float = Field(default=0.9, gt=0, lt=1)
    """share of the node's NVMe file system used"""
    for_minutes: int = Field(default=10, ge=1, le=1440)
    """how long a condition holds before it fires"""
    pending_minutes: int = Field(default=15, ge=1, le=1440)
    """a Job's pod Pending this long is stuck"""
    reservation_end_minutes: int = Field(default=60, ge=1, le=10080)
    """warn this long before a reservation's endTime"""
    reserved_idle_minutes: int = Field(default=30, ge=1, le=1440)
    """reserved GPUs that no running pod uses for this long alert (the reservation bills them anyway)"""
    restarts_per_hour: int = Field(default=3, ge=1, le=1000)
    ("a Job whose gang restarted more often than this within an hour alerts (disruptions do not spend backoffLimit, "
     "so nothing else stops a Job churning on flapping nodes or Spot reclaims)")
    # GPU health (infra/monitoring/gpu_alerts.py)
    xid_latch_minutes: int = Field(default=30, ge=5, le=1440)
    """a fatal XID stays alerting this long after DCGM last showed it"""
    app_xids_per_window: int = Field(default=5, ge=1, le=10000)
    ("application-class XIDs (13, 31, 43, 45, 94) on one GPU within dcgm-exporter's XID window before the node is "
     "suspect")
    missing_gpu_minutes: int = Field(default=10, ge=1, le=1440)
    """a node offering fewer GPUs than its type has, this long, alerts"""


class RemoteWriteConfig(StrictModel):
    url: str
    """remote-write endpoint (https)"""
    sigv4_region: str | None = None
    """Amazon Managed Service for Prometheus: sign with SigV4 in this region"""

    @field_validator("url")
    @classmethod
    def _https(cls, value: str) -> str:
        if not value.startswith("https://"):
            raise ValueError(f"{value!r}: remote write must use https (samples carry Job and node names)")
        return value


# The objects the monitoring component creates beside the chart are named here, so that the derived-name check
# knows them without importing the component.
MONITOR_AND_RULE_NAME = "training"  # the PodMonitor and the PrometheusRule
DASHBOARD_CONFIGMAP_NAME = "training-dashboard"


class MonitoringConfig(StrictModel):
    enabled: bool = False
    """collect the Jobs', the stager's and DCGM's metrics (and admit the monitoring namespace to the metrics ports)"""
    mode: Literal["in-cluster", "remote-write"] = "in-cluster"
    ("in-cluster: kube-prometheus-stack here stores the metrics; remote-write: they go to an existing Prometheus or "
     "Amazon Managed Prometheus")
    namespace: DnsLabel = "monitoring"
    """the namespace of the monitoring stack"""
    chart_version: str = Field(default="88.5.3", pattern=r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    """kube-prometheus-stack chart (an exact version: the chart is pinned)"""
    external: ExternalRelease | None = None
    ("the kube-prometheus-stack the cluster already runs (existing clusters, mode in-cluster): the stack installs "
     "none and puts its PodMonitor, PrometheusRule and dashboard in that release's namespace, labelled release: <its "
     "name> as the chart's default selectors want; retention, storage and scrapeInterval are then that Prometheus's "
     "own")
    scrape_interval: str = "15s"
    """how often Prometheus scrapes (a Prometheus duration)"""
    retention: str = "15d"
    """how long Prometheus keeps samples"""
    storage_size: Quantity = "50Gi"
    """Prometheus' volume (gp3 on EKS)"""
    storage_class: str | None = Field(default=None, max_length=253, pattern=DNS1123_SUBDOMAIN_PATTERN)
    """None: the cluster's default class"""
    grafana: bool = True
    """Grafana with the dashboard (in-cluster mode)"""
    remote_write: RemoteWriteConfig | None = None
    """with mode remote-write: where the samples go"""
    alerts: AlertThresholds = Field(default_factory=AlertThresholds)
    """the alert rules' thresholds"""

    @field_validator("scrape_interval", "retention")
    @classmethod
    def _duration(cls, value: str) -> str:
        if not _DURATION.match(value):
            raise ValueError(f"{value!r} is not a Prometheus duration (e.g. 15s, 12h, 15d)")
        if not any(int(number) for number in re.findall(r"[0-9]+", value)):
            raise ValueError(f"{value!r}: must be longer than 0 (Prometheus refuses a zero interval or retention)")
        return value

    @model_validator(mode="after")
    def _remote_write_needs_a_target(self) -> MonitoringConfig:
        if self.mode == "remote-write" and self.remote_write is None:
            raise ValueError("mode remote-write needs remoteWrite.url")
        if self.external is not None and (not self.enabled or self.mode != "in-cluster"):
            raise ValueError("external: the cluster's kube-prometheus-stack is used with enabled: true and mode "
                             "in-cluster (remote write is that Prometheus's own setting)")
        return self

    def side_objects(self) -> list[tuple[str, str]]:
        """(kind, name) of every object created beside the chart, in the order the component builds them."""
        objects = [("PodMonitor", MONITOR_AND_RULE_NAME), ("PrometheusRule", MONITOR_AND_RULE_NAME)]
        if self.grafana_enabled():
            objects.append(("ConfigMap", DASHBOARD_CONFIGMAP_NAME))
        return objects

    @property
    def prometheus_namespace(self) -> str:
        """Where Prometheus runs and the stack's PodMonitor, PrometheusRule and dashboard go: the stack's monitoring
        namespace, or the adopted release's (external)."""
        return self.external.namespace or self.namespace if self.external is not None else self.namespace

    def grafana_enabled(self) -> bool:
        return self.grafana and self.mode == "in-cluster"
