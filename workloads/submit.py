"""Training runs on a provisioned cluster, outside `pulumi up`: render, submit, start, status, watch, logs, delete.

    python -m workloads.submit --stack dev render workloads/jobs/resnet50-s3-copy.yaml
    python -m workloads.submit --stack dev submit workloads/jobs/resnet50-s3-copy.yaml
    python -m workloads.submit --stack dev status resnet50-s3-copy-1a2b3c4d
    python -m workloads.submit --stack dev watch resnet50-s3-copy-1a2b3c4d [--interval 10]  # a line per poll
    python -m workloads.submit --stack dev start resnet50-s3-copy-1a2b3c4d      # a Job the stack created suspended
    python -m workloads.submit --stack dev logs resnet50-s3-copy-1a2b3c4d [--container stage] [--index 1] [--follow]
    python -m workloads.submit --stack dev delete resnet50-s3-copy-1a2b3c4d
    python -m workloads.submit --stack dev pack s3://raw/imagenet/train s3://datasets/imagenet-256 --slices 16 \
        --image-tag 0.1.0 [--render]                  # an Indexed Job of 16 slices + the publish Job

`--stack S` talks to the kubeconfig `make kubeconfig STACK=S` wrote (~/.kube/ml-S; see workloads.kubeconfig for
the order with --kubeconfig and KUBECONFIG) and reads the cluster's ClusterFacts from the stack output jobFacts;
`--facts FILE` gives them as JSON instead (`pulumi stack output jobFacts --json --stack S > facts.json`).
A spec with `team:` renders in that team's namespace, through its LocalQueue (the facts' `teams`); the other
commands take the namespace with `-n` (`-n team-vision status <job>`).
The phase of a run is derived by `job_phase` from the Job, its Pods and their (init) container states, and on a
stack with Kueue from the Job's Workload (conditions, requeue state) and its position in the queue; it is a pure
function over API objects in their JSON shape (camelCase keys), tested without a cluster.
Progress (epoch, samples/s, data-wait share, ETA, staging) comes from the pods' metrics endpoints, read through
the API server's pod proxy (no port-forward, nothing exposed), and is computed by workloads.progress.

With Kueue, `submit` creates Jobs suspended with the queue label: Kueue unsuspends a Job once its whole gang fits
the quota. The stack creates its Jobs held: suspended, the queue recorded in an annotation but no label, so Kueue
leaves them alone until `start` puts them in their queue (on a stack without Kueue, `start` unsuspends them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import yaml

from workloads.cli import ArgumentParser
from workloads.cluster_facts import ClusterFacts, facts_from_dict
from workloads.data.statefile import StateFileError, read_regular
from workloads.incidents import Incident, TrainerRun, incident_line, incidents, trainer_run
from workloads.jobspec import (
    CONFIG_ERROR_EXIT_CODE,
    DISRUPTION_EXIT_CODE,
    KUEUE_QUEUE_LABEL,
    TRAIN_CONTAINER,
    JobSpecError,
    load_job_file,
    render_job,
)
from workloads.kubeconfig import KubeconfigError, check_stack_name, load_kubernetes_config, resolve_kubeconfig
from workloads.progress import MetricsParseError, Progress, Snapshot, parse_metrics, progress, progress_line, snapshot

Phase = Literal["Suspended", "Pending", "Staging", "Running", "Succeeded", "Failed"]
# Waiting reasons that will not resolve by waiting: the run is reported Failed although the Job is not yet.
_STUCK_WAITING = {
    "ErrImagePull": "ImagePullBackOff",
    "ImagePullBackOff": "ImagePullBackOff",
    "InvalidImageName": "InvalidImageName",
    "CreateContainerConfigError": "CreateContainerConfigError",
    "CreateContainerError": "CreateContainerError",
}
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
# Kueue labels each Workload with the UID of the Job it stands for (pkg/controller/constants/constants.go:43 at
# v0.19.2); the Workload's name is derived from the Job's and is not guessed here.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
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
# The trainer's events in a pod's log tail that `status` reads for a Job with restarts (workloads.incidents).
INCIDENT_LOG_LINES = 200
INCIDENT_LOG_BYTES = 256 * 1024
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


def _created(pod: dict[str, Any]) -> str:
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
              position: tuple[int, int] | None = None, runs: Sequence[TrainerRun] = ()) -> RunPhase:
    """The phase of a training run from its Job and Pods (API JSON shapes), with its Kueue Workload and queue
    position when it is in a queue, and the pods it has replaced so far, by incident (with the trainer runs read
    from the pods' logs: the steps lost and the time to resume)."""
    phase = _job_phase(job, pods, workload, position)
    restarts, disruptions = pod_restarts(pods)
    if not restarts:
        return phase
    return replace(phase, restarts=restarts, disruptions=disruptions, incidents=tuple(incidents(pods, runs)))


def _job_phase(job: dict[str, Any], pods: Sequence[dict[str, Any]], workload: dict[str, Any] | None,
               position: tuple[int, int] | None) -> RunPhase:
    newest_first = sorted(pods, key=_created, reverse=True)
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


# ----------------------------------------------------------------------------------------------------
# CLI


class UsageError(Exception):
    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")


class RuntimeFailure(Exception):
    """A failure that says nothing about the input (an API server that does not answer in time, a run still going
    at the watch's deadline): exit 1, not the usage code 2."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")


DEFAULT_REQUEST_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
FOLLOW_READ_TIMEOUT_S = 300.0  # logs --follow: a stream silent for this long (or --request-timeout, if longer) ends
DEFAULT_WATCH_TIMEOUT_S = 7 * 24 * 3600.0
PULUMI_TIMEOUT_S = 120.0


def _is_timeout(exc: BaseException) -> bool:
    from urllib3.exceptions import MaxRetryError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    if isinstance(exc, MaxRetryError):
        return isinstance(exc.reason, Urllib3Timeout | TimeoutError)
    return isinstance(exc, Urllib3Timeout | TimeoutError)


class TimedApi:
    """A kubernetes client API object whose every call carries `_request_timeout` (connect, read), so an API server
    that accepts the connection and never answers cannot hold a command forever; a call that runs out of time is a
    RuntimeFailure naming the API server and the call."""

    def __init__(self, api: Any, server: str, timeout_s: float) -> None:
        self._api = api
        self._server = server
        self._timeout = (min(CONNECT_TIMEOUT_S, timeout_s), timeout_s)

    @property
    def api_client(self) -> Any:
        return self._api.api_client

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._api, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("_request_timeout", self._timeout)
            try:
                return target(*args, **kwargs)
            except Exception as exc:
                if _is_timeout(exc):
                    raise RuntimeFailure(f"kubernetes API {self._server}",
                                         f"{name}: no answer within {kwargs['_request_timeout'][1]:g}s "
                                         "(--request-timeout)") from None
                raise

        return call


MAX_NESTING = 64  # a job spec or facts file nests a handful of levels; deeper is hostile or broken input


MAX_INPUT_BYTES = 16 << 20  # a job spec or facts file is kilobytes; a FIFO or /dev/zero must not hang or fill memory


def _read_text(path: str) -> str:
    """The file as UTF-8 text, or a UsageError (missing, not a regular file, too large, binary, NUL bytes).
    A link the user names is followed; a FIFO or a device is refused without blocking."""
    try:
        raw, _ = read_regular(path, MAX_INPUT_BYTES, follow=True)
    except StateFileError as exc:
        raise UsageError(path, exc.why) from None
    if raw is None:
        raise UsageError(path, "cannot read: No such file or directory")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(path, f"not UTF-8 text (byte {exc.start}): is this a binary file?") from None
    if "\x00" in text:
        raise UsageError(path, "contains NUL bytes: is this a binary file?")
    return text


def _check_yaml_nesting(path: str) -> None:
    """Refuse binary or absurdly nested YAML before the recursive loader sees it (one-line error, no traceback).

    yaml.parse is an iterative event stream, so measuring depth cannot itself overflow the stack."""
    text = _read_text(path)
    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    raise UsageError(path, f"nested deeper than {MAX_NESTING} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as exc:
        raise UsageError(path, f"not valid YAML: {exc}".splitlines()[0]) from None


def _load_facts(path: str) -> ClusterFacts:
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(path, f"not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError(path, "nested too deeply to be cluster facts") from None
    if not isinstance(data, dict):
        raise UsageError(path, "expected a JSON object of cluster facts")
    try:
        return facts_from_dict(data)
    except ValueError as exc:
        raise UsageError(path, str(exc)) from None


def _stack_facts(stack: str) -> ClusterFacts:
    """The stack's ClusterFacts from its `jobFacts` output (the Pulumi CLI, logged in to the stack's backend)."""
    where = f"pulumi stack output jobFacts --stack {stack}"
    try:
        done = subprocess.run(["pulumi", "stack", "output", "jobFacts", "--json", "--stack", stack],
                              capture_output=True, text=True, check=False, timeout=PULUMI_TIMEOUT_S)
    except FileNotFoundError:
        raise UsageError("pulumi", "not installed: pass --facts FILE instead of reading the stack") from None
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(where, f"no answer within {PULUMI_TIMEOUT_S:g}s (is the state backend reachable?); "
                                    "or pass --facts FILE") from None
    if done.returncode != 0:
        raise UsageError(where, (done.stderr.strip().splitlines() or ["failed"])[-1])
    try:
        data = json.loads(done.stdout)
        return facts_from_dict(data)
    except (json.JSONDecodeError, ValueError, AttributeError) as exc:
        raise UsageError(where, f"not cluster facts ({exc}); run make up first") from None


def _render(job_file: str, facts_file: str | None, stack: str | None) -> list[dict[str, Any]]:
    if facts_file is None and stack is None:
        raise UsageError("arguments", "give --stack S (facts from the stack) or --facts FILE")
    facts = _load_facts(facts_file) if facts_file is not None else _stack_facts(str(stack))
    _check_yaml_nesting(job_file)
    specs = load_job_file(job_file)
    manifests: list[dict[str, Any]] = []
    for index, spec in enumerate(specs):
        try:
            manifests += render_job(spec, facts)
        except JobSpecError as exc:
            where = f"jobs[{index}].{exc.path}" if len(specs) > 1 else exc.path
            raise JobSpecError(f"{job_file}: {where}", exc.reason) from None
    return manifests


def _apis(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from kubernetes import client

    choice = resolve_kubeconfig(args.kubeconfig, args.stack, os.environ, Path.home())
    load_kubernetes_config(choice, args.context)
    from urllib3.util.retry import Retry

    configuration = client.Configuration.get_default_copy()
    # A read that timed out is not sent again: --request-timeout is the whole wait for an answer, not per attempt.
    configuration.retries = Retry(total=3, connect=3, read=0, status=0, other=0, redirect=3)
    client.Configuration.set_default(configuration)
    server = configuration.host
    timeout = args.request_timeout
    return (TimedApi(client.BatchV1Api(), server, timeout), TimedApi(client.CoreV1Api(), server, timeout),
            TimedApi(client.NetworkingV1Api(), server, timeout))


def _to_json(api_object: Any) -> dict[str, Any]:
    from kubernetes.client import ApiClient

    return ApiClient().sanitize_for_serialization(api_object)


def _submit(manifests: list[dict[str, Any]], batch: Any, core: Any, networking: Any) -> list[str]:
    from kubernetes.client.exceptions import ApiException

    creators = {"Job": batch.create_namespaced_job, "Service": core.create_namespaced_service,
                "NetworkPolicy": networking.create_namespaced_network_policy}
    lines = []
    for manifest in manifests:
        namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        create = creators[manifest["kind"]]
        try:
            create(namespace, manifest)
            lines.append(f"created {manifest['kind'].lower()}/{name} in {namespace}")
        except ApiException as exc:
            if exc.status != 409:
                raise UsageError(f"{manifest['kind'].lower()}/{name}", f"{exc.status} {exc.reason}") from None
            # Same hash, same content: the run already exists.
            lines.append(f"unchanged {manifest['kind'].lower()}/{name} (already exists)")
    return lines


def _pods(core: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    pods = core.list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={name}")
    return [_to_json(pod) for pod in pods.items]


def _read_job(batch: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        return _to_json(batch.read_namespaced_job(name, namespace))
    except ApiException as exc:
        why = "not found" if exc.status == 404 else f"{exc.status} {exc.reason}"
        raise UsageError(f"job/{name}", why) from None


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m workloads.submit", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", help="the stack: its kubeconfig (make kubeconfig STACK=S) and its jobFacts")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the stack's, else KUBECONFIG, else "
                                             "~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: current)")
    parser.add_argument("--namespace", "-n", default="training",
                        help="the run's namespace (a team's Jobs run in the team's namespace)")
    parser.add_argument("--request-timeout", type=_request_timeout, default=DEFAULT_REQUEST_TIMEOUT_S,
                        metavar="SECONDS", help="the longest wait for any answer of the API server (default "
                        f"{DEFAULT_REQUEST_TIMEOUT_S:g}; connecting: at most {CONNECT_TIMEOUT_S:g}); then exit 1")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("render", "submit"):
        sub = commands.add_parser(command, help=f"{command} the Jobs of a spec file")
        sub.add_argument("job_file", help="YAML spec file, e.g. workloads/jobs/resnet50-s3-copy.yaml")
        sub.add_argument("--facts", help="ClusterFacts JSON (pulumi stack output jobFacts --json); default: "
                                         "read from --stack")
    pack = commands.add_parser("pack", help="pack a dataset on the cluster: an Indexed Job of --slices slices (CPU "
                                            "pools, Kueue's cpu flavor) and its publish Job")
    pack.add_argument("source", help="s3://BUCKET/PREFIX of class folders, or s3://BUCKET/PATH/LIST.csv|.jsonl")
    pack.add_argument("dest", help="s3://BUCKET/PREFIX the dataset is packed into (manifest published last)")
    pack.add_argument("--slices", type=int, required=True, help="pods packing at once (completions = parallelism)")
    pack.add_argument("--name", default="dataset", help="the Jobs' name: pack-<name>-<hash>[-publish]")
    pack.add_argument("--image", help="container image (default: <the stack's repository>:--image-tag)")
    pack.add_argument("--image-tag", help="tag of the stack's own registry (jobFacts image_repository)")
    pack.add_argument("--layout", choices=["decoded", "encoded"], default="decoded")
    pack.add_argument("--size", type=int, default=256, help="decoded image side in pixels")
    pack.add_argument("--shard-size", default="1GiB")
    pack.add_argument("--cpu", type=int, default=4, help="CPUs per slice pod (its decoding processes)")
    pack.add_argument("--memory", default="8GiB", help="memory per slice pod")
    pack.add_argument("--queue", help="Kueue LocalQueue (default: the stack's)")
    pack.add_argument("--facts", help="ClusterFacts JSON; default: read from --stack")
    pack.add_argument("--render", action="store_true", help="print the manifests instead of creating them")
    start = commands.add_parser("start", help="start a suspended run (the stack creates its Jobs suspended)")
    start.add_argument("name")
    status = commands.add_parser("status", help="phase and progress of a submitted run")
    status.add_argument("name")
    status.add_argument("--json", action="store_true")
    watch = commands.add_parser("watch", help="status every --interval seconds until the run ends")
    watch.add_argument("name")
    watch.add_argument("--interval", type=_interval, default=10.0, metavar="SECONDS")
    watch.add_argument("--timeout", type=_watch_timeout, default=DEFAULT_WATCH_TIMEOUT_S, metavar="SECONDS",
                       help="give up (exit 1) when the run has not ended after this long (default: 7 days)")
    logs = commands.add_parser("logs", help="logs of a run's pod")
    logs.add_argument("name")
    logs.add_argument("--container", default=TRAIN_CONTAINER)
    logs.add_argument("--index", type=int, default=0, help="completion index (multi-node)")
    logs.add_argument("--follow", "-f", action="store_true")
    delete = commands.add_parser("delete", help="delete a run (its pods, Service and NetworkPolicy too)")
    delete.add_argument("name")
    return parser


def _kueue_state(namespace: str, job: dict[str, Any], timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 ) -> tuple[dict[str, Any] | None, tuple[int, int] | None]:
    """The Job's Workload and, while it is pending, its place in the queue (visibility API; None where the
    caller may not read it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    uid = (job.get("metadata") or {}).get("uid")
    if not uid:
        return None, None
    custom = TimedApi(client.CustomObjectsApi(), client.Configuration.get_default_copy().host, timeout_s)
    found = custom.list_namespaced_custom_object(
        KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", label_selector=f"{JOB_UID_LABEL}={uid}")
    items = (found.get("items") if isinstance(found, dict) else None) or []
    if not items:
        return None, None
    workload = max(items, key=_created)
    queue = ((job.get("metadata") or {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)
    try:
        pending = custom.api_client.call_api(
            "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/{name}/pendingworkloads",
            "GET", path_params={"namespace": namespace, "name": queue}, response_type="object",
            auth_settings=["BearerToken"], _return_http_data_only=True,
            _request_timeout=(min(CONNECT_TIMEOUT_S, timeout_s), timeout_s))
    except ApiException:  # no RBAC for the visibility API, or it is not served: the position is optional
        pending = None
    return workload, queue_position(pending, workload["metadata"]["name"])


def _seconds(text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not low <= value <= high:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be {low:g}-{high:g} seconds, got {text}")
    return value


def _request_timeout(text: str) -> float:
    return _seconds(text, 0.1, 3600)


def _watch_timeout(text: str) -> float:
    return _seconds(text, 1, 365 * 24 * 3600)


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be 1-3600 seconds, got {text}")
    return value


def metrics_endpoints(pod: dict[str, Any]) -> list[str]:
    """`<pod>:<port>` of every metrics port a pod declares (trainer ranks, stager), for the pod proxy."""
    spec = pod.get("spec") or {}
    name = (pod.get("metadata") or {}).get("name", "")
    return [f"{name}:{port['containerPort']}"
            for container in (spec.get("initContainers") or []) + (spec.get("containers") or [])
            for port in container.get("ports") or [] if str(port.get("name", "")).startswith("metrics-")]


MAX_METRICS_PAGE_BYTES = 4 << 20  # the trainer's and stager's pages are a few KiB; more is not theirs


def _metrics_page(core: Any, namespace: str, endpoint: str) -> str:
    """One endpoint's page through the pod proxy, read at most MAX_METRICS_PAGE_BYTES (the client would otherwise
    hold whatever the pod sends); MetricsParseError when it is larger."""
    response = core.connect_get_namespaced_pod_proxy_with_path(endpoint, namespace, "metrics",
                                                               _preload_content=False)
    try:
        data = response.read(MAX_METRICS_PAGE_BYTES + 1)
    finally:
        response.release_conn()
    if len(data) > MAX_METRICS_PAGE_BYTES:
        raise MetricsParseError(f"{endpoint}: page larger than {MAX_METRICS_PAGE_BYTES} bytes")
    return bytes(data).decode("utf-8", "replace")


def _metrics_pages(core: Any, namespace: str, pods: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The metrics of every live pod's endpoints; an endpoint that is not up (yet, or any more) is skipped."""
    from kubernetes.client.exceptions import ApiException

    pages = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") not in ("Pending", "Running"):
            continue
        for endpoint in metrics_endpoints(pod):
            try:
                pages.append(parse_metrics(_metrics_page(core, namespace, endpoint)))
            except (ApiException, MetricsParseError):
                continue
    return pages


def _trainer_runs(core: Any, namespace: str, pods: list[dict[str, Any]],
                  finished: dict[str, TrainerRun | None] | None = None) -> list[TrainerRun]:
    """The trainer run in each pod's log tail (the events carry where the run started and its first step); a log
    that cannot be read (the pod or its node gone) is skipped. `finished` keeps what was read from pods that have
    stopped (their logs no longer change) across the polls of `watch`."""
    from kubernetes.client.exceptions import ApiException

    runs = []
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        if phase not in ("Running", "Succeeded", "Failed"):
            continue
        name = (pod.get("metadata") or {}).get("name", "")
        if finished is not None and name in finished:
            known = finished[name]
            if known is not None:
                runs.append(known)
            continue
        try:
            log = core.read_namespaced_pod_log(name, namespace, container=TRAIN_CONTAINER,
                                               tail_lines=INCIDENT_LOG_LINES, limit_bytes=INCIDENT_LOG_BYTES)
        except ApiException:
            continue
        run = trainer_run(name, str(log))
        if finished is not None and phase != "Running":
            finished[name] = run
        if run is not None:
            runs.append(run)
    return runs


def _observe(batch: Any, core: Any, namespace: str, name: str, clock: Any,
             finished: dict[str, TrainerRun | None] | None = None) -> tuple[RunPhase, Snapshot]:
    job = _read_job(batch, namespace, name)
    workload, position = (None, None)
    if KUEUE_QUEUE_LABEL in ((job.get("metadata") or {}).get("labels") or {}):
        workload, position = _kueue_state(namespace, job, _timeout_of(batch))
    pods = _pods(core, namespace, name)
    restarted = pod_restarts(pods)[0] > 0  # logs are read only for a Job with incidents
    phase = job_phase(job, pods, workload, position,
                      _trainer_runs(core, namespace, pods, finished) if restarted else ())
    now = snapshot(_metrics_pages(core, namespace, pods), clock())
    slices = slices_done(job)
    return phase, replace(now, slices=slices) if slices is not None else now


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


def _timeout_of(api: Any) -> float:
    timeout = getattr(api, "_timeout", None)
    return float(timeout[1]) if isinstance(timeout, tuple) else DEFAULT_REQUEST_TIMEOUT_S


def _status_line(name: str, phase: RunPhase, figures: Progress | None) -> str:
    reason = f" ({phase.reason})" if phase.reason else ""
    line = progress_line(name, f"{phase.phase}{reason}", figures)
    if phase.restarts:
        counted = phase.restarts - phase.disruptions
        line += (f"  restarts: {phase.restarts} pod(s) replaced ({phase.disruptions} disruption(s), "
                 f"{counted} counted against backoffLimit)")
    return f"{line}  {phase.detail}" if phase.detail else line


def _incident_lines(phase: RunPhase, first: int = 0) -> list[str]:
    """`  incident N at ...` for each incident from the `first` (0-based) on."""
    return [f"  {incident_line(number, incident)}"
            for number, incident in enumerate(phase.incidents, start=1) if number > first]


def _is_pack(now: Snapshot) -> bool:
    return now.pack_images is not None or now.slices is not None


def _status(batch: Any, core: Any, namespace: str, name: str, as_json: bool, clock: Any = None) -> int:
    import time

    phase, now = _observe(batch, core, namespace, name, clock or time.time)
    figures = progress(now) if now.ranks or now.stage_shards is not None or _is_pack(now) else None
    if as_json:
        print(json.dumps({"name": name, **asdict(phase), "progress": asdict(figures) if figures else None}))
    else:
        print("\n".join([_status_line(name, phase, figures), *_incident_lines(phase)]))
    return 1 if phase.phase == "Failed" else 0


def _watch(batch: Any, core: Any, namespace: str, name: str, interval: float, clock: Any = None,
           sleep: Any = None, timeout: float = DEFAULT_WATCH_TIMEOUT_S) -> int:
    """A line per poll (each poll reads the Job again: it says what is waited for); rates over the last interval;
    returns when the run has succeeded or failed, and raises RuntimeFailure when it has not after `timeout`."""
    import time

    clock, sleep = clock or time.time, sleep or time.sleep
    started = time.monotonic()
    before: Snapshot | None = None
    settled = 0  # incidents already printed with their resume
    finished: dict[str, TrainerRun | None] = {}  # trainer runs of stopped pods, read once
    while True:
        phase, now = _observe(batch, core, namespace, name, clock, finished)
        figures = progress(now, before) if now.ranks or now.stage_shards is not None or _is_pack(now) else None
        print(_status_line(name, phase, figures), flush=True)
        # an incident is printed once it has resumed (or when it is the run's last), not on every poll
        done = phase.phase in ("Succeeded", "Failed")
        ready = [i for i, incident in enumerate(phase.incidents)
                 if incident.resumed_step is not None or done]
        upto = max(ready, default=-1) + 1
        if upto > settled:
            print("\n".join(_incident_lines(replace(phase, incidents=phase.incidents[:upto]), settled)), flush=True)
            settled = upto
        if phase.phase in ("Succeeded", "Failed"):
            return 1 if phase.phase == "Failed" else 0
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            raise RuntimeFailure(f"job/{name}", f"still {phase.phase} after {timeout:g}s (watch --timeout)")
        before = now if now.ranks or now.pack_images is not None else before
        sleep(min(interval, left))


def held_queue(job: dict[str, Any]) -> str | None:
    """The Kueue LocalQueue a held Job joins on `start` (the renderer's `<label prefix>/queue-name` annotation; the
    prefix is the stack's, so only the name part is matched)."""
    for key, value in ((job.get("metadata") or {}).get("annotations") or {}).items():
        if key.endswith("/queue-name") and key != KUEUE_QUEUE_LABEL:
            return str(value)
    return None


def _logs(batch: Any, core: Any, namespace: str, name: str, container: str, index: int, follow: bool) -> int:
    _read_job(batch, namespace, name)
    index_key = "batch.kubernetes.io/job-completion-index"
    pods = [pod for pod in _pods(core, namespace, name)
            if (pod["metadata"].get("annotations") or {}).get(index_key, "0") == str(index)]
    if not pods:
        raise UsageError(f"job/{name}", f"no pod with completion index {index}")
    pod_name = max(pods, key=_created)["metadata"]["name"]
    if follow:
        # A log stream may be silent for a while: its read timeout is longer than a request's, but it has one.
        read = max(FOLLOW_READ_TIMEOUT_S, _timeout_of(core))
        stream = core.read_namespaced_pod_log(pod_name, namespace, container=container, follow=True,
                                              _preload_content=False,
                                              _request_timeout=(min(CONNECT_TIMEOUT_S, read), read))
        for chunk in stream.stream():
            sys.stdout.write(chunk.decode(errors="replace"))
    else:
        sys.stdout.write(core.read_namespaced_pod_log(pod_name, namespace, container=container))
    return 0


def _start(batch: Any, namespace: str, name: str) -> int:
    """Release a held Job: into its Kueue queue when the stack runs Kueue (Kueue unsuspends it once the whole gang
    is admitted), else by unsuspending it."""
    job = _read_job(batch, namespace, name)
    if KUEUE_QUEUE_LABEL in (job["metadata"].get("labels") or {}):
        raise UsageError(f"job/{name}", "Kueue starts this Job when it admits it (queue "
                         f"{job['metadata']['labels'][KUEUE_QUEUE_LABEL]}); see `status`")
    if not (job.get("spec") or {}).get("suspend"):
        print(f"job/{name} is not suspended")
        return 0
    queue = held_queue(job)
    if queue is not None:
        # Kueue accepts a queue label on a suspended Job (pkg/controller/jobframework/validation.go:182).
        batch.patch_namespaced_job(name, namespace, {"metadata": {"labels": {KUEUE_QUEUE_LABEL: queue}}})
        print(f"queued job/{name} in {queue}: Kueue starts it when the whole gang fits the quota (see `status`)")
        return 0
    batch.patch_namespaced_job(name, namespace, {"spec": {"suspend": False}})
    print(f"started job/{name}")
    return 0


def _delete(batch: Any, core: Any, networking: Any, namespace: str, name: str) -> int:
    from kubernetes.client.exceptions import ApiException

    _read_job(batch, namespace, name)
    batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")
    # Multi-node runs only: the headless Service and the gang's NetworkPolicy share the Job's name.
    for delete_companion in (core.delete_namespaced_service, networking.delete_namespaced_network_policy):
        try:
            delete_companion(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
    print(f"deleted job/{name}")
    return 0


def _render_pack(args: argparse.Namespace) -> list[dict[str, Any]]:
    from workloads.jobspec.packjob import PackJobSpec, render_pack_job

    if args.facts is None and args.stack is None:
        raise UsageError("arguments", "give --stack S (facts from the stack) or --facts FILE")
    facts = _load_facts(args.facts) if args.facts is not None else _stack_facts(str(args.stack))
    image = args.image
    if image is None:
        if args.image_tag is None or facts.image_repository is None:
            raise UsageError("--image", "give --image, or --image-tag on a stack with its own registry")
        image = f"{facts.image_repository}:{args.image_tag}"
    spec = PackJobSpec(name=args.name, source=args.source, dest=args.dest, slices=args.slices, image=image,
                       layout=args.layout, image_size=args.size, shard_size=args.shard_size,
                       cpu_millicores=args.cpu * 1000, memory=args.memory, queue=args.queue)
    return render_pack_job(spec, facts)


def _run(args: argparse.Namespace) -> int:
    if args.command == "pack":
        manifests = _render_pack(args)
        if args.render:
            sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
            return 0
        batch, core, networking = _apis(args)
        print("\n".join(_submit(manifests, batch, core, networking)))
        print(f"watch: python -m workloads.submit -n {manifests[0]['metadata']['namespace']} watch "
              f"{manifests[0]['metadata']['name']}")
        return 0
    if args.command in ("render", "submit"):
        manifests = _render(args.job_file, args.facts, args.stack)
        if args.command == "render":
            sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
            return 0
        batch, core, networking = _apis(args)
        print("\n".join(_submit(manifests, batch, core, networking)))
        return 0
    batch, core, networking = _apis(args)
    if args.command == "status":
        return _status(batch, core, args.namespace, args.name, args.json)
    if args.command == "watch":
        try:
            return _watch(batch, core, args.namespace, args.name, args.interval, timeout=args.timeout)
        except KeyboardInterrupt:
            return 130
    if args.command == "start":
        return _start(batch, args.namespace, args.name)
    if args.command == "logs":
        return _logs(batch, core, args.namespace, args.name, args.container, args.index, args.follow)
    return _delete(batch, core, networking, args.namespace, args.name)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.stack is not None:  # it names files (~/.kube/ml-<stack>) and the Pulumi stack read for facts
            check_stack_name(args.stack)
        return _run(args)
    except (JobSpecError, UsageError, KubeconfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # API and connection errors: one line, no traceback
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        if isinstance(exc, ApiException):
            print(f"error: kubernetes API: {exc.status} {exc.reason}", file=sys.stderr)
            # Refused (401/403/404/409/422...): the input or the credentials; the server failing (5xx): runtime.
            return 1 if not exc.status or exc.status >= 500 or exc.status == 429 else 2
        if isinstance(exc, HTTPError):
            print(f"error: kubernetes API: unreachable ({type(exc).__name__})", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
