"""The alerts on training Jobs, as data: what each one watches (a PromQL signal), when it fires, and why.

Kept apart from the Kubernetes objects that carry them (infra/monitoring/component.py) so the same rules are checked by
`promtool check rules` and evaluated against a real Prometheus in the tests, and can be handed to a Prometheus that
is not ours (remote-write mode) as a plain rule file.

Label conventions (set by the PodMonitor's relabelings, see infra/monitoring/component.py): every trainer and stager
series carries `namespace`, `pod`, `job_name` (the Job, from app.kubernetes.io/instance) and `node`; DCGM series
carry the `namespace` and `pod` of the workload holding the GPU (dcgm-exporter's pod mapping, scraped with
honorLabels) and `Hostname`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.config.monitoring import AlertThresholds
from infra.monitoring.alertrule import RUNBOOK, AlertRule
from infra.monitoring.gpu_alerts import gpu_health_rules

__all__ = ["GPU_HEALTH_GROUP", "RULE_GROUP", "RUNBOOK", "AlertRule", "alert_rules", "data_wait_share",
           "gang_restarts_last_hour", "gpu_utilisation_of_training_pods", "namespace_match", "rule_groups"]

RULE_GROUP = "ml-cluster-training"
GPU_HEALTH_GROUP = "ml-cluster-gpu-health"

Namespaces = str | Sequence[str]  # the training namespace, or it and the tenant teams' namespaces


def namespace_match(namespaces: Namespaces) -> str:
    """The label matcher for the namespaces Jobs run in: `namespace="training"` for one (the rules of a stack
    without tenant teams stay as they were), `namespace=~"training|team-a"` for several (DNS labels: no regex
    metacharacters to escape)."""
    names = [namespaces] if isinstance(namespaces, str) else list(dict.fromkeys(namespaces))
    return f'namespace="{names[0]}"' if len(names) == 1 else f'namespace=~"{"|".join(names)}"'


def gang_restarts_last_hour(namespace: Namespaces) -> str:
    """Per Job: its pods that failed and were created within the last hour, over the Job's parallelism (a gang
    restart replaces every pod of the gang), from kube-state-metrics."""
    ns = namespace_match(namespace)
    failed = (f'(kube_pod_status_phase{{{ns}, phase="Failed"}} == 1)'
              f' and on (namespace, pod) ((time() - kube_pod_created{{{ns}}}) < 3600)')
    by_job = (f"sum by (namespace, owner_name) (({failed}) * on (namespace, pod) group_left (owner_name)"
              f' kube_pod_owner{{{ns}, owner_kind="Job"}})')
    parallelism = ("max by (namespace, owner_name) (label_replace("
                   f'kube_job_spec_parallelism{{{ns}}}, "owner_name", "$1", "job_name", "(.+)"))')
    return f"{by_job} / on (namespace, owner_name) {parallelism}"


def data_wait_share(window: str, by: str = "namespace, job_name", selector: str = "") -> str:
    """Share of step time spent waiting for the next batch, per Job: 0 = the loader keeps up, 1 = pure waiting."""
    match = f"{{{selector}}}" if selector else ""
    return (f"sum by ({by}) (rate(ml_train_data_wait_seconds_sum{match}[{window}]))"
            f" / sum by ({by}) (rate(ml_train_step_seconds_sum{match}[{window}]))")


def gpu_utilisation_of_training_pods(namespace: Namespaces) -> str:
    """DCGM's utilisation (percent) of the GPUs held by training pods, as a 0..1 ratio per pod."""
    return f"avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{{namespace_match(namespace)}}}) / 100"


def alert_rules(thresholds: AlertThresholds, training_namespace: str,
                team_namespaces: Sequence[str] = ()) -> list[AlertRule]:
    """The training alerts, over the training namespace and the tenant teams' namespaces."""
    ns: Namespaces = (training_namespace, *team_namespaces)
    match = namespace_match(ns)
    return [
        AlertRule(
            name="TrainingGpuIdle",
            # Only pods whose trainer is still running: a finished run's GPU is released, not idle.
            signal=f"{gpu_utilisation_of_training_pods(ns)} and on (namespace, pod) "
                   f"(max by (namespace, pod) (ml_train_done{{{match}}}) == 0)",
            comparison=f"< {thresholds.gpu_idle_utilization}",
            for_minutes=thresholds.for_minutes,
            severity="warning",
            summary="GPU idle while its training Job runs",
            description="{{ $labels.namespace }}/{{ $labels.pod }}: GPU utilisation {{ $value | humanizePercentage }}"
                        " while the trainer has not finished. Check the data-wait share and the stager.",
        ),
        AlertRule(
            name="TrainingDataStarved",
            signal=data_wait_share("5m"),
            comparison=f"> {thresholds.data_wait_share}",
            for_minutes=thresholds.for_minutes,
            severity="warning",
            summary="Training Job spends a large share of each step waiting for data",
            description="{{ $labels.job_name }} waits for its next batch {{ $value | humanizePercentage }} of the "
                        "time: more DataLoader workers, the dataset staged onto NVMe instead of a network mount, or a "
                        "larger staging-cache budget (dataset.stagedSize).",
        ),
        AlertRule(
            name="TrainingNvmeAlmostFull",
            signal="max by (node) (ml_train_filesystem_used_bytes{volume=\"data\"}"
                   " / ml_train_filesystem_size_bytes{volume=\"data\"})",
            comparison=f"> {thresholds.nvme_full_ratio}",
            for_minutes=5,
            severity="critical",
            summary="The node's NVMe scratch (staged datasets) is almost full",
            description="{{ $labels.node }}: {{ $value | humanizePercentage }} used; staging will fail with ENOSPC.",
        ),
        AlertRule(
            name="TrainingJobStuckPending",
            # kube-state-metrics: a pod of a training Job that the scheduler has not placed.
            signal=f'max by (namespace, pod) (kube_pod_status_phase{{{match}, phase="Pending"}})',
            comparison="== 1",
            for_minutes=thresholds.pending_minutes,
            severity="warning",
            summary="Training pod Pending",
            description="{{ $labels.namespace }}/{{ $labels.pod }} has been Pending: no node with free GPUs/NVMe, "
                        "a pool at its max size, or a quota. `kubectl describe pod` shows the scheduler's reason.",
        ),
        AlertRule(
            name="TrainingJobRestarting",
            signal=gang_restarts_last_hour(ns),
            comparison=f"> {thresholds.restarts_per_hour}",
            for_minutes=0,
            severity="warning",
            summary="Training Job restarting often",
            description="{{ $labels.namespace }}/{{ $labels.owner_name }} restarted {{ $value }} times in the last "
                        "hour (pods failed / gang size). Disruptions do not spend backoffLimit, so it keeps "
                        "restarting: `python -m workloads.submit status` shows what failed; look for a flapping "
                        "node, Spot reclaims, or a crash every run.",
        ),
    ]


def rule_groups(thresholds: AlertThresholds, training_namespace: str,
                label_prefix: str = "ml-cluster.io", team_namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The `groups:` of a Prometheus rule file (also PrometheusRule.spec.groups)."""
    return [{"name": RULE_GROUP, "rules": [rule.to_rule() for rule in alert_rules(thresholds, training_namespace,
                                                                                  team_namespaces)]},
            {"name": GPU_HEALTH_GROUP,
             "rules": [rule.to_rule() for rule in gpu_health_rules(thresholds, label_prefix)]}]
