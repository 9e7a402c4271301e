"""The "is my GPU starving?" Grafana dashboard, as code (grafana-foundation-sdk builders, not a JSON blob).

Read it top to bottom: GPU utilisation (DCGM) beside the trainer's data-wait share and samples/s answers the
question; step and wait latencies say how badly; the staging row says whether the bytes are arriving (bytes/s,
shards ready, window occupancy, retries); the node row says whether NVMe or /dev/shm is about to run out; the GPU
health row says whether a GPU is sick (XIDs by code, retired pages and row remaps, NVLink errors, GPUs missing from
what a node offers) and how many GPU nodes the burn-in has passed, failed or not yet checked (docs/monitoring.md).

Every query is in `PANELS`, so the tests can run each one against a real Prometheus (Grafana's `$__rate_interval`
and the template variables substituted as Grafana would).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.timeseries import Panel as Timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from infra.monitoring.alerts import data_wait_share
from infra.monitoring.goodput import GOODPUT_GPUS, TEAM_GOODPUT_GPUS, goodput_ratio, gpu_seconds
from infra.monitoring.gpu_alerts import ksm_label, missing_gpus

DASHBOARD_UID = "ml-cluster-gpu-starving"
_DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Grafana's variables as the queries use them.
_JOB = 'namespace="$namespace", job_name=~"$job"'
_RATE = "$__rate_interval"


@dataclass(frozen=True)
class PanelSpec:
    row: str
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    description: str = ""


PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Is the GPU starving?", "GPU utilisation (DCGM) per pod", "percentunit", (
        ('avg by (pod) (DCGM_FI_DEV_GPU_UTIL{namespace="$namespace"}) / 100', "{{pod}}"),
    ), "Share of time a kernel was running on the pod's GPUs. Low here and high data-wait beside it: starving."),
    PanelSpec("Is the GPU starving?", "Data-wait share per Job", "percentunit", (
        (data_wait_share(_RATE, by="job_name", selector=_JOB), "{{job_name}}"),
    ), "Time steps spent waiting for their batch / step time. Above ~0.1 the input pipeline is the bottleneck."),
    PanelSpec("Is the GPU starving?", "Samples/s per Job", "short", (
        (f"sum by (job_name) (rate(ml_train_samples_total{{{_JOB}}}[{_RATE}]))", "{{job_name}}"),
    )),
    PanelSpec("Step time", "Step and data-wait time, p50 / p95", "s", (
        (f"histogram_quantile(0.95, sum by (job_name, le) (rate(ml_train_step_seconds_bucket{{{_JOB}}}[{_RATE}])))",
         "step p95 {{job_name}}"),
        (f"histogram_quantile(0.5, sum by (job_name, le) (rate(ml_train_step_seconds_bucket{{{_JOB}}}[{_RATE}])))",
         "step p50 {{job_name}}"),
        (f"histogram_quantile(0.95, sum by (job_name, le) "
         f"(rate(ml_train_data_wait_seconds_bucket{{{_JOB}}}[{_RATE}])))", "wait p95 {{job_name}}"),
    )),
    PanelSpec("Step time", "Progress (epochs done, fraction)", "percentunit", (
        (f"max by (job_name) ((ml_train_epoch{{{_JOB}}} + ml_train_epoch_batches_done{{{_JOB}}}"
         f" / ml_train_epoch_batches{{{_JOB}}}) / ml_train_epochs{{{_JOB}}})", "{{job_name}}"),
    )),
    PanelSpec("Staging", "Staged bytes/s", "Bps", (
        (f"sum by (job_name) (rate(ml_stage_bytes_total{{{_JOB}}}[{_RATE}]))", "{{job_name}}"),
    )),
    PanelSpec("Staging", "Shards ready / evicted / total", "short", (
        (f"sum by (job_name) (ml_stage_shards_ready{{{_JOB}}})", "ready {{job_name}}"),
        (f"sum by (job_name) (ml_stage_shards_evicted_total{{{_JOB}}})", "evicted {{job_name}}"),
        (f"sum by (job_name) (ml_stage_shards{{{_JOB}}})", "total {{job_name}}"),
    )),
    PanelSpec("Staging", "Window occupancy and S3 retries/s", "percentunit", (
        (f"max by (job_name) (ml_stage_window_used_bytes{{{_JOB}}} / ml_stage_window_capacity_bytes{{{_JOB}}})",
         "window {{job_name}}"),
        (f"sum by (job_name) (rate(ml_stage_retries_total{{{_JOB}}}[{_RATE}]))", "retries/s {{job_name}}"),
    )),
    PanelSpec("Nodes", "GPU utilisation (DCGM) per node", "percentunit", (
        ("avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL) / 100", "{{Hostname}}"),
    )),
    PanelSpec("Nodes", "NVMe scratch and /dev/shm use", "percentunit", (
        ('max by (node) (ml_train_filesystem_used_bytes{volume="data"}'
         ' / ml_train_filesystem_size_bytes{volume="data"})', "NVMe {{node}}"),
        ('max by (pod) (ml_train_filesystem_used_bytes{volume="shm"} / ml_train_filesystem_size_bytes{volume="shm"})',
         "/dev/shm {{pod}}"),
    )),
)


def gpu_health_panels(label_prefix: str) -> tuple[PanelSpec, ...]:
    """The GPU health row. The burn-in's verdicts come from kube-state-metrics: the nodes' `<prefix>/gpu-health`
    and `<prefix>/gpu-count` labels (allowlisted in infra/monitoring/component.py) and the burn-in's taint."""
    health = ksm_label(f"{label_prefix}/gpu-health")
    count = ksm_label(f"{label_prefix}/gpu-count")
    gpu_nodes = f'kube_node_labels{{{count}!=""}}'
    return (
        PanelSpec("GPU health", "XIDs by code (per node, exporter window)", "short", (
            ("sum by (Hostname, xid) (DCGM_EXP_XID_ERRORS_COUNT > 0)", "{{Hostname}} XID {{xid}}"),
        ), "XIDs each node's GPUs raised, by code, within dcgm-exporter's XID window. The codes and what to do: "
           "docs/monitoring.md, the XID table."),
        PanelSpec("GPU health", "Retired pages and remapped rows (per GPU)", "short", (
            ("max by (Hostname, gpu) (DCGM_FI_DEV_RETIRED_DBE + DCGM_FI_DEV_RETIRED_SBE)",
             "retired pages {{Hostname}} GPU {{gpu}}"),
            ("max by (Hostname, gpu) (DCGM_FI_DEV_RETIRED_PENDING > 0)", "pending retirement {{Hostname}} GPU {{gpu}}"),
            ("max by (Hostname, gpu) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS)",
             "remapped rows {{Hostname}} GPU {{gpu}}"),
            ("max by (Hostname, gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE > 0)", "remap FAILED {{Hostname}} GPU {{gpu}}"),
        ), "Memory the driver took out of service: page retirement (before Ampere), row remapping (Ampere and "
           "later). A row-remap failure means replace the node."),
        PanelSpec("GPU health", "NVLink errors/s (per node)", "short", (
            (f"sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL[{_RATE}]))",
             "CRC {{Hostname}}"),
            (f"sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL[{_RATE}]))", "replay {{Hostname}}"),
            (f"sum by (Hostname) (rate(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[{_RATE}]))",
             "recovery {{Hostname}}"),
        )),
        PanelSpec("GPU health", "GPUs offered by nodes short of their type's count", "short", (
            (missing_gpus(label_prefix), "{{node}}"),
        ), "A node here offers fewer nvidia.com/gpu than its <prefix>/gpu-count label: a GPU the device plugin "
           "marked unhealthy or one that fell off the bus (runbook: missing GPUs)."),
        PanelSpec("GPU health", "GPU nodes by burn-in verdict", "short", (
            (f'count by ({health}) (kube_node_labels{{{health}!=""}} and on (node) {gpu_nodes})',
             f"{{{{{health}}}}}"),
            (f'count({gpu_nodes} unless on (node) kube_node_labels{{{health}!=""}})', "not checked yet"),
            (f'count(kube_node_spec_taint{{key="{label_prefix}/gpu-health"}})', "tainted by the burn-in"),
        ), "passed: Jobs may run there; failed: tainted and cordoned (the reason is the node's "
           "gpu-health-reason annotation); not checked yet: in burn-in, gangs wait for it."),
    )


GOODPUT_PANELS: tuple[PanelSpec, ...] = (
    PanelSpec("Goodput", "GPUs by goodput bucket", "short", (
        (f"sum by (bucket) ({GOODPUT_GPUS}{{{_JOB}}})", "{{bucket}}"),
    ), "Where the selected Jobs' GPUs are now: productive, or a badput bucket (data_wait, checkpoint, recompute, "
       "restart, startup, capacity). Definitions: docs/monitoring.md, 'Measured goodput'."),
    PanelSpec("Goodput", "Goodput per Job over the dashboard's range", "percentunit", (
        (goodput_ratio("$__range", _JOB, by="job_name"), "{{job_name}}"),
    ), "Productive GPU-seconds over all GPU-seconds the Job's pods held in the range."),
    PanelSpec("Goodput", "GPU-hours per team and bucket over the range", "short", (
        (f"{gpu_seconds('$__range', by='namespace, bucket', series=TEAM_GOODPUT_GPUS)} / 3600",
         "{{namespace}} {{bucket}}"),
    ), "Every namespace's (a team's) GPU-hours in the range by bucket."),
)


def all_panels(label_prefix: str = "ml-cluster.io") -> tuple[PanelSpec, ...]:
    return (*PANELS, *GOODPUT_PANELS, *gpu_health_panels(label_prefix))


def build_dashboard(label_prefix: str = "ml-cluster.io") -> Dashboard:
    builder = (
        Dashboard("Training: is my GPU starving?")
        .uid(DASHBOARD_UID)
        .tags(["ml-cluster", "training", "gpu"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(QueryVariable("namespace").label("Namespace").datasource(_DATASOURCE)
                       .query("label_values(ml_train_steps_total, namespace)"))
        .with_variable(QueryVariable("job").label("Job").datasource(_DATASOURCE).multi(True).include_all(True)
                       .all_value(".*").query('label_values(ml_train_steps_total{namespace="$namespace"}, job_name)'))
    )
    row = None
    for panel in all_panels(label_prefix):
        if panel.row != row:
            row = panel.row
            builder = builder.with_row(Row(row))
        timeseries = Timeseries().title(panel.title).unit(panel.unit).datasource(_DATASOURCE).height(8).span(12)
        if panel.description:
            timeseries = timeseries.description(panel.description)
        for index, (expr, legend) in enumerate(panel.queries):
            timeseries = timeseries.with_target(Dataquery().expr(expr).legend_format(legend).ref_id("ABCDEFGH"[index]))
        builder = builder.with_panel(timeseries)
    return builder


def dashboard_json(label_prefix: str = "ml-cluster.io") -> str:
    """The dashboard model as Grafana imports it (sorted keys: the same code gives the same bytes, a stable plan)."""
    model: Any = json.loads(JSONEncoder(sort_keys=True).encode(build_dashboard(label_prefix).build()))
    return json.dumps(model, sort_keys=True, indent=1)


def panel_queries(label_prefix: str = "ml-cluster.io") -> list[str]:
    return [expr for panel in all_panels(label_prefix) for expr, _legend in panel.queries]
