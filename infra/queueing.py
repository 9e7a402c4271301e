"""Kueue: gang admission and fair sharing of the GPU pools.

The node pools decide the queues. Every GPU type is a ResourceFlavor (its node label, its pools' taints); the pools
of no GPU make the `cpu` flavor. A GPU pool with a capacity reservation (Capacity Block or On-Demand Capacity
Reservation) is a flavor of its own, `reserved-<pool>`, listed before its type's flavor so Kueue fills the reserved
GPUs, already paid for, before the autoscaler buys others.

The shared ClusterQueue's nominal quota per flavor is what the pools can hold at their maximum size (GPUs, CPU,
memory, ephemeral storage per node x nodes), less what the teams are guaranteed; each team's ClusterQueue holds its
guaranteed GPUs of a flavor with CPU, memory and disk per GPU of that flavor, and all of them share a cohort,
so idle quota is lent and reclaimed by preemption. Nothing in the cohort is counted twice: the quotas add up to the
pools, and an admitted gang always fits the nodes the autoscaler can bring up.

Everything here is a pure function of the typed config and the pool plans (manifests as dicts), checked by
`check_queueing` before any resource is registered; the Queueing component only registers them: the Helm release
(its CRDs are templates of the chart, so they come and go with the release) and then the custom resources, which
depend on the release so `pulumi up` creates them after their CRDs and webhook and `pulumi destroy` deletes them
before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.config.queueing import KueueConfig
from infra.config.schema import ConfigError
from infra.context import ClusterInfo, StackContext
from infra.nodes.poolplan import CAPACITY_LABEL, GPU_TAINT_KEY, UNRESERVED, PoolPlan
from workloads.cluster_facts import EFA_RESOURCE
from workloads.jobspec import KUEUE_QUEUE_LABEL, queue_annotation
from workloads.quantity import format_bytes, format_millicores, quantity_bytes, quantity_millicores

KUEUE_CHART = "kueue"
KUEUE_REPO = "oci://registry.k8s.io/kueue/charts/kueue"
API_VERSION = "kueue.x-k8s.io/v1beta2"  # the storage version of every Kueue CRD at 0.19.2
CPU_FLAVOR = "cpu"
GPU = "nvidia.com/gpu"
# The resources the training Jobs request; a ClusterQueue must cover every one of them or the Job is inadmissible.
RESOURCES = ("cpu", "memory", "ephemeral-storage", GPU)
KUEUE_EXCLUDED_RESOURCE_PREFIXES = (EFA_RESOURCE, "hugepages-")
CONFIG_KEY = "ml-cluster:kueue"
# How a ClusterQueue with reserved flavors walks its flavors (kubernetes-sigs/kueue v0.19.2): in the resource group's
# order (pkg/scheduler/flavorassigner/flavorassigner.go:1089), skipping a flavor whose nodeLabels contradict the
# Job's nodeSelector (:1227-1253) or that cannot fit; it stops at the first flavor unless shouldTryNextFlavor
# (:1259-1275) says go on. whenCanBorrow MayStopSearch: a reserved flavor the queue must borrow (a team's, whose quota
# of it is 0) is still taken, so idle reserved GPUs are used before on-demand ones are bought; whenCanPreempt
# TryNextFlavor: a full reservation sends the Job on to the next flavor instead of evicting a running one. Both are the
# CRD defaults (apis/kueue/v1beta2/clusterqueue_types.go:457-479), stated so a changed default cannot reorder them.
RESERVED_FIRST = {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}

Manifest = dict[str, Any]


# --- capacity of the pools, per flavor ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Amounts:
    """CPU millicores, memory bytes, ephemeral-storage bytes and GPUs."""

    cpu: int = 0
    memory: int = 0
    ephemeral: int = 0
    gpus: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(self.cpu + other.cpu, self.memory + other.memory, self.ephemeral + other.ephemeral,
                       self.gpus + other.gpus)

    def __sub__(self, other: Amounts) -> Amounts:
        return Amounts(self.cpu - other.cpu, self.memory - other.memory, self.ephemeral - other.ephemeral,
                       self.gpus - other.gpus)

    def scaled(self, count: int) -> Amounts:
        return Amounts(self.cpu * count, self.memory * count, self.ephemeral * count, self.gpus * count)

    def quantities(self) -> dict[str, str]:
        """Resource name -> Kubernetes quantity, as a ClusterQueue's nominalQuota."""
        return {"cpu": format_millicores(self.cpu), "memory": format_bytes(self.memory),
                "ephemeral-storage": format_bytes(self.ephemeral), GPU: str(self.gpus)}

    def exceeding(self, limit: Amounts) -> list[str]:
        return [name for name, mine, theirs in (("cpu", self.cpu, limit.cpu), ("memory", self.memory, limit.memory),
                                                ("ephemeral-storage", self.ephemeral, limit.ephemeral),
                                                (GPU, self.gpus, limit.gpus)) if mine > theirs]


@dataclass(frozen=True)
class Flavor:
    """One ResourceFlavor: the pools it stands for and what they hold at their maximum size."""

    name: str
    pools: tuple[PoolPlan, ...]
    node_labels: dict[str, str]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, Kubernetes effect) every node of the flavor carries
    capacity: Amounts
    per_gpu: Amounts | None  # CPU, memory, disk of one GPU's share of a node; None for the cpu flavor
    gpu_type: str | None = None
    reservation: str | None = None  # the capacity reservation (cr-...) of a reserved pool's flavor


def pool_nodes(plan: PoolPlan) -> int:
    """The most nodes a pool can have: its maxSize, or the existing nodes it names (onprem). A reserved pool's maxSize
    is at most its reservation's instanceCount (a config rule), so its quota never exceeds what is reserved."""
    return len(plan.config.existing.nodes) if plan.config.existing is not None else plan.config.max_size


def _node_amounts(plan: PoolPlan) -> Amounts:
    """What one node offers to pods. GPU nodes: the per-GPU sizes Jobs are cut from, times its GPUs."""
    if plan.is_gpu and plan.cpu_per_gpu_millicores and plan.memory_per_gpu_bytes:
        return Amounts(plan.cpu_per_gpu_millicores * plan.gpus_per_node,
                       plan.memory_per_gpu_bytes * plan.gpus_per_node, plan.ephemeral_storage_bytes,
                       plan.gpus_per_node)
    # Whole MiB: the quota reads as a quantity, not a byte count.
    return Amounts(plan.allocatable_cpu_millicores, plan.allocatable_memory_bytes // 2**20 * 2**20,
                   plan.ephemeral_storage_bytes, 0)


def reserved_flavor_name(pool: str) -> str:
    return f"reserved-{pool}"


def _flavor(name: str, pools: tuple[PoolPlan, ...], label_prefix: str, gpu_type: str | None,
            reservation: str | None = None) -> Flavor:
    capacity = sum((_node_amounts(plan).scaled(pool_nodes(plan)) for plan in pools), Amounts())
    # A taint only some pools of the flavor carry cannot be promised for all its nodes.
    taint_sets = [{(t.key, t.value, t.kubernetes_effect) for t in plan.taints} for plan in pools]
    common = set.intersection(*taint_sets) if taint_sets else set()
    if gpu_type is None:
        return Flavor(name, pools, {}, tuple(sorted(common)), capacity, None)
    common = {t for t in common if t[0] != GPU_TAINT_KEY} | {(GPU_TAINT_KEY, "true", "NoSchedule")}
    gpus_per_node = min(plan.gpus_per_node for plan in pools)
    per_gpu = Amounts(min(plan.cpu_per_gpu_millicores or 0 for plan in pools),
                      min(plan.memory_per_gpu_bytes or 0 for plan in pools),
                      min(plan.ephemeral_storage_bytes for plan in pools) // gpus_per_node, 1)
    node_labels = {f"{label_prefix}/gpu-type": gpu_type}
    capacity_key = f"{label_prefix}/{CAPACITY_LABEL}"
    if reservation is not None:
        # Exactly this pool's nodes: a reservation is filled and counted on its own.
        node_labels[f"{label_prefix}/pool"] = pools[0].name
    elif any(capacity_key in plan.labels for plan in pools):
        # The type also has reserved pools: this flavor's Jobs must not land on (and scale up) their nodes.
        node_labels[capacity_key] = UNRESERVED
    return Flavor(name, pools, node_labels, tuple(sorted(common)), capacity, per_gpu, gpu_type, reservation)


def flavors(plans: Sequence[PoolPlan], label_prefix: str) -> list[Flavor]:
    """Per GPU type (sorted): a flavor `reserved-<pool>` for each pool with a capacity reservation (in config order),
    then the type's flavor for its other pools; last `cpu` for the pools without GPUs (if any). A ClusterQueue lists
    them in this order, which is the order Kueue tries them in: reserved GPUs are filled first."""
    groups: dict[str, list[PoolPlan]] = {}
    for plan in plans:
        groups.setdefault(plan.gpu_type if plan.is_gpu and plan.gpu_type else CPU_FLAVOR, []).append(plan)
    result = []
    for name in sorted(groups, key=lambda flavor: (flavor == CPU_FLAVOR, flavor)):
        if name == CPU_FLAVOR:
            result.append(_flavor(name, tuple(groups[name]), label_prefix, None))
            continue
        unreserved = tuple(plan for plan in groups[name] if plan.config.capacity_reservation is None)
        for plan in groups[name]:
            reservation = plan.config.capacity_reservation
            if reservation is not None:
                result.append(_flavor(reserved_flavor_name(plan.name), (plan,), label_prefix, name, reservation.id))
        if unreserved:
            result.append(_flavor(name, unreserved, label_prefix, name))
    return result


def team_quota(flavor: Flavor, gpus: int) -> Amounts:
    assert flavor.per_gpu is not None
    return flavor.per_gpu.scaled(gpus)


# --- manifests ---------------------------------------------------------------------------------------------------


def _metadata(name: str, stack: str, label_prefix: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {
        "app.kubernetes.io/part-of": "ml-cluster", "app.kubernetes.io/managed-by": "pulumi",
        "app.kubernetes.io/component": "queueing", f"{label_prefix}/stack": stack}}
    if namespace is not None:
        metadata["namespace"] = namespace
    return metadata


def flavor_manifest(flavor: Flavor, stack: str, label_prefix: str,
                    gpu_node_labels: Mapping[str, str] | None = None) -> Manifest:
    """`gpu_node_labels`: labels every GPU flavor's nodes must also carry (the burn-in's gpu-health=passed): Kueue
    adds a flavor's nodeLabels to the nodeSelector of the pods it admits on it."""
    spec: dict[str, Any] = {}
    gated = dict(gpu_node_labels or {}) if flavor.per_gpu is not None else {}
    node_labels = {**flavor.node_labels, **gated}
    if node_labels:
        spec["nodeLabels"] = node_labels
    if flavor.taints:
        # Kueue gives this flavor only to workloads that tolerate every one of these taints, so a CPU Job is never
        # admitted against GPU quota.
        spec["nodeTaints"] = [{"key": key, "value": value, "effect": effect} for key, value, effect in flavor.taints]
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor",
            "metadata": _metadata(flavor.name, stack, label_prefix), "spec": spec}


def _flavor_quotas(name: str, quota: Amounts, borrowing: Amounts | None, lending: Amounts | None) -> dict[str, Any]:
    resources = []
    nominal = quota.quantities()
    borrow = borrowing.quantities() if borrowing is not None else {}
    lend = lending.quantities() if lending is not None else {}
    for resource in RESOURCES:
        entry = {"name": resource, "nominalQuota": nominal[resource]}
        if resource in borrow:
            entry["borrowingLimit"] = borrow[resource]
        if resource in lend:
            entry["lendingLimit"] = lend[resource]
        resources.append(entry)
    return {"name": name, "resources": resources}


def _cluster_queue(name: str, cfg: KueueConfig, flavor_quotas: list[dict[str, Any]], stack: str, label_prefix: str,
                   namespace: str, weight: int | None = None, reserved: bool = False) -> Manifest:
    spec: dict[str, Any] = {
        # Only the training namespace's LocalQueues may point here.
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": cfg.queueing_strategy,
        "resourceGroups": [{"coveredResources": list(RESOURCES), "flavors": flavor_quotas}],
        "preemption": {
            "withinClusterQueue": cfg.preemption.within_cluster_queue,
            **({"reclaimWithinCohort": cfg.preemption.reclaim_within_cohort,
                "borrowWithinCohort": {"policy": cfg.preemption.borrow_within_cohort}} if cfg.cohort else {}),
        },
    }
    if cfg.cohort:
        spec["cohortName"] = cfg.cohort
    if reserved:
        spec["flavorFungibility"] = dict(RESERVED_FIRST)
    if weight is not None:
        spec["fairSharing"] = {"weight": weight}
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _metadata(name, stack, label_prefix),
            "spec": spec}


def _local_queue(name: str, cluster_queue: str, namespace: str, stack: str, label_prefix: str) -> Manifest:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": _metadata(name, stack, label_prefix, namespace), "spec": {"clusterQueue": cluster_queue}}


def shared_quota(flavor: Flavor, cfg: KueueConfig) -> Amounts:
    """What the pools hold less what the teams are guaranteed (never below zero; check_queueing reports it)."""
    guaranteed = sum((team_quota(flavor, quota.gpus) for team in cfg.teams for quota in team.quotas
                      if quota.flavor == flavor.name), Amounts())
    left = flavor.capacity - guaranteed
    return Amounts(max(left.cpu, 0), max(left.memory, 0), max(left.ephemeral, 0), max(left.gpus, 0))


def queue_manifests(cfg: KueueConfig, plans: Sequence[PoolPlan], namespace: str, stack: str,
                    label_prefix: str, gpu_node_labels: Mapping[str, str] | None = None) -> list[Manifest]:
    """Every Kueue object of the stack: flavors, priority classes, ClusterQueues, LocalQueues (in that order)."""
    all_flavors = flavors(plans, label_prefix)
    manifests = [flavor_manifest(flavor, stack, label_prefix, gpu_node_labels) for flavor in all_flavors]
    for priority in cfg.priority_classes:
        manifests.append({"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass",
                          "metadata": _metadata(priority.name, stack, label_prefix), "value": priority.value,
                          **({"description": priority.description} if priority.description else {})})
    reserved = any(flavor.reservation is not None for flavor in all_flavors)
    shared = [_flavor_quotas(flavor.name, shared_quota(flavor, cfg), None, None) for flavor in all_flavors]
    manifests.append(_cluster_queue(cfg.cluster_queue, cfg, shared, stack, label_prefix, namespace,
                                    reserved=reserved))
    by_name = {flavor.name: flavor for flavor in all_flavors}
    for team in cfg.teams:
        quotas = {quota.flavor: quota for quota in team.quotas}
        team_flavors = []
        # Every flavor is listed (0 where the team has no quota), so the team can borrow any of them in the cohort.
        for flavor in all_flavors:
            quota = quotas.get(flavor.name)
            gpus = quota.gpus if quota is not None else 0
            borrowing = lending = None
            if quota is not None and quota.borrowing_limit is not None:
                borrowing = team_quota(flavor, quota.borrowing_limit)
            if quota is not None and quota.lending_limit is not None:
                lending = team_quota(flavor, min(quota.lending_limit, gpus))
            amounts = team_quota(flavor, gpus) if flavor.per_gpu is not None else Amounts()
            team_flavors.append(_flavor_quotas(flavor.name, amounts, borrowing, lending))
        unknown = [name for name in quotas if name not in by_name]
        assert not unknown, "check_queueing lets no unknown flavor through"
        # A tenant team's ClusterQueue takes workloads from its own namespace only.
        manifests.append(_cluster_queue(team.name, cfg, team_flavors, stack, label_prefix,
                                        team.namespace or namespace, team.fair_sharing_weight, reserved))
    manifests.append(_local_queue(cfg.local_queue, cfg.cluster_queue, namespace, stack, label_prefix))
    for team in cfg.teams:
        manifests.append(_local_queue(team.name, team.name, team.namespace or namespace, stack, label_prefix))
    return manifests


# --- the release ---------------------------------------------------------------------------------------------------


def manager_config(cfg: KueueConfig) -> dict[str, Any]:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2): the chart's default at 0.19.2
    (charts/kueue/values.yaml:119-186) with waitForPodsReady set and only the configured integrations."""
    wait = cfg.wait_for_pods_ready
    requeuing: dict[str, Any] = {"timestamp": "Eviction", "backoffBaseSeconds": wait.backoff_base_seconds,
                                 "backoffMaxSeconds": wait.backoff_max_seconds}
    if wait.backoff_limit_count is not None:
        requeuing["backoffLimitCount"] = wait.backoff_limit_count
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {"groupKindConcurrency": {
            "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 10, "LocalQueue.kueue.x-k8s.io": 5,
            "ClusterQueue.kueue.x-k8s.io": 5, "ResourceFlavor.kueue.x-k8s.io": 1}},
        "clientConnection": {"qps": 300, "burst": 500},
        # Stated, not left to the default: stack Jobs are held suspended WITHOUT a queue label until their data is
        # uploaded, and only Jobs without the label are left alone (pkg/controller/jobframework/reconciler.go:364).
        "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {"timeout": wait.timeout, "recoveryTimeout": wait.recovery_timeout,
                             "blockAdmission": wait.block_admission, "requeuingStrategy": requeuing},
        "integrations": {"frameworks": list(cfg.integrations)},
        # EFA interfaces and hugepages are per-node devices the scheduler places; Kueue meters GPUs, CPU, memory and
        # disk. Under its default quota check (BlockUndeclared, apis/config/v1beta2/configuration_types.go:578-595)
        # a gang asking for a resource no ClusterQueue covers is never admitted ("resource ... unavailable in
        # ClusterQueue", pkg/scheduler/flavorassigner/flavorassigner.go:1071), so they are excluded.
        "resources": {"excludeResourcePrefixes": list(KUEUE_EXCLUDED_RESOURCE_PREFIXES)},
        # Present means on (pkg/scheduler/preemption/fairsharing/strategy.go:50); the strategies are the chart's
        # documented ones (charts/kueue/values.yaml, commented `fairSharing`).
        **({"fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]}}
           if cfg.fair_sharing else {}),
    }


def kueue_values(cfg: KueueConfig) -> dict[str, Any]:
    return {
        "controllerManager": {"manager": {
            "priorityClassName": "system-cluster-critical",
            "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}}},
        "managerConfig": {"controllerManagerConfigYaml": yaml.safe_dump(manager_config(cfg), sort_keys=False)},
    }


# --- Kueue's accounting, for the checks ------------------------------------------------------------------------


def _parse(resource: str, value: Any) -> int:
    return quantity_millicores(str(value)) if resource == "cpu" else int(quantity_bytes(str(value))) \
        if resource in ("memory", "ephemeral-storage") else int(value)


def _requests(container: Mapping[str, Any]) -> Amounts:
    requests = (container.get("resources") or {}).get("requests") or {}
    return Amounts(_parse("cpu", requests.get("cpu", 0)), _parse("memory", requests.get("memory", 0)),
                   _parse("ephemeral-storage", requests.get("ephemeral-storage", 0)),
                   _parse(GPU, requests.get(GPU, 0)))


def _maximum(a: Amounts, b: Amounts) -> Amounts:
    return Amounts(max(a.cpu, b.cpu), max(a.memory, b.memory), max(a.ephemeral, b.ephemeral), max(a.gpus, b.gpus))


def pod_requests(pod_spec: Mapping[str, Any]) -> Amounts:
    """A pod's effective requests as Kueue counts them (k8s.io/component-helpers PodRequests, which Kueue calls at
    pkg/workload/workload.go:676): the containers plus native sidecars, or an init container with the sidecars
    started before it, whichever is larger per resource."""
    total = sum((_requests(c) for c in pod_spec.get("containers") or []), Amounts())
    sidecars, init_peak = Amounts(), Amounts()
    for container in pod_spec.get("initContainers") or []:
        if container.get("restartPolicy") == "Always":
            sidecars = sidecars + _requests(container)
            init_peak = _maximum(init_peak, sidecars)
        else:
            init_peak = _maximum(init_peak, sidecars + _requests(container))
    return _maximum(total + sidecars, init_peak)


def job_podsets(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The Workload's podSets Kueue makes of a batch/v1 Job (pkg/controller/jobs/job/job_controller.go:356-375):
    one podset `main` of min(parallelism, completions) pods; no minCount unless the Job asks for partial admission
    (annotation kueue.x-k8s.io/job-min-parallelism), so the gang is admitted whole or not at all."""
    spec = job["spec"]
    count = spec.get("parallelism", 1)
    if spec.get("completions") is not None:
        count = min(count, spec["completions"])
    podset: dict[str, Any] = {"name": "main", "count": count, "requests": pod_requests(spec["template"]["spec"])}
    minimum = (job["metadata"].get("annotations") or {}).get("kueue.x-k8s.io/job-min-parallelism")
    if minimum is not None:
        podset["minCount"] = int(minimum)
    return [podset]


# --- checks --------------------------------------------------------------------------------------------------------


def _cohort_max(cfg: KueueConfig, queue: str, flavor: Flavor) -> Amounts:
    """The most a ClusterQueue can ever hold of a flavor: its nominal quota plus what it may borrow from the rest of
    the cohort (their lendable quota, capped by its borrowing limit)."""
    def nominal_and_limits(name: str) -> tuple[Amounts, Amounts | None, Amounts]:
        if name == cfg.cluster_queue:
            shared = shared_quota(flavor, cfg)
            return shared, None, shared
        team = next(team for team in cfg.teams if team.name == name)
        quota = next((q for q in team.quotas if q.flavor == flavor.name), None)
        if quota is None or flavor.per_gpu is None:
            return Amounts(), None, Amounts()
        nominal = team_quota(flavor, quota.gpus)
        borrow = team_quota(flavor, quota.borrowing_limit) if quota.borrowing_limit is not None else None
        lend = team_quota(flavor, min(quota.lending_limit, quota.gpus)) if quota.lending_limit is not None else nominal
        return nominal, borrow, lend

    nominal, borrow, _ = nominal_and_limits(queue)
    if not cfg.cohort:
        return nominal
    others = sum((nominal_and_limits(name)[2] for name in (cfg.cluster_queue, *(t.name for t in cfg.teams))
                  if name != queue), Amounts())
    if borrow is not None:
        others = Amounts(min(others.cpu, borrow.cpu), min(others.memory, borrow.memory),
                         min(others.ephemeral, borrow.ephemeral), min(others.gpus, borrow.gpus))
    return nominal + others


def team_ceiling(cfg: KueueConfig, team: str, plans: Sequence[PoolPlan], label_prefix: str) -> Amounts:
    """The most a team's ClusterQueue can ever have admitted at once, over every flavor: its namespace's
    ResourceQuota, so pods Kueue admits always fit and pods that bypass Kueue get no more."""
    return sum((_cohort_max(cfg, team, flavor) for flavor in flavors(plans, label_prefix)), Amounts())


def _job_flavors(job: Mapping[str, Any], label_prefix: str, all_flavors: Sequence[Flavor]) -> list[Flavor]:
    """The flavors Kueue may assign a stack Job: those of its GPU type (reserved ones included), or `cpu`."""
    selector = job["spec"]["template"]["spec"].get("nodeSelector") or {}
    gpu_type = selector.get(f"{label_prefix}/gpu-type")
    if not gpu_type:
        return [flavor for flavor in all_flavors if flavor.name == CPU_FLAVOR]
    return [flavor for flavor in all_flavors if flavor.gpu_type == gpu_type]


def check_queueing(cfg: KueueConfig, plans: Sequence[PoolPlan], label_prefix: str,
                   jobs: Sequence[Sequence[Manifest]] = (), job_queues: Sequence[str | None] = ()) -> None:
    """What Kueue would accept but can never work; raises ConfigError (every problem, one line each).

    `jobs` are the stack's rendered Jobs and `job_queues` the LocalQueue each goes through (None: no queue)."""
    problems: list[tuple[str, str]] = []
    all_flavors = flavors(plans, label_prefix)
    by_name = {flavor.name: flavor for flavor in all_flavors}
    known = ", ".join(by_name) or "none"
    gpu_flavor_names = [flavor.name for flavor in all_flavors if flavor.per_gpu is not None]
    if CPU_FLAVOR in gpu_flavor_names:
        problems.append((f"{CONFIG_KEY}", f"GPU type {CPU_FLAVOR!r} clashes with the flavor of the CPU pools"))
    for t_index, team in enumerate(cfg.teams):
        for q_index, quota in enumerate(team.quotas):
            where = f"{CONFIG_KEY}.teams[{t_index}].quotas[{q_index}]"
            flavor = by_name.get(quota.flavor)
            if flavor is None:
                problems.append((f"{where}.flavor", f"team {team.name}: no node pool provides flavor {quota.flavor} "
                                                    f"(flavors, one per GPU type and per reserved pool: {known})"))
            elif flavor.per_gpu is None:
                problems.append((f"{where}.flavor", f"team {team.name}: team quotas are GPUs of a GPU type; "
                                                    f"{quota.flavor} has none (CPU Jobs borrow from the cohort)"))
    for flavor in all_flavors:
        if flavor.per_gpu is None:
            continue
        asked = [(t_index, q_index, quota) for t_index, team in enumerate(cfg.teams)
                 for q_index, quota in enumerate(team.quotas) if quota.flavor == flavor.name]
        total = sum(quota.gpus for _, _, quota in asked)
        if total > flavor.capacity.gpus:
            t_index, q_index, _ = asked[-1]
            pools = ", ".join(f"{plan.name} {pool_nodes(plan)}x{plan.gpus_per_node}" for plan in flavor.pools)
            problems.append((f"{CONFIG_KEY}.teams[{t_index}].quotas[{q_index}].gpus",
                             f"the teams are guaranteed {total} {flavor.name} GPUs but the pools hold "
                             f"{flavor.capacity.gpus} at their maximum size ({pools})"))
    if cfg.enabled:
        for index, plan in enumerate(plans):
            if plan.ephemeral_storage_bytes == 0 and plan.config.existing is not None:
                # Every Job requests ephemeral storage: a flavor whose quota has none admits nothing.
                problems.append((f"ml-cluster:nodePools[{index}].existing.kubeletDiskGib",
                                 f"pool {plan.name} declares no kubelet disk (nvmeGib or kubeletDiskGib): Kueue's "
                                 "ephemeral-storage quota for its nodes would be 0 and no Job could be admitted"))
    if problems:
        raise ConfigError(problems)
    for index, (manifests, queue) in enumerate(zip(jobs, job_queues, strict=True)):
        if queue is None:
            continue
        job = manifests[0]
        where = f"ml-cluster:jobs[{index}]"
        if not cfg.enabled:
            problems.append((f"{where}.queue", f"queue {queue}: Kueue is not enabled in this stack "
                                               f"({CONFIG_KEY}.enabled)"))
            continue
        undeclared = sorted(undeclared_resources(job))
        if undeclared:
            problems.append((f"{where}.queue", f"requests {', '.join(undeclared)}, which no ClusterQueue covers and "
                                               "Kueue's Configuration does not exclude: Kueue would never admit it"))
            continue
        candidates = _job_flavors(job, label_prefix, all_flavors)
        if not candidates:
            continue  # the renderer already refused a Job no pool can run
        cluster_queue = cfg.cluster_queue if queue == cfg.local_queue else queue
        [podset] = job_podsets(job)
        needed = podset["requests"].scaled(podset["count"])
        # A podset is admitted into one flavor: the gang must fit one of them whole.
        ceilings = [(flavor, _cohort_max(cfg, cluster_queue, flavor)) for flavor in candidates]
        if all(needed.exceeding(ceiling) for _, ceiling in ceilings):
            flavor, ceiling = max(ceilings, key=lambda pair: (pair[1].gpus, pair[1].cpu))
            over = needed.exceeding(ceiling)
            have, want = ceiling.quantities(), needed.quantities()
            detail = ", ".join(f"{name} {want[name]} > {have[name]}" for name in over)
            others = [f.name for f, _ in ceilings if f is not flavor]
            also = f", nor from {', '.join(others)} (a gang gets one flavor)" if others else ""
            problems.append((f"{where}.queue" if GPU not in over else f"{where}.gpus",
                             f"the gang ({podset['count']} pod(s)) needs more {flavor.name} quota than ClusterQueue "
                             f"{cluster_queue} can ever get ({detail}){also}; Kueue would keep it pending forever"))
    if problems:
        raise ConfigError(problems)


def undeclared_resources(job: Manifest) -> set[str]:
    """Resources a Job's containers request that Kueue's quota check would block on (BlockUndeclared): neither
    covered by the ClusterQueues (RESOURCES) nor excluded (KUEUE_EXCLUDED_RESOURCE_PREFIXES)."""
    pod = job["spec"]["template"]["spec"]
    names = {name for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
             for part in ("requests", "limits") for name in ((container.get("resources") or {}).get(part) or {})}
    return {name for name in names
            if name not in RESOURCES and not name.startswith(KUEUE_EXCLUDED_RESOURCE_PREFIXES)}


def stack_job_queues(rendered: Sequence[Sequence[Manifest]], label_prefix: str) -> list[str | None]:
    """The LocalQueue of each rendered stack Job (held Jobs carry it as an annotation, released ones as the label)."""
    queues: list[str | None] = []
    for manifests in rendered:
        metadata = manifests[0]["metadata"]
        queues.append((metadata.get("labels") or {}).get(KUEUE_QUEUE_LABEL)
                      or (metadata.get("annotations") or {}).get(queue_annotation(label_prefix)))
    return queues


def kueue_facts(cfg: KueueConfig) -> dict[str, Any]:
    """The ClusterFacts fields a Job renderer needs from this config."""
    if not cfg.enabled:
        return {"kueue": False, "local_queue": None, "local_queues": None, "workload_priority_classes": None}
    return {"kueue": True, "local_queue": cfg.local_queue, "local_queues": cfg.local_queues,
            "workload_priority_classes": tuple(priority.name for priority in cfg.priority_classes)}


# --- the component -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueingArgs:
    ctx: StackContext
    cluster: ClusterInfo
    config: KueueConfig
    manifests: tuple[Manifest, ...]  # queue_manifests(...)
    depends_on: tuple[pulumi.Resource, ...] = ()  # node groups: the controller needs a node to run on


class KubernetesObject(pulumi.CustomResource):
    """A custom resource registered with every top-level field of its manifest: pulumi_kubernetes'
    apiextensions.CustomResource carries only `spec`, and a WorkloadPriorityClass has `value` at the top."""

    def __init__(self, name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> None:
        super().__init__(f"kubernetes:{manifest['apiVersion']}:{manifest['kind']}", name, dict(manifest), opts)


class Queueing(pulumi.ComponentResource):
    """The Kueue release and the stack's flavors, priority classes and queues."""

    release: k8s.helm.v3.Release
    resources: list[pulumi.Resource]

    def __init__(self, name: str, args: QueueingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:Queueing", name, None, opts)
        ctx, cfg = args.ctx, args.config
        self.release = k8s.helm.v3.Release(
            ctx.name("kueue", "release"), name=KUEUE_CHART, chart=KUEUE_REPO, version=cfg.chart_version,
            namespace=cfg.namespace, create_namespace=True, values=kueue_values(cfg),
            opts=pulumi.ResourceOptions(parent=self, provider=args.cluster.provider,
                                        depends_on=list(args.depends_on)))
        # Custom resources after their CRDs and the webhook that validates them; on destroy they go first, and
        # queues (whose finalizers wait for their workloads) after the Jobs that depend on them.
        after_release = pulumi.ResourceOptions(parent=self, provider=args.cluster.provider, depends_on=[self.release])
        self.resources = []
        self.local_queues: dict[str, pulumi.Resource] = {}
        flavor_resources: list[pulumi.Resource] = []
        cluster_queues: dict[str, pulumi.Resource] = {}
        for manifest in args.manifests:
            kind, name = manifest["kind"], manifest["metadata"]["name"]
            # A ClusterQueue needs its flavors, a LocalQueue its ClusterQueue (and nothing else, so adding a team
            # changes no other queue's dependencies).
            needs = {"ClusterQueue": flavor_resources,
                     "LocalQueue": [cluster_queues[manifest.get("spec", {}).get("clusterQueue", "")]]
                     if kind == "LocalQueue" else []}.get(kind, [])
            # A LocalQueue's clusterQueue is immutable (CRD rule `self == oldSelf`): pointing it elsewhere replaces it.
            replace = ["spec.clusterQueue"] if kind == "LocalQueue" else None
            resource = KubernetesObject(
                ctx.name("kueue", f"{_kebab(kind)}-{name}"), manifest,
                after_release.merge(pulumi.ResourceOptions(depends_on=[self.release, *needs],
                                                           replace_on_changes=replace,
                                                           delete_before_replace=kind == "LocalQueue")))
            if kind == "ResourceFlavor":
                flavor_resources.append(resource)
            elif kind == "ClusterQueue":
                cluster_queues[name] = resource
            elif kind == "LocalQueue":
                self.local_queues[name] = resource
            self.resources.append(resource)
        self.register_outputs({"release": self.release.status,
                               "localQueues": [m["metadata"]["name"] for m in args.manifests
                                               if m["kind"] == "LocalQueue"]})


def _kebab(kind: str) -> str:
    out = "".join(f"-{ch.lower()}" if ch.isupper() else ch for ch in kind).lstrip("-")
    return {"resource-flavor": "flavor", "workload-priority-class": "priority", "cluster-queue": "cq",
            "local-queue": "lq"}.get(out, out)
