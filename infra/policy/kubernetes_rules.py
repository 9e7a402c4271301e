"""Policies over the stack's Kubernetes objects: training Jobs (GPU limits, /dev/shm, memory-backed volumes,
ephemeral storage, no hostPath, not privileged, EFA for multi-node gangs) and tenant teams' namespaces (a
ResourceQuota each; GPU Jobs inside them). Pure functions over a plan (infra/policy/plan.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from infra.policy.aws_rules import GPU_RESOURCE, NODE_GROUP_TYPE
from infra.policy.plan import PlannedStack, PlanResource
from infra.policy.rule import PolicyContext
from workloads.quantity import parse_quantity

JOB_TYPE = "kubernetes:batch/v1:Job"
NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
RESOURCE_QUOTA_TYPE = "kubernetes:core/v1:ResourceQuota"
TEAM_LABEL_SUFFIX = "/team"  # <labelPrefix>/team on a tenant team's namespace (infra.tenancy)
# What a team namespace's ResourceQuota must bound so nothing that bypasses Kueue gets more than the team's share.
TEAM_QUOTA_KEYS = ("requests.nvidia.com/gpu", "requests.cpu", "requests.memory")
EFA_RESOURCE = "vpc.amazonaws.com/efa"


# --- team namespaces ---


def _metadata(resource: PlanResource) -> Mapping[str, Any]:
    metadata = resource.inputs.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def team_namespaces(plan: PlannedStack) -> dict[str, PlanResource]:
    """Namespace name -> Namespace, for the namespaces labelled as a tenant team's."""
    found = {}
    for namespace in plan.of_type(NAMESPACE_TYPE):
        labels = _metadata(namespace).get("labels") or {}
        name = _metadata(namespace).get("name")
        if isinstance(labels, Mapping) and isinstance(name, str) and _label_ending(labels, TEAM_LABEL_SUFFIX):
            found[name] = namespace
    return found


def check_team_namespaces_have_quota(plan: PlannedStack,
                                     ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    """A team namespace without a ResourceQuota lets a pod that bypasses Kueue (no queue label, a bare Pod) take
    every free GPU of the cluster."""
    bounded: dict[str, set[str]] = {}
    for quota in plan.of_type(RESOURCE_QUOTA_TYPE):
        spec = quota.inputs.get("spec")
        hard = spec.get("hard") if isinstance(spec, Mapping) else None
        namespace = _metadata(quota).get("namespace")
        if isinstance(namespace, str) and isinstance(hard, Mapping):
            bounded.setdefault(namespace, set()).update(str(key) for key in hard)
    for name, namespace in sorted(team_namespaces(plan).items()):
        missing = [key for key in TEAM_QUOTA_KEYS if key not in bounded.get(name, set())]
        if missing:
            yield namespace, (f"team namespace {name} has no ResourceQuota on {', '.join(missing)}"
                              if name in bounded else f"team namespace {name} has no ResourceQuota")


def check_gpu_jobs_in_team_namespaces(plan: PlannedStack,
                                      ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    """Once a stack declares tenant teams, a GPU Job outside their namespaces spends GPUs no team is charged for and
    runs with the shared Jobs role. Advisory: the stack's own Jobs (acceptance tests, platform runs) may do so."""
    teams = team_namespaces(plan)
    if not teams:
        return
    for job in plan.of_type(JOB_TYPE):
        namespace = _metadata(job).get("namespace")
        if isinstance(namespace, str) and namespace not in teams and _is_gpu_job(job):
            yield job, (f"GPU Job in namespace {namespace}, not a team's ({', '.join(sorted(teams))}): no team's "
                        "quota or role applies to it")



# --- Kubernetes Jobs ---


def _pod_spec(job: PlanResource) -> Mapping[str, Any]:
    return ((job.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def _quantity(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def _gpus(container: Mapping[str, Any]) -> Decimal:
    resources = container.get("resources") or {}
    counts = [_quantity((resources.get(kind) or {}).get(GPU_RESOURCE)) for kind in ("limits", "requests")]
    return max((c for c in counts if c is not None), default=Decimal(0))


def _is_gpu_job(job: PlanResource) -> bool:
    return any(_gpus(c) > 0 for c in _containers(_pod_spec(job)))


def _volumes(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {v.get("name"): v for v in pod.get("volumes") or []}


def _mounted(
    container: Mapping[str, Any], volumes: Mapping[str, Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    names = [m.get("name") for m in container.get("volumeMounts") or []]
    return [volumes[n] for n in names if n in volumes]


def _is_memory_volume(volume: Mapping[str, Any]) -> bool:
    return (volume.get("emptyDir") or {}).get("medium") == "Memory"


def _is_disk_scratch(volume: Mapping[str, Any]) -> bool:
    return "emptyDir" in volume and not _is_memory_volume(volume)


def check_job_gpu_limits_equal_requests(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    if not _is_gpu_job(resource):
        return
    for container in _containers(_pod_spec(resource)):
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for name in sorted(set(limits) | set(requests)):
            limit, request = _quantity(limits.get(name)), _quantity(requests.get(name, limits.get(name)))
            if name in requests and name not in limits:
                yield (
                    f"container {container.get('name')}: requests {name} without a limit "
                    "(GPU Jobs need limits = requests)"
                )
            elif limit is not None and request is not None and limit != request:
                yield (
                    f"container {container.get('name')}: {name} limit {limits.get(name)} != request "
                    f"{requests.get(name)} (GPU Jobs need limits = requests)"
                )


def check_job_gpu_shm(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    pod = _pod_spec(resource)
    volumes = _volumes(pod)
    for container in _containers(pod):
        if _gpus(container) <= 0:
            continue
        shm = [
            m
            for m in container.get("volumeMounts") or []
            if m.get("mountPath") == "/dev/shm" and _is_memory_volume(volumes.get(m.get("name"), {}))
        ]
        if not shm:
            yield (
                f"container {container.get('name')} uses GPUs but mounts no emptyDir medium Memory at "
                "/dev/shm (the 64Mi default makes DataLoader workers crash)"
            )


def check_job_memory_covers_memory_volumes(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    pod = _pod_spec(resource)
    volumes = _volumes(pod)
    for name, volume in volumes.items():
        if _is_memory_volume(volume) and _quantity(volume["emptyDir"].get("sizeLimit")) is None:
            yield f"memory-backed volume {name} has no sizeLimit (it could take the node's memory)"
    for container in _containers(pod):
        in_memory = [v for v in _mounted(container, volumes) if _is_memory_volume(v)]
        if not in_memory:
            continue
        sizes = [_quantity(v["emptyDir"].get("sizeLimit")) for v in in_memory]
        total = sum((s for s in sizes if s is not None), Decimal(0))
        raw_limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        limit = _quantity(raw_limit)
        if limit is None:
            yield f"container {container.get('name')} mounts memory-backed volumes but has no memory limit"
        elif limit <= total:
            yield (
                f"container {container.get('name')}: memory limit {raw_limit} does not exceed its "
                f"memory-backed volumes ({', '.join(str(v.get('name')) for v in in_memory)}: {total} bytes), "
                "which count against it"
            )


def _ephemeral_limit(container: Mapping[str, Any]) -> Decimal | None:
    return _quantity(((container.get("resources") or {}).get("limits") or {}).get("ephemeral-storage"))


def check_job_ephemeral_storage_limits(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    """Disk scratch is bounded: its users set ephemeral-storage limits that together cover its sizeLimits.

    The kubelet charges emptyDir usage to the pod, whose limit is the sum over the app containers and native
    sidecars (init containers with restartPolicy Always); plain init containers run before them and add none.
    """
    pod = _pod_spec(resource)
    volumes = _volumes(pod)
    scratch = {name: v for name, v in volumes.items() if _is_disk_scratch(v)}
    if not scratch:
        return
    for container in _containers(pod):
        mounted = [v for v in _mounted(container, volumes) if _is_disk_scratch(v)]
        if mounted and _ephemeral_limit(container) is None:
            yield (
                f"container {container.get('name')} uses disk scratch "
                f"({', '.join(str(v.get('name')) for v in mounted)}) but sets no ephemeral-storage limit"
            )
    sizes = [_quantity(v["emptyDir"].get("sizeLimit")) for v in scratch.values()]
    long_running = [*(pod.get("containers") or [])]
    long_running += [c for c in pod.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    pod_limit = sum((limit for c in long_running if (limit := _ephemeral_limit(c)) is not None), Decimal(0))
    if all(size is not None for size in sizes):
        total = sum((size for size in sizes if size is not None), Decimal(0))
        if pod_limit < total:
            yield (
                f"the containers' ephemeral-storage limits ({pod_limit} bytes) do not cover the sizeLimits "
                f"of the disk scratch volumes ({', '.join(scratch)}: {total} bytes)"
            )


def check_job_no_host_path(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    for name, volume in _volumes(_pod_spec(resource)).items():
        if "hostPath" in volume:
            yield f"volume {name} is a hostPath volume"


def check_job_not_privileged(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    pod = _pod_spec(resource)
    for container in [*_containers(pod), *(pod.get("ephemeralContainers") or [])]:
        if (container.get("securityContext") or {}).get("privileged") is True:
            yield f"container {container.get('name')} is privileged"


def _label_ending(labels: Mapping[str, Any], suffix: str) -> Any:
    return next((value for key, value in labels.items() if key.endswith(suffix)), None)


def check_multi_node_jobs_use_efa(plan: PlannedStack, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    """A gang placed on a GPU type that has EFA node groups asks for EFA: over TCP alone the most expensive
    GPUs wait on every all-reduce."""
    efa_types = set()
    for group in plan.of_type(NODE_GROUP_TYPE):
        labels = group.inputs.get("labels") or {}
        if isinstance(labels, Mapping) and _label_ending(labels, "/efa") == "true":
            efa_types.add(_label_ending(labels, "/gpu-type"))
    for job in plan.of_type(JOB_TYPE):
        spec = job.inputs.get("spec") or {}
        selector = _pod_spec(job).get("nodeSelector") or {}
        if not isinstance(spec, Mapping) or not isinstance(selector, Mapping) or (spec.get("parallelism") or 1) < 2:
            continue
        gpu_type = _label_ending(selector, "/gpu-type")
        if gpu_type is None or gpu_type not in efa_types:
            continue
        for container in _containers(_pod_spec(job)):
            if _gpus(container) and not _quantity(((container.get("resources") or {}).get("limits") or {})
                                                  .get(EFA_RESOURCE)):
                yield job, (f"container {container.get('name')} of a {spec.get('parallelism')}-pod gang on GPU type "
                            f"{gpu_type}, which has EFA node groups, requests no {EFA_RESOURCE}")
