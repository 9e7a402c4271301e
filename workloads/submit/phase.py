"""The phase of a training run, derived from its Job, its Pods and their (init) container states, and on a stack with
Kueue from the Job's Workload (conditions, requeue state) and its position in the queue: pure functions over API
objects in their JSON shape (camelCase keys), tested without a cluster."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from workloads.incidents import Incident, TrainerRun, incidents
from workloads.jobspec import CONFIG_ERROR_EXIT_CODE, DISRUPTION_EXIT_CODE, KUEUE_QUEUE_LABEL, TRAIN_CONTAINER
from workloads.submit.capacity import waiting_for_capacity

Phase = Literal["Suspended", "Pending", "Staging", "Running", "Succeeded", "Failed"]
# Waiting reasons that will not resolve by waiting: the run is reported Failed although the Job is not yet.
_STUCK_WAITING = {
    "ErrImagePull": "ImagePullBackOff",
    "ImagePullBackOff": "ImagePullBackOff",
    "InvalidImageName": "InvalidImageName",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerError",
}
# Why Kueue has not reserved quota (QuotaReserved=False reasons, apis/kueue/v1beta2/workload_types.go:945-977).
_QUOTA_REASONS = {
    "WaitingForQuota": "waiting for quota",
    "NoMatchingFlavor": "no flavor fits (GPU type, taints, node labels)",
    "ExceedsMaxQuota": "larger than the queue can ever hold",
    "WaitingForPreemptedWorkloads": "waiting for preempted workloads to stop",
    "WaitingForPodsReady": "waiting for an admitted gang to start first",
    "Misconfigured": "queue misconfigured",
    "Suspended": "queue stopped",
}
_GENERIC_JOB_FAILURES = {
    "BackoffLimitExceeded", "PodFailurePolicy", "FailedIndexes", "MaxFailedIndexesExceeded"}


@dataclass(frozen=True)
class RunPhase:
    phase: Phase
    reason: str | None = None  # for Failed: OOMKilled, Evicted, ImagePullBackOff, DeadlineExceeded, ...
    detail: str = ""
    restarts: int = 0  # failed pods the Job replaced (a gang restart replaces every pod of the gang)
    disruptions: int = 0  # of which were disruptions (stopped by SIGTERM, a lost peer or node): not counted
    incidents: tuple[Incident, ...] = ()  # the restarts grouped by incident (workloads.incidents), oldest first
    goodput: str = ""  # measured so far beside predicted (workloads.goodput_status)


def pod_restarts(pods: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(failed pods, of which disruptions): a pod that failed with the disruption exit code or with the
    DisruptionTarget condition does not spend backoffLimit (the rendered podFailurePolicy); the others do."""
    failed = disruptions = 0
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Failed":
            continue
        failed += 1
        targeted = any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
                       for c in status.get("conditions") or [])
        codes = [((c.get("state") or {}).get("terminated") or {}).get("exitCode")
                 for c in status.get("containerStatuses") or [] if c.get("name") == TRAIN_CONTAINER]
        if targeted or DISRUPTION_EXIT_CODE in codes:
            disruptions += 1
    return failed, disruptions


def _condition(job: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


def created(pod: dict[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("creationTimestamp") or "")


def _pod_failure(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, detail) of why a pod failed or cannot start; None while it is healthy."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name", "pod")
    if status.get("reason") == "Evicted":  # e.g. ephemeral-storage over its limit: the kubelet evicts the pod
        return "Evicted", f"{name}: {status.get('message', 'evicted')}"
    statuses = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    for container in statuses:
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in _STUCK_WAITING:
            where = f"{name}/{container.get('name')}"
            return _STUCK_WAITING[waiting["reason"]], f"{where}: {waiting.get('message', waiting['reason'])}"
        terminated = state.get("terminated") or (container.get("lastState") or {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return "OOMKilled", f"{name}/{container.get('name')}: exceeded its memory limit " \
                                "(memory-backed /dev/shm and RAM disk count against it)"
        exit_code = terminated.get("exitCode")
        if container.get("name") == TRAIN_CONTAINER and exit_code == CONFIG_ERROR_EXIT_CODE:
            return "ConfigError", f"{name}/{TRAIN_CONTAINER}: exited {exit_code} (configuration error)"
        if status.get("phase") == "Failed" and exit_code not in (None, 0):
            why = terminated.get("reason", "Error")
            return "Error", f"{name}/{container.get('name')}: exited {exit_code} ({why})"
    if status.get("phase") == "Failed":
        return status.get("reason") or "Failed", f"{name}: {status.get('message', 'failed')}"
    return None


def _is_staging(pod: dict[str, Any]) -> bool:
    """A classic (run-to-completion) initContainer is running: the stager is copying the dataset."""
    init_specs = {c.get("name"): c for c in ((pod.get("spec") or {}).get("initContainers") or [])}
    for container in (pod.get("status") or {}).get("initContainerStatuses") or []:
        is_sidecar = (init_specs.get(container.get("name")) or {}).get("restartPolicy") == "Always"
        if not is_sidecar and "running" in (container.get("state") or {}):
            return True
    return False


def _workload_condition(workload: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def _is_true(condition: dict[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def queue_position(pending: dict[str, Any] | None, workload: str) -> tuple[int, int] | None:
    """(position in the LocalQueue, in the ClusterQueue), both from 0, from Kueue's visibility API answer
    (PendingWorkloadsSummary, apis/visibility/v1beta2/types.go:76-79); None when the workload is not listed."""
    for item in (pending or {}).get("items") or []:
        if (item.get("metadata") or {}).get("name") == workload:
            return int(item.get("positionInLocalQueue", 0)), int(item.get("positionInClusterQueue", 0))
    return None


def queued_phase(job: dict[str, Any], workload: dict[str, Any] | None,
                 position: tuple[int, int] | None = None) -> RunPhase:
    """Why a Job in a Kueue queue is still suspended, from its Workload (None: Kueue has not made one yet)."""
    queue = ((job.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL, "?")
    where = f"queue {queue}"
    if position is not None:
        where += f", position {position[0] + 1} (ClusterQueue: {position[1] + 1})"
    if workload is None:
        return RunPhase("Pending", "Queued", f"{where}: waiting for Kueue to create its Workload")
    status = workload.get("status") or {}
    cluster_queue = (status.get("admission") or {}).get("clusterQueue")
    if cluster_queue:
        where += f" -> ClusterQueue {cluster_queue}"
    evicted = _workload_condition(workload, "Evicted")
    requeue_at = (status.get("requeueState") or {}).get("requeueAt")
    if _is_true(_workload_condition(workload, "Admitted")):
        return RunPhase("Pending", "Admitted", f"{where}: admitted, Kueue is starting the gang")
    if _is_true(evicted) or (evicted is not None and requeue_at):
        assert evicted is not None
        why = {"PodsReadyTimeout": "its gang did not get every pod ready in time (waitForPodsReady)",
               "Preempted": "preempted by a higher-priority or reclaiming workload"}.get(
            str(evicted.get("reason")), str(evicted.get("reason") or "evicted"))
        retry = f"; requeued, retried after {requeue_at}" if requeue_at else "; requeued"
        count = (status.get("requeueState") or {}).get("count")
        retry += f" (eviction {count})" if count else ""
        detail = f"{where}: evicted: {why}{retry}: {evicted.get('message', '')}"
        return RunPhase("Pending", "Evicted", detail.rstrip(": "))
    reserved = _workload_condition(workload, "QuotaReserved")
    if _is_true(reserved):
        return RunPhase("Pending", "QuotaReserved", f"{where}: quota reserved, waiting for admission checks")
    if reserved is not None:
        reason = str(reserved.get("reason") or "Pending")
        message = str(reserved.get("message") or "")
        if reason not in _QUOTA_REASONS and "insufficient" in message:
            reason = "WaitingForQuota"
        why = _QUOTA_REASONS.get(reason, reason)
        return RunPhase("Pending", reason if reason in _QUOTA_REASONS else "Queued",
                        f"{where}: {why}: {message}".rstrip(": "))
    return RunPhase("Pending", "Queued", f"{where}: waiting for Kueue to consider it")


def job_phase(job: dict[str, Any], pods: Sequence[dict[str, Any]], workload: dict[str, Any] | None = None,
              position: tuple[int, int] | None = None, runs: Sequence[TrainerRun] = (),
              now: float | None = None, gang_timeout_s: int | None = None) -> RunPhase:
    """The phase of a training run from its Job and Pods (API JSON shapes), with its Kueue Workload and queue
    position when it is in a queue, and the pods it has replaced so far, by incident (with the trainer runs read
    from the pods' logs: the steps lost and the time to resume). `now` and `gang_timeout_s` (Kueue's
    waitForPodsReady.timeout) count down an admitted gang that waits for nodes."""
    phase = _job_phase(job, pods, workload, position)
    if phase.reason == "WaitingForGang":
        gang = int((job.get("spec") or {}).get("parallelism") or 1)
        active = [pod for pod in pods if (pod.get("status") or {}).get("phase") in ("Pending", "Running")]
        capacity = waiting_for_capacity(active, gang, workload, now, gang_timeout_s)
        if capacity is not None:
            phase = RunPhase("Pending", "WaitingForCapacity", f"admitted by Kueue; {capacity}")
    restarts, disruptions = pod_restarts(pods)
    if not restarts:
        return phase
    return replace(phase, restarts=restarts, disruptions=disruptions, incidents=tuple(incidents(pods, runs)))


def _job_phase(job: dict[str, Any], pods: Sequence[dict[str, Any]], workload: dict[str, Any] | None,
               position: tuple[int, int] | None) -> RunPhase:
    newest_first = sorted(pods, key=created, reverse=True)
    failures = [failure for pod in newest_first if (failure := _pod_failure(pod))]
    failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
    if failed:
        reason = failed.get("reason") or "Failed"
        detail = failed.get("message", "")
        specific = [failure for failure in failures if failure[0] != "Error"]
        if reason in _GENERIC_JOB_FAILURES and specific:  # the pod says more than "backoff limit exceeded"
            reason, pod_detail = specific[0]
            detail = pod_detail + (f"; job: {detail}" if detail else "")
        elif failures:
            detail = f"{detail}; last pod: {failures[0][1]}"
        return RunPhase("Failed", reason, detail)
    if _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet"):
        succeeded = (job.get("status") or {}).get("succeeded", 0)
        return RunPhase("Succeeded", None, f"{succeeded} pod(s) succeeded")
    active = [pod for pod in newest_first if (pod.get("status") or {}).get("phase") in ("Pending", "Running")]
    for pod in active:
        failure = _pod_failure(pod)
        if failure and failure[0] in _STUCK_WAITING.values():
            return RunPhase("Failed", failure[0], failure[1])
    retry_note = f" (retrying after {failures[0][0]}: {failures[0][1]})" if failures else ""
    if (job.get("spec") or {}).get("suspend"):
        if KUEUE_QUEUE_LABEL in ((job.get("metadata") or {}).get("labels") or {}):
            queued = queued_phase(job, workload, position)
            return RunPhase(queued.phase, queued.reason, "suspended by Kueue: " + queued.detail + retry_note)
        name = (job.get("metadata") or {}).get("name", "NAME")
        return RunPhase("Suspended", None,
                        f"start it once its data is in place: python -m workloads.submit start {name}")
    if not active:
        return RunPhase("Pending", None, "no pod yet" + retry_note)
    if any(_is_staging(pod) for pod in active):
        return RunPhase("Staging", None, "initContainer is staging the dataset onto local NVMe" + retry_note)
    gang = (job.get("spec") or {}).get("parallelism") or 1
    pods_ready = _workload_condition(workload, "PodsReady") if workload is not None else None
    if any((pod.get("status") or {}).get("phase") == "Running" for pod in active):
        running = sum((pod.get("status") or {}).get("phase") == "Running" for pod in active)
        if pods_ready is not None and not _is_true(pods_ready) and running < gang:
            return RunPhase("Pending", "WaitingForGang",
                            f"admitted by Kueue; {running} of {gang} pods running, waiting for the whole gang "
                            "(evicted and requeued if it does not start in time)" + retry_note)
        return RunPhase("Running", None, f"{running} pod(s) running" + retry_note)
    pod_status = active[0].get("status") or {}
    unscheduled = next((c for c in pod_status.get("conditions") or []
                        if c.get("type") == "PodScheduled" and c.get("status") == "False"), None)
    detail = unscheduled.get("message", "unschedulable") if unscheduled else "pod pending"
    return RunPhase("Pending", None, detail + retry_note)


def slices_done(job: dict[str, Any]) -> str | None:
    """`3/4 slices done (failed: 2)` for a pack's Indexed Job (component pack), from its status; None otherwise."""
    metadata, spec = job.get("metadata") or {}, job.get("spec") or {}
    if (metadata.get("labels") or {}).get("app.kubernetes.io/component") != "pack" \
            or spec.get("completionMode") != "Indexed":
        return None
    status = job.get("status") or {}
    line = f"{int(status.get('succeeded') or 0)}/{int(spec.get('completions') or 0)} slices done"
    failed = status.get("failedIndexes")
    return f"{line} (failed: {failed})" if failed else line


def held_queue(job: dict[str, Any]) -> str | None:
    """The Kueue LocalQueue a held Job joins on `start` (the renderer's `<label prefix>/queue-name` annotation; the
    prefix is the stack's, so only the name part is matched)."""
    for key, value in ((job.get("metadata") or {}).get("annotations") or {}).items():
        if key.endswith("/queue-name") and key != KUEUE_QUEUE_LABEL:
            return str(value)
    return None
