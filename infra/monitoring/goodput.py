"""Measured goodput: where every GPU of a training Job is, at each rule evaluation, as recording rules.

Each evaluation puts every GPU a Job's live pods request (Pending or Running) in exactly one bucket:

    capacity    the pod is Pending and not scheduled: waiting for a node (queue admission holds no GPU: a Job
                Kueue keeps suspended has no pods)
    startup     scheduled, its trainer has not stepped yet, and the Job never trained: image pull, init and staging
                containers, rendezvous, data preparation, model load
    restart     the same after the Job has trained (its high-water step is above 0): the restart after a failure,
                checkpoint load included
    recompute   the pod steps, but below the Job's high-water step: the work lost with the last failure, done again
    checkpoint  the share of a stepping pod's time its Job was blocked saving a checkpoint (the slowest rank's: the
                gang waits for it)
    data_wait   the share its ranks waited for the next batch
    productive  the rest of a stepping pod's GPUs

so the buckets of one evaluation add up to the Job's live GPUs, and over a window the recorded series add up to
wall time x GPUs: GPU-seconds of a bucket = sum_over_time(series[W]) x GOODPUT_INTERVAL_S. Goodput = productive /
all buckets. The signals: kube-state-metrics (pod phase, PodScheduled, GPU requests, the pod's
app.kubernetes.io/instance label, allowlisted in infra/monitoring/component.py) and the trainer's own series
(workloads/train/metrics.py: steps, the global step, data-wait and checkpoint-stall seconds), joined on
(namespace, pod). Definitions and how to read them: docs/monitoring.md, "Measured goodput".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.monitoring.alerts import Namespaces, namespace_match

GOODPUT_GROUP = "ml-cluster-goodput"
GOODPUT_GPUS = "ml_cluster:goodput_gpus"  # {namespace, job_name, bucket}: GPUs in the bucket at the evaluation
TEAM_GOODPUT_GPUS = "ml_cluster:team_goodput_gpus"  # {namespace, bucket}: the same per namespace (a team's)
GOODPUT_INTERVAL_S = 60  # the group's evaluation interval: one recorded sample stands for this many seconds
BUCKETS = ("productive", "data_wait", "checkpoint", "recompute", "restart", "startup", "capacity")
BADPUT = BUCKETS[1:]
# How far back the Job's high-water step is looked for: a restart that takes longer than this before the
# replacement passes the old step counts its redone steps as productive.
HIGH_WATER_LOOKBACK = "6h"
INSTANCE_LABEL = "label_app_kubernetes_io_instance"  # kube_pod_labels' name for app.kubernetes.io/instance


def _window() -> str:
    return f"{GOODPUT_INTERVAL_S}s"


def _pod_gpus(ns: str) -> str:
    """GPUs each live (Pending or Running) pod requests, labelled with its Job (namespace, pod, job_name)."""
    job_of = (f'max by (namespace, pod, job_name) (label_replace(kube_pod_labels{{{ns}, {INSTANCE_LABEL}!=""}}, '
              f'"job_name", "$1", "{INSTANCE_LABEL}", "(.+)"))')
    gpus = f'sum by (namespace, pod) (kube_pod_container_resource_requests{{{ns}, resource="nvidia_com_gpu"}})'
    live = f'(max by (namespace, pod) (kube_pod_status_phase{{{ns}, phase=~"Pending|Running"}}) == 1)'
    return f"(({job_of}) * on (namespace, pod) group_left () {gpus} and on (namespace, pod) {live})"


def _stepping(ns: str) -> str:
    """Pods whose trainer processes have taken steps (a restarted process starts again from 0)."""
    return f"(max by (namespace, pod) (ml_train_steps_total{{{ns}}}) > 0)"


def _high_water(ns: str) -> str:
    return f"max by (namespace, job_name) (max_over_time(ml_train_global_step{{{ns}}}[{HIGH_WATER_LOOKBACK}]))"


def _behind(ns: str) -> str:
    """Pods stepping below their Job's high-water step: redoing what a failure lost."""
    return (f"(max by (namespace, pod, job_name) (ml_train_global_step{{{ns}}})"
            f" < on (namespace, job_name) group_left {_high_water(ns)})")


def _data_share(ns: str) -> str:
    """A stepping pod's share of time waiting for batches (seconds per second, averaged over its ranks), 0 when
    not known yet (a first scrape)."""
    rate = f"avg by (namespace, pod) (rate(ml_train_data_wait_seconds_sum{{{ns}}}[{_window()}]))"
    return f"(clamp(({rate}) or on (namespace, pod) (0 * {_stepping(ns)}), 0, 1))"


def _stall_share(ns: str, gpus: str) -> str:
    """A Job's share of time blocked in checkpoint saves: its slowest rank's (the gang waits for it at the next
    collective; whole checkpoints are written by rank 0 alone), 0 when not known yet."""
    rate = f"max by (namespace, job_name) (rate(ml_train_checkpoint_stall_seconds_total{{{ns}}}[{_window()}]))"
    return f"(clamp(({rate}) or on (namespace, job_name) (0 * max by (namespace, job_name) ({gpus})), 0, 1))"


def bucket_exprs(namespaces: Namespaces) -> dict[str, str]:
    """Per bucket, the PromQL of the GPUs of each Job (namespace, job_name) in it."""
    ns = namespace_match(namespaces)
    pods, stepping = _pod_gpus(ns), _stepping(ns)
    waiting = f"({pods} unless on (namespace, pod) {stepping})"
    unscheduled = (f'(max by (namespace, pod) (kube_pod_status_phase{{{ns}, phase="Pending"}}) == 1'
                   f' and on (namespace, pod) max by (namespace, pod) '
                   f'(kube_pod_status_scheduled{{{ns}, condition="false"}}) == 1)')
    starting = f"({waiting} unless on (namespace, pod) {unscheduled})"
    trained = f"({_high_water(ns)} > 0)"
    fresh = f"({pods} and on (namespace, pod) {stepping} unless on (namespace, pod) {_behind(ns)})"
    # a fresh pod's GPUs: first its data wait, then its Job's checkpoint stall (at most what is left), the rest
    # productive, so the three add up to the pod's GPUs
    data = f"({fresh} * on (namespace, pod) group_left () {_data_share(ns)})"
    left = f"({fresh} - {data})"
    stall = f"({fresh} * on (namespace, job_name) group_left () {_stall_share(ns, fresh)})"
    checkpoint = f"(({stall} <= {left}) or {left})"

    def by_job(expr: str) -> str:
        return f"sum by (namespace, job_name) ({expr})"

    return {
        "productive": by_job(f"{left} - {checkpoint}"),
        "data_wait": by_job(data),
        "checkpoint": by_job(checkpoint),
        "recompute": by_job(f"{pods} and on (namespace, pod) {stepping} and on (namespace, pod) {_behind(ns)}"),
        "restart": by_job(f"{starting} and on (namespace, job_name) {trained}"),
        "startup": by_job(f"{starting} unless on (namespace, job_name) {trained}"),
        "capacity": by_job(f"{waiting} and on (namespace, pod) {unscheduled}"),
    }


def goodput_rules(namespaces: Namespaces) -> list[dict[str, Any]]:
    """The recording rules: one series per Job and bucket, then per namespace (a team's) and bucket."""
    rules: list[dict[str, Any]] = [{"record": GOODPUT_GPUS, "expr": expr, "labels": {"bucket": bucket}}
                                   for bucket, expr in bucket_exprs(namespaces).items()]
    rules.append({"record": TEAM_GOODPUT_GPUS, "expr": f"sum by (namespace, bucket) ({GOODPUT_GPUS})"})
    return rules


def goodput_rule_groups(training_namespace: str, team_namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
    return [{"name": GOODPUT_GROUP, "interval": f"{GOODPUT_INTERVAL_S}s",
             "rules": goodput_rules((training_namespace, *team_namespaces))}]


def gpu_seconds(window: str, selector: str = "", by: str = "namespace, job_name, bucket",
                series: str = GOODPUT_GPUS) -> str:
    """GPU-seconds per bucket over `window` (each recorded sample stands for one evaluation interval)."""
    match = f"{{{selector}}}" if selector else ""
    return f"sum by ({by}) (sum_over_time({series}{match}[{window}])) * {GOODPUT_INTERVAL_S}"


def goodput_ratio(window: str, selector: str = "", by: str = "namespace, job_name",
                  series: str = GOODPUT_GPUS) -> str:
    """Productive GPU-seconds over all of them, per `by`, over `window`."""
    productive = f'bucket="productive"{", " + selector if selector else ""}'
    return f"({gpu_seconds(window, productive, by, series)}) / ({gpu_seconds(window, selector, by, series)})"
