"""The commands that act on a run: start (release a held Job), logs, delete."""

from __future__ import annotations

import sys
from typing import Any

from workloads.jobspec import KUEUE_QUEUE_LABEL
from workloads.submit.errors import UsageError
from workloads.submit.kube import CONNECT_TIMEOUT_S, FOLLOW_READ_TIMEOUT_S, run_pods, timeout_of
from workloads.submit.phase import created, held_queue
from workloads.submit.runs import delete_object, patch_run, read_run, trainer_container


def show_logs(batch: Any, core: Any, namespace: str, name: str, container: str, index: int, follow: bool) -> int:
    controller, _ = read_run(batch, namespace, name)
    container = trainer_container(controller, container)
    index_key = "batch.kubernetes.io/job-completion-index"  # every kind's pods are Indexed Job pods
    pods = [pod for pod in run_pods(core, namespace, name, controller)
            if (pod["metadata"].get("annotations") or {}).get(index_key, "0") == str(index)]
    if not pods:
        raise UsageError(f"job/{name}", f"no pod with completion index {index}")
    pod_name = max(pods, key=created)["metadata"]["name"]
    if follow:
        # A log stream may be silent for a while: its read timeout is longer than a request's, but it has one.
        read = max(FOLLOW_READ_TIMEOUT_S, timeout_of(core))
        stream = core.read_namespaced_pod_log(pod_name, namespace, container=container, follow=True,
                                              _preload_content=False,
                                              _request_timeout=(min(CONNECT_TIMEOUT_S, read), read))
        for chunk in stream.stream():
            sys.stdout.write(chunk.decode(errors="replace"))
    else:
        sys.stdout.write(core.read_namespaced_pod_log(pod_name, namespace, container=container))
    return 0


def start_run(batch: Any, namespace: str, name: str) -> int:
    """Release a held Job: into its Kueue queue when the stack runs Kueue (Kueue unsuspends it once the whole gang
    is admitted), else by unsuspending it."""
    controller, job = read_run(batch, namespace, name)
    if KUEUE_QUEUE_LABEL in (job["metadata"].get("labels") or {}):
        raise UsageError(f"job/{name}", "Kueue starts this Job when it admits it (queue "
                         f"{job['metadata']['labels'][KUEUE_QUEUE_LABEL]}); see `status`")
    if not (job.get("spec") or {}).get("suspend"):
        print(f"job/{name} is not suspended")
        return 0
    queue = held_queue(job)
    if queue is not None:
        # Kueue accepts a queue label on a suspended Job (pkg/controller/jobframework/validation.go:182).
        patch_run(batch, controller, namespace, name, {"metadata": {"labels": {KUEUE_QUEUE_LABEL: queue}}})
        print(f"queued job/{name} in {queue}: Kueue starts it when the whole gang fits the quota (see `status`)")
        return 0
    patch_run(batch, controller, namespace, name, {"spec": {"suspend": False}})
    print(f"started job/{name}")
    return 0


def delete_run(batch: Any, core: Any, networking: Any, namespace: str, name: str) -> int:
    from kubernetes.client.exceptions import ApiException

    controller, _ = read_run(batch, namespace, name)
    delete_object(batch, controller, namespace, name)
    # Multi-node runs only: the headless Service and the gang's NetworkPolicy share the Job's name.
    for delete_companion in (core.delete_namespaced_service, networking.delete_namespaced_network_policy):
        try:
            delete_companion(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
    print(f"deleted {controller.kind.lower()}/{name}")
    return 0
