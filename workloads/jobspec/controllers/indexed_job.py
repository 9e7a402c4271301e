"""batch/v1 Indexed Job: no controller to install. One pod per node (completions = parallelism = nodes), a
headless Service for the pods' hostnames, the gang's NetworkPolicy, and the restart rules as a podFailurePolicy:
a config error fails the Job, a disruption (exit code or DisruptionTarget) is retried without spending
backoffLimit, any other failure spends one."""

from __future__ import annotations

from typing import Any

from workloads.jobspec.containers import GangAddress
from workloads.jobspec.fields import CONFIG_ERROR_EXIT_CODE, DISRUPTION_EXIT_CODE, RENDEZVOUS_PORT, TRAIN_CONTAINER
from workloads.jobspec.network import job_network_policy
from workloads.jobspec.pod import Manifest, PodTemplate
from workloads.jobspec.queue import queued_metadata
from workloads.jobspec.spec import TrainingJobSpec

API_VERSION, KIND, PLURAL = "batch/v1", "Job", "jobs"
# The Job controller's pod label and annotation (kubernetes pkg/apis/batch/types.go: JobNameLabel,
# JobCompletionIndexAnnotation).
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


# A pod the cluster stopped (Spot reclaim, preemption, node drain: the DisruptionTarget condition): retried, not
# counted. Every batch Job of the project (training, pack) has this rule.
def ignore_disruption_target() -> dict[str, Any]:
    return {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


def gang_address(run_name: str, namespace: str) -> GangAddress:
    """An Indexed Job's pod I is `<job>-I` under the subdomain `<job>` (the headless Service); its index is in an
    annotation."""
    return GangAddress(master=f"{run_name}-0.{run_name}.{namespace}.svc",
                       node_rank_field=f"metadata.annotations['{COMPLETION_INDEX}']", subdomain=run_name)


def pod_selector(run_name: str) -> str:
    """The label selector of a run's pods."""
    return f"{JOB_NAME_LABEL}={run_name}"


def _on_exit(action: str, operator: str, code: int) -> dict[str, Any]:
    return {"action": action,
            "onExitCodes": {"containerName": TRAIN_CONTAINER, "operator": operator, "values": [code]}}


def pod_failure_policy() -> dict[str, Any]:
    """First match wins. A pod's failure that matches no rule counts too."""
    return {"rules": [
        _on_exit("FailJob", "In", CONFIG_ERROR_EXIT_CODE),
        # Stopped by SIGTERM after a last checkpoint, or a peer of the gang lost: retry, not counted.
        _on_exit("Ignore", "In", DISRUPTION_EXIT_CODE),
        # Spot reclaim, preemption, node drain: retry without spending backoffLimit.
        ignore_disruption_target(),
        # Any other failure of the trainer (a crash, the OOM killer) spends one of backoffLimit.
        _on_exit("Count", "NotIn", 0),
    ]}


def _job_spec(spec: TrainingJobSpec, template: Manifest, suspend: bool) -> Manifest:
    job_spec: Manifest = {
        "suspend": suspend,
        "backoffLimit": spec.backoff_limit,
        "activeDeadlineSeconds": spec.active_deadline_seconds,
        "podFailurePolicy": pod_failure_policy(),
        # A replacement pod starts only once the old one has stopped (its last checkpoint written, its rendezvous
        # port free); the only value the API allows with a podFailurePolicy.
        "podReplacementPolicy": "Failed",
        "template": template,
    }
    if spec.ttl_seconds_after_finished is not None:
        job_spec["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.nodes > 1:
        job_spec.update({"completionMode": "Indexed", "completions": spec.nodes, "parallelism": spec.nodes})
    if spec.is_elastic():
        # An elastic gang that finished on fewer nodes leaves an index that never ran (its pod Pending for capacity)
        # or never can (the rendezvous is closed): the Job succeeds when index 0, a member of every formation,
        # succeeds, and the controller removes the lingering pods (batch/v1 successPolicy, GA in Kubernetes 1.33).
        job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0", "succeededCount": 1}]}
    return job_spec


def headless_service(pod: PodTemplate) -> Manifest:
    """The pods' hostnames (`<job>-I.<job>`): peers resolve each other while starting up, before any readiness."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": pod.name, "namespace": pod.facts.namespace, "labels": dict(pod.labels)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {"app.kubernetes.io/instance": pod.name},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT,
                       "protocol": "TCP"}],
        },
    }


def wrap(pod: PodTemplate) -> list[Manifest]:
    """The Job (first) and, for a multi-node gang, its headless Service and NetworkPolicy."""
    spec, facts = pod.spec, pod.facts
    labels, annotations, suspend = queued_metadata(spec, facts, pod.labels)
    job = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": pod.name, "namespace": facts.namespace, "labels": labels, "annotations": annotations},
        "spec": _job_spec(spec, pod.template, suspend),
    }
    manifests = [job]
    if spec.nodes > 1:
        manifests.append(headless_service(pod))
        policy = job_network_policy(spec, facts, pod.name, pod.labels)
        if policy is not None:
            manifests.append(policy)
    return manifests
