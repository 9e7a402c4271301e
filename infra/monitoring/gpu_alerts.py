"""GPU-health alerts: one rule per XID code of the table (infra/monitoring/xid.py), DCGM's memory and NVLink health
fields, and nodes that offer fewer GPUs than their type has.

What the series are (dcgm-exporter 4.8.2, chart templates/metrics-configmap.yaml):
- `DCGM_FI_DEV_XID_ERRORS` (:42) is a gauge holding the *last* XID a GPU raised, not a count. A fatal code is
  therefore latched: the rule looks back `xidLatchMinutes` for any sample equal to the code, so the XID 45 or 43
  that usually follows a crash, or the GPU's series vanishing (a GPU off the bus), does not silence it.
- `DCGM_EXP_XID_ERRORS_COUNT{xid="N"}`: XIDs per code within the exporter's window (`--xid-count-window-size`):
  the only count of repeated application-class XIDs. Like the retired-page and NVLink error
  fields it is not in the chart's default list; infra/nodes/gpu.py's metric list enables them.
- `DCGM_FI_DEV_ROW_REMAP_FAILURE` (:79), `DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS` (:77): Ampere and later;
  `DCGM_FI_DEV_RETIRED_*` (:61-63): page retirement (pre-Ampere); `DCGM_FI_DEV_NVLINK_*_ERROR_COUNT_TOTAL` (:66-69).
Where a GPU does not report a field the rule has no series and stays quiet.

Missing GPUs: kube-state-metrics' `kube_node_status_allocatable{resource="nvidia_com_gpu"}` against the node's
`<prefix>/gpu-count` label (set on every GPU pool from the instance type; kube-state-metrics exports it as
`kube_node_labels{label_<prefix>_gpu_count}` once allowlisted, infra/monitoring/component.py). A GPU the device
plugin marks unhealthy leaves allocatable; one that fell off the bus leaves capacity too; both show up here.
"""

from __future__ import annotations

import re

from infra.config.monitoring import AlertThresholds
from infra.monitoring.alertrule import AlertRule
from infra.monitoring.xid import XIDS, codes

GPU_LABELS = "Hostname, gpu, UUID"
# The GPU counts of EC2 GPU instance types (1, 2, 4, 8) and larger boards; one clause each in the missing-GPU rule.
GPU_COUNTS = (1, 2, 4, 8, 16)
FOR_MINUTES = {"replace": 1, "drain": 2, "reset": 2}
SEVERITY = {"replace": "critical", "drain": "critical", "reset": "warning"}
RUNBOOK = {"replace": "runbook-replace-the-node", "drain": "runbook-drain-and-diagnose",
           "reset": "runbook-reset-the-gpu", "ignore": "runbook-application-xids"}


def ksm_label(label_key: str) -> str:
    """kube-state-metrics' name for a node label: `ml-cluster.io/gpu-count` -> `label_ml_cluster_io_gpu_count`."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label_key)


def xid_seen(code: int, latch_minutes: int) -> str:
    """1 per GPU that showed `code` as its last XID at any point in the latch window."""
    return (f"max by ({GPU_LABELS}) (max_over_time((DCGM_FI_DEV_XID_ERRORS == bool {code})"
            f"[{latch_minutes}m:]))")


def unknown_xid(latch_minutes: int) -> str:
    """The last XID, per GPU, when it is a code the table does not list (each `!= N` filters one code out)."""
    filtered = "(DCGM_FI_DEV_XID_ERRORS > 0)"
    for xid in XIDS:
        filtered = f"({filtered} != {xid.code})"
    return f"max by ({GPU_LABELS}) (max_over_time({filtered}[{latch_minutes}m:]))"


def missing_gpus(label_prefix: str) -> str:
    """Per GPU node: the GPUs it offers, when fewer than its gpu-count label says (0 when it offers none)."""
    count_label = ksm_label(f"{label_prefix}/gpu-count")
    clauses = []
    for count in GPU_COUNTS:
        labelled = f'kube_node_labels{{{count_label}="{count}"}}'
        offered = (f'(max by (node) (kube_node_status_allocatable{{resource="nvidia_com_gpu"}})'
                   f" * on (node) group_left () max by (node) ({labelled}))")
        none = (f"(max by (node) ({labelled}) * 0 unless on (node) "
                f'kube_node_status_allocatable{{resource="nvidia_com_gpu"}})')
        clauses.append(f"(({offered} or {none}) < {count})")
    return " or ".join(clauses)


def _per_gpu(name: str, signal: str, comparison: str, for_minutes: int, severity: str, action: str, summary: str,
             detail: str, runbook: str | None = None) -> AlertRule:
    """A rule over one GPU's series: the description names the GPU, the `action` label says what to do with the
    node, and the runbook is that action's unless given."""
    return AlertRule(name=name, signal=signal, comparison=comparison, for_minutes=for_minutes, severity=severity,
                     summary=summary, description="{{ $labels.Hostname }} GPU {{ $labels.gpu }}: " + detail,
                     labels={"action": action}, runbook=RUNBOOK[action] if runbook is None else runbook)


def gpu_health_rules(thresholds: AlertThresholds, label_prefix: str = "ml-cluster.io") -> list[AlertRule]:
    latch = thresholds.xid_latch_minutes
    rules = [
        AlertRule(
            name=f"GpuXid{xid.code}",
            signal=xid_seen(xid.code, latch),
            comparison="> 0",
            for_minutes=FOR_MINUTES[xid.action],
            severity=SEVERITY[xid.action],
            summary=f"XID {xid.code} on a GPU: {xid.meaning} ({xid.action})",
            description=f"{{{{ $labels.Hostname }}}} GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) raised XID "
                        f"{xid.code} {xid.mnemonic} in the last {latch}m; NVIDIA's action: {xid.nvidia_action}. "
                        f"This stack's action: {xid.action} (see the runbook).",
            labels={"xid": str(xid.code), "action": xid.action},
            runbook=RUNBOOK[xid.action],
        )
        for xid in XIDS if xid.action != "ignore"
    ]
    app_codes = "|".join(str(code) for code in codes("ignore"))
    rules += [
        _per_gpu("GpuXidUnknown", unknown_xid(latch), "> 0", FOR_MINUTES["drain"], "warning", "drain",
                 "A GPU raised an XID the table does not know",
                 "XID {{ $value }}. Look it up in NVIDIA's catalogue, add it to infra/monitoring/xid.py; until then "
                 "treat the node as suspect."),
        _per_gpu("GpuApplicationXidsFrequent",
                 f'max by ({GPU_LABELS}, xid) (DCGM_EXP_XID_ERRORS_COUNT{{xid=~"{app_codes}"}})',
                 f"> {thresholds.app_xids_per_window}", 5, "warning", "drain",
                 "A GPU keeps raising application-class XIDs",
                 "{{ $value }} XID {{ $labels.xid }} in the exporter's window. One is the application's fault; a "
                 "steady stream on one GPU while others run the same code points at the node.",
                 runbook=RUNBOOK["ignore"]),
        _per_gpu("GpuRowRemapFailure", f"max by ({GPU_LABELS}) (DCGM_FI_DEV_ROW_REMAP_FAILURE)", "> 0", 1,
                 "critical", "replace", "GPU memory row remapping failed (no spare rows left)",
                 "row remap failed; the GPU cannot isolate further memory errors."),
        _per_gpu("GpuUncorrectableRowsRemapped",
                 f"max by ({GPU_LABELS}) (increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[1h]))", "> 0", 1,
                 "warning", "reset", "GPU memory rows were remapped after uncorrectable errors",
                 "{{ $value }} rows remapped in the last hour; the remap takes effect at the next GPU reset."),
        _per_gpu("GpuRetiredPagesPending", f"max by ({GPU_LABELS}) (DCGM_FI_DEV_RETIRED_PENDING)", "> 0", 5,
                 "warning", "reset", "GPU memory pages wait for retirement",
                 "{{ $value }} pages are retired at the next GPU reset."),
        _per_gpu("GpuPagesRetiredDoubleBit", f"max by ({GPU_LABELS}) (increase(DCGM_FI_DEV_RETIRED_DBE[1h]))",
                 "> 0", 1, "critical", "drain", "GPU memory pages retired after double-bit errors",
                 "{{ $value }} pages retired for double-bit errors in the last hour."),
        _per_gpu("GpuNvlinkErrors",
                 (f"max by ({GPU_LABELS}) (increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[10m])"
                  " + increase(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL[10m]))"),
                 "> 0", 5, "warning", "drain", "NVLink recovery or data CRC errors",
                 "{{ $value }} NVLink recovery/CRC errors in 10 minutes; all-reduce over NVLink slows or fails."),
        AlertRule(
            name="GpuMissingFromAllocatable",
            signal=missing_gpus(label_prefix),
            comparison=">= 0",
            for_minutes=thresholds.missing_gpu_minutes,
            severity="critical",
            summary="A GPU node offers fewer GPUs than its type has",
            description="{{ $labels.node }} offers {{ $value }} nvidia.com/gpu; a gang that needs every GPU of a "
                        "node stays Pending. The device plugin marked a GPU unhealthy or a GPU fell off the bus.",
            labels={"action": "replace"},
            runbook="runbook-missing-gpus",
        ),
    ]
    return rules
