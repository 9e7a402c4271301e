"""A run of any kind of the kind table (an Indexed Job, a JobSet, a TrainJob), found by name and seen as the phase
logic reads a Job: `status`, `watch`, `start`, `logs` and `delete` work the same for all three.

- JobSet (jobset.x-k8s.io/v1alpha2, kubernetes-sigs/jobset v0.12.0): conditions Completed / Failed / Suspended
  (api/jobset/v1alpha2/jobset_types.go:105-112); `status.restarts` counts gang restarts.
- TrainJob (trainer.kubeflow.org/v1alpha1, kubeflow/trainer v2.3.0): conditions Complete / Failed / Suspended
  (pkg/apis/trainer/v1alpha1/trainjob_types.go:57-64); its pods are the pods of the JobSet Trainer names after it,
  their trainer container `node` (seen here as the project's trainer container, so exit codes and logs read the same).
"""

from __future__ import annotations

import copy
from typing import Any

from workloads.jobspec import DEFAULT_KIND, KINDS, TRAIN_CONTAINER, Controller
from workloads.jobspec.controllers import trainjob
from workloads.submit.errors import UsageError
from workloads.submit.kube import custom_objects_api, read_job, timeout_of

# The condition types of each kind's object that mean done or failed, as the batch/v1 Job's.
_AS_JOB_CONDITIONS = {"JobSet": {"Completed": "Complete", "Failed": "Failed"},
                      "TrainJob": {"Complete": "Complete", "Failed": "Failed"}}


def _custom(api: Any) -> Any:
    return custom_objects_api(timeout_of(api))


def read_run(batch: Any, namespace: str, name: str, custom: Any = None) -> tuple[Controller, dict[str, Any]]:
    """(its row of the kind table, the object) of the run `name`: a batch/v1 Job, else a custom kind of the table;
    UsageError when none of that name exists."""
    from kubernetes.client.exceptions import ApiException

    try:
        return KINDS[DEFAULT_KIND], read_job(batch, namespace, name)
    except UsageError as exc:
        if "not found" not in str(exc):
            raise
    api = custom or _custom(batch)
    for kind, controller in KINDS.items():
        if kind == DEFAULT_KIND:
            continue
        try:
            found = api.get_namespaced_custom_object(controller.group, controller.version, namespace,
                                                     controller.plural, name)
        except ApiException as exc:
            if exc.status == 404:  # not this kind (or its CRD is not installed)
                continue
            raise UsageError(f"{controller.kind.lower()}/{name}", f"{exc.status} {exc.reason}") from None
        return controller, dict(found)
    raise UsageError(f"run/{name}", f"not found in {namespace} (no {', '.join(KINDS)} of that name)")


def job_view(controller: Controller, run: dict[str, Any]) -> dict[str, Any]:
    """`run` in the shape the phase logic reads: the Job's own, or its conditions renamed as a Job's and its gang size
    as `parallelism`."""
    if controller.kind == DEFAULT_KIND:
        return run
    spec = run.get("spec") or {}
    names = _AS_JOB_CONDITIONS[controller.kind]
    conditions = [{**c, "type": names[c["type"]]} for c in (run.get("status") or {}).get("conditions") or []
                  if c.get("type") in names]
    if controller.kind == "JobSet":
        gang = sum(r.get("replicas", 1) * ((r.get("template") or {}).get("spec") or {}).get("parallelism", 1)
                   for r in spec.get("replicatedJobs") or [])
    else:
        gang = (spec.get("trainer") or {}).get("numNodes") or 1
    return {"apiVersion": run.get("apiVersion"), "kind": run.get("kind"), "metadata": run.get("metadata") or {},
            "spec": {"suspend": bool(spec.get("suspend")), "parallelism": gang},
            "status": {"conditions": conditions}}


def as_trainer_pods(controller: Controller, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A TrainJob's pods with their `node` container seen as the trainer container (its exit codes are the
    launcher's, as in a Job's pod)."""
    if controller.kind != trainjob.KIND:
        return pods
    seen = copy.deepcopy(pods)
    for pod in seen:
        for key in ("spec",):
            for container in (pod.get(key) or {}).get("containers") or []:
                if container.get("name") == trainjob.NODE:
                    container["name"] = TRAIN_CONTAINER
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == trainjob.NODE:
                status["name"] = TRAIN_CONTAINER
    return seen


def trainer_container(controller: Controller, container: str) -> str:
    """The container `logs` reads: a TrainJob's trainer runs in `node`."""
    return trainjob.NODE if controller.kind == trainjob.KIND and container == TRAIN_CONTAINER else container


def patch_run(batch: Any, controller: Controller, namespace: str, name: str, patch: dict[str, Any]) -> None:
    if controller.kind == DEFAULT_KIND:
        batch.patch_namespaced_job(name, namespace, patch)
        return
    _custom(batch).patch_namespaced_custom_object(controller.group, controller.version, namespace,
                                                  controller.plural, name, patch)


def delete_object(batch: Any, controller: Controller, namespace: str, name: str) -> None:
    """Delete the run's controller object (its pods go with it) and, for a TrainJob, its TrainingRuntime."""
    from kubernetes.client.exceptions import ApiException

    if controller.kind == DEFAULT_KIND:
        batch.delete_namespaced_job(name, namespace, propagation_policy="Foreground")
        return
    custom = _custom(batch)
    custom.delete_namespaced_custom_object(controller.group, controller.version, namespace, controller.plural, name,
                                           propagation_policy="Foreground")
    if controller.kind == trainjob.KIND:
        group, version = trainjob.API_VERSION.split("/")
        try:
            custom.delete_namespaced_custom_object(group, version, namespace, "trainingruntimes", name)
        except ApiException as exc:
            if exc.status != 404:
                raise
