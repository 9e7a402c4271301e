"""Kueue's accounting of the stack's pools and Jobs, and the checks that every quota fits.

What the pools hold per flavor at their maximum size (`Amounts`, `Flavor`, `flavors`), a team's guaranteed share and
what is left to share (`team_quota`, `shared_quota`), what a Job's pods ask as Kueue counts them (`pod_requests`,
`job_podsets`; `run_podsets` for every kind the stack renders: a batch/v1 Job, a JobSet, a TrainJob on its
runtime), and `check_queueing`: flavors known to the pools, team quotas that fit them, every stack Job's gang
within its queue's reach. Pure functions of the typed config and the pool plans; infra/queueing.py turns them into
Kueue objects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.config.queueing import KueueConfig
from infra.config.schema import ConfigError
from infra.nodes.poolplan import CAPACITY_LABEL, GPU_TAINT_KEY, UNRESERVED, PoolPlan
from workloads.cluster_facts import EFA_RESOURCE
from workloads.jobspec.kinds import run_pod_spec
from workloads.quantity import format_bytes, format_millicores, quantity_bytes, quantity_millicores

CPU_FLAVOR = "cpu"
GPU = "nvidia.com/gpu"
# The resources the training Jobs request; a ClusterQueue must cover every one of them or the Job is inadmissible.
RESOURCES = ("cpu", "memory", "ephemeral-storage", GPU)
KUEUE_EXCLUDED_RESOURCE_PREFIXES = (EFA_RESOURCE, "hugepages-")
CONFIG_KEY = "ml-cluster:kueue"
# The Kueue integration (its Configuration's integrations.frameworks) that manages each kind.
INTEGRATIONS = {("batch/v1", "Job"): "batch/job", ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io/jobset",
                ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org/trainjob"}
_RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"

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



def shared_quota(flavor: Flavor, cfg: KueueConfig) -> Amounts:
    """What the pools hold less what the teams are guaranteed (never below zero; check_queueing reports it)."""
    guaranteed = sum((team_quota(flavor, quota.gpus) for team in cfg.teams for quota in team.quotas
                      if quota.flavor == flavor.name), Amounts())
    left = flavor.capacity - guaranteed
    return Amounts(max(left.cpu, 0), max(left.memory, 0), max(left.ephemeral, 0), max(left.gpus, 0))



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


def _replicated_podsets(replicated_jobs: Sequence[Mapping[str, Any]],
                        counts: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """One podset per replicated Job, named after it, of replicas x min(parallelism, completions) pods
    (pkg/controller/jobs/jobset/jobset_controller.go:115-136, :231-244); `counts` replaces a Job's pod count."""
    podsets = []
    for rjob in replicated_jobs:
        spec = rjob["template"]["spec"]
        per_replica = spec.get("parallelism", 1)
        if spec.get("completions") is not None:
            per_replica = min(per_replica, spec["completions"])
        if counts and rjob["name"] in counts:
            per_replica = counts[rjob["name"]]
        podsets.append({"name": rjob["name"], "count": rjob.get("replicas", 1) * per_replica,
                        "requests": pod_requests(spec["template"]["spec"])})
    return podsets


def _runtime(manifests: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    runtimes = [m for m in manifests if m.get("kind") in _RUNTIME_KINDS]
    if not runtimes:
        raise ValueError("a TrainJob's podSets need its training runtime")
    return runtimes[0]


def _trainjob_counts(train_job: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, int]:
    """Trainer sets the trainer Job's pods to the TrainJob's numNodes (kubeflow/trainer v2.3.0
    pkg/runtime/framework/plugins/torch/torch.go:116-119); Kueue's podSets are the JobSet Trainer would build
    (pkg/controller/jobs/trainjob/trainjob_controller.go:146-183, :217-240)."""
    nodes = ((train_job.get("spec") or {}).get("trainer") or {}).get("numNodes")
    if nodes is None:
        return {}
    return {rjob["name"]: nodes for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]
            if ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(_ANCESTOR_LABEL) == "trainer"}


def run_podsets(manifests: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The podSets of a rendered run (its object first, its TrainingRuntime among the rest for a TrainJob)."""
    run = manifests[0]
    kind = run.get("kind")
    if kind == "JobSet":
        return _replicated_podsets(run["spec"]["replicatedJobs"])
    if kind == "TrainJob":
        runtime = _runtime(manifests)
        return _replicated_podsets(runtime["spec"]["template"]["spec"]["replicatedJobs"],
                                   _trainjob_counts(run, runtime))
    return job_podsets(run)


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


def _job_flavors(pod_spec: Mapping[str, Any], label_prefix: str, all_flavors: Sequence[Flavor]) -> list[Flavor]:
    """The flavors Kueue may assign a stack Job: those of its GPU type (reserved ones included), or `cpu`."""
    selector = pod_spec.get("nodeSelector") or {}
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
        integration = INTEGRATIONS.get((str(job.get("apiVersion")), str(job.get("kind"))))
        if integration not in cfg.integrations:
            problems.append((f"{where}.kind", f"a queued {job.get('kind')} needs the Kueue integration {integration} "
                                              f"({CONFIG_KEY}.integrations): without it Kueue ignores the queue label"))
            continue
        pod_spec = run_pod_spec(manifests)
        undeclared = sorted(undeclared_pod_resources(pod_spec))
        if undeclared:
            problems.append((f"{where}.queue", f"requests {', '.join(undeclared)}, which no ClusterQueue covers and "
                                               "Kueue's Configuration does not exclude: Kueue would never admit it"))
            continue
        candidates = _job_flavors(pod_spec, label_prefix, all_flavors)
        if not candidates:
            continue  # the renderer already refused a Job no pool can run
        cluster_queue = cfg.cluster_queue if queue == cfg.local_queue else queue
        podsets = run_podsets(manifests)
        needed = sum((podset["requests"].scaled(podset["count"]) for podset in podsets), Amounts())
        podset = {"count": sum(podset["count"] for podset in podsets)}
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
    return undeclared_pod_resources(run_pod_spec([job]))


def undeclared_pod_resources(pod: Mapping[str, Any]) -> set[str]:
    names = {name for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
             for part in ("requests", "limits") for name in ((container.get("resources") or {}).get(part) or {})}
    return {name for name in names
            if name not in RESOURCES and not name.startswith(KUEUE_EXCLUDED_RESOURCE_PREFIXES)}
