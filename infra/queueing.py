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

Everything here is a pure function of the typed config and the pool plans (manifests as dicts); the capacity per
flavor, Kueue's accounting of a Job and `check_queueing`, run before any resource is registered, are
infra/quota.py. The Queueing component only registers them: the Helm release
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

from infra.config.charts import KUEUE
from infra.config.queueing import KueueConfig
from infra.context import ClusterInfo, StackContext
from infra.kueue_api import served_manifests
from infra.nodes.poolplan import PoolPlan
from infra.quota import (
    KUEUE_EXCLUDED_RESOURCE_PREFIXES,
    RESOURCES,
    Amounts,
    Flavor,
    Manifest,
    flavors,
    shared_quota,
    team_quota,
)
from infra.topology import PROVISIONING_CHECK, gpu_topologies, provisioning_on, topology_manifests, topology_name
from workloads.jobspec import KUEUE_QUEUE_LABEL, queue_annotation

KUEUE_CHART, KUEUE_REPO = KUEUE.release, KUEUE.repo
API_VERSION = "kueue.x-k8s.io/v1beta2"  # the storage version of every Kueue CRD at 0.19.2

# How a ClusterQueue with reserved flavors walks its flavors (kubernetes-sigs/kueue v0.19.2): in the resource group's
# order (pkg/scheduler/flavorassigner/flavorassigner.go:1089), skipping a flavor whose nodeLabels contradict the
# Job's nodeSelector (:1227-1253) or that cannot fit; it stops at the first flavor unless shouldTryNextFlavor
# (:1259-1275) says go on. whenCanBorrow MayStopSearch: a reserved flavor the queue must borrow (a team's, whose quota
# of it is 0) is still taken, so idle reserved GPUs are used before on-demand ones are bought; whenCanPreempt
# TryNextFlavor: a full reservation sends the Job on to the next flavor instead of evicting a running one. Both are the
# CRD defaults (apis/kueue/v1beta2/clusterqueue_types.go:457-479), stated so a changed default cannot reorder them.
RESERVED_FIRST = {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}


# --- manifests ---------------------------------------------------------------------------------------------------


def _metadata(name: str, stack: str, label_prefix: str, namespace: str | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {
        "app.kubernetes.io/part-of": "ml-cluster", "app.kubernetes.io/managed-by": "pulumi",
        "app.kubernetes.io/component": "queueing", f"{label_prefix}/stack": stack}}
    if namespace is not None:
        metadata["namespace"] = namespace
    return metadata


def flavor_manifest(flavor: Flavor, stack: str, label_prefix: str,
                    gpu_node_labels: Mapping[str, str] | None = None, topology: str | None = None) -> Manifest:
    """`gpu_node_labels`: labels every GPU flavor's nodes must also carry (the burn-in's gpu-health=passed): Kueue
    adds a flavor's nodeLabels to the nodeSelector of the pods it admits on it, and topology-aware scheduling counts
    only nodes that carry them. `topology`: the Kueue Topology the flavor's nodes are placed by (infra/topology.py)."""
    spec: dict[str, Any] = {}
    gated = dict(gpu_node_labels or {}) if flavor.per_gpu is not None else {}
    node_labels = {**flavor.node_labels, **gated}
    if node_labels:
        spec["nodeLabels"] = node_labels
    if flavor.taints:
        # Kueue gives this flavor only to workloads that tolerate every one of these taints, so a CPU Job is never
        # admitted against GPU quota.
        spec["nodeTaints"] = [{"key": key, "value": value, "effect": effect} for key, value, effect in flavor.taints]
    if topology is not None:
        spec["topologyName"] = topology
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
                   namespace: str, weight: int | None = None, reserved: bool = False,
                   checked_flavors: Sequence[str] = ()) -> Manifest:
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
    if checked_flavors:
        # The topology flavors' gangs get their nodes through a ProvisioningRequest before Kueue places them.
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": PROVISIONING_CHECK,
                                                                "onFlavors": list(checked_flavors)}]}
    if weight is not None:
        spec["fairSharing"] = {"weight": weight}
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _metadata(name, stack, label_prefix),
            "spec": spec}


def _local_queue(name: str, cluster_queue: str, namespace: str, stack: str, label_prefix: str) -> Manifest:
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": _metadata(name, stack, label_prefix, namespace), "spec": {"clusterQueue": cluster_queue}}


def queue_manifests(cfg: KueueConfig, plans: Sequence[PoolPlan], namespace: str, stack: str,
                    label_prefix: str, gpu_node_labels: Mapping[str, str] | None = None) -> list[Manifest]:
    """Every Kueue object of the stack: topologies and the provisioning check (when used), flavors, priority
    classes, ClusterQueues, LocalQueues (in that order)."""
    all_flavors = flavors(plans, label_prefix)
    topologies = gpu_topologies(cfg, plans)
    manifests = topology_manifests(cfg, plans, stack, label_prefix)
    for flavor in all_flavors:
        depth = topologies.get(flavor.gpu_type or "") if flavor.per_gpu is not None else None
        manifests.append(flavor_manifest(flavor, stack, label_prefix, gpu_node_labels,
                                         topology_name(depth) if depth is not None else None))
    checked = ([flavor.name for flavor in all_flavors if flavor.per_gpu is not None and flavor.gpu_type in topologies]
               if provisioning_on(cfg, plans) else [])
    for priority in cfg.priority_classes:
        manifests.append({"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass",
                          "metadata": _metadata(priority.name, stack, label_prefix), "value": priority.value,
                          **({"description": priority.description} if priority.description else {})})
    reserved = any(flavor.reservation is not None for flavor in all_flavors)
    shared = [_flavor_quotas(flavor.name, shared_quota(flavor, cfg), None, None) for flavor in all_flavors]
    manifests.append(_cluster_queue(cfg.cluster_queue, cfg, shared, stack, label_prefix, namespace,
                                    reserved=reserved, checked_flavors=checked))
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
                                        team.namespace or namespace, team.fair_sharing_weight, reserved, checked))
    manifests.append(_local_queue(cfg.local_queue, cfg.cluster_queue, namespace, stack, label_prefix))
    for team in cfg.teams:
        manifests.append(_local_queue(team.name, team.name, team.namespace or namespace, stack, label_prefix))
    return manifests


def kueue_manifests(cfg: KueueConfig, plans: Sequence[PoolPlan], namespace: str, stack: str,
                    label_prefix: str, gpu_node_labels: Mapping[str, str] | None = None) -> list[Manifest]:
    """queue_manifests in the API version the Kueue they go to serves: the one the stack installs, or the
    cluster's own (kueue.external) at its declared version (infra/kueue_api.py)."""
    manifests = queue_manifests(cfg, plans, namespace, stack, label_prefix, gpu_node_labels)
    return manifests if cfg.external is None else served_manifests(manifests, cfg.external.version)


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


# --- what a Job renderer needs ------------------------------------------------------------------------------------


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
    timeout = cfg.wait_for_pods_ready.timeout
    return {"kueue": True, "local_queue": cfg.local_queue, "local_queues": cfg.local_queues,
            "workload_priority_classes": tuple(priority.name for priority in cfg.priority_classes),
            "gang_timeout_seconds": int(timeout[:-1]) * {"s": 1, "m": 60, "h": 3600}[timeout[-1]]}


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

    release: k8s.helm.v3.Release | None  # None: the cluster's own Kueue (kueue.external)
    resources: list[pulumi.Resource]

    def __init__(self, name: str, args: QueueingArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:Queueing", name, None, opts)
        ctx, cfg = args.ctx, args.config
        self.release = None if cfg.external is not None else k8s.helm.v3.Release(
            ctx.name("kueue", "release"), name=KUEUE_CHART, chart=KUEUE_REPO, version=cfg.chart_version,
            namespace=cfg.namespace, create_namespace=True, values=kueue_values(cfg),
            opts=pulumi.ResourceOptions(parent=self, provider=args.cluster.provider,
                                        depends_on=list(args.depends_on)))
        # Custom resources after their CRDs and the webhook that validates them (the release's, or those of the
        # cluster's own Kueue, there before `up`); on destroy they go first, and queues (whose finalizers wait for
        # their workloads) after the Jobs that depend on them.
        first: list[pulumi.Resource] = [self.release] if self.release is not None else list(args.depends_on)
        after_release = pulumi.ResourceOptions(parent=self, provider=args.cluster.provider, depends_on=first)
        self.resources = []
        self.local_queues: dict[str, pulumi.Resource] = {}
        flavor_resources: list[pulumi.Resource] = []
        cluster_queues: dict[str, pulumi.Resource] = {}
        named: dict[tuple[str, str], pulumi.Resource] = {}  # Topologies, the provisioning check and its parameters
        for manifest in args.manifests:
            kind, name = manifest["kind"], manifest["metadata"]["name"]
            spec = manifest.get("spec", {})
            # A ClusterQueue needs its flavors (and its admission check), a LocalQueue its ClusterQueue (and nothing
            # else, so adding a team changes no other queue's dependencies), a flavor or a check what it names.
            checks = [named[("AdmissionCheck", rule["name"])]
                      for rule in spec.get("admissionChecksStrategy", {}).get("admissionChecks", [])]
            needs = {"ClusterQueue": [*flavor_resources, *checks],
                     "ResourceFlavor": [named[("Topology", spec["topologyName"])]] if "topologyName" in spec else [],
                     "AdmissionCheck": [named[("ProvisioningRequestConfig", spec["parameters"]["name"])]]
                     if kind == "AdmissionCheck" else [],
                     "LocalQueue": [cluster_queues[spec.get("clusterQueue", "")]]
                     if kind == "LocalQueue" else []}.get(kind, [])
            # A LocalQueue's clusterQueue is immutable (CRD rule `self == oldSelf`): pointing it elsewhere replaces it.
            replace = ["spec.clusterQueue"] if kind == "LocalQueue" else None
            resource = KubernetesObject(
                ctx.name("kueue", f"{_kebab(kind)}-{name}"), manifest,
                after_release.merge(pulumi.ResourceOptions(depends_on=[*first, *needs],
                                                           replace_on_changes=replace,
                                                           delete_before_replace=kind == "LocalQueue")))
            if kind in ("Topology", "ProvisioningRequestConfig", "AdmissionCheck"):
                named[(kind, name)] = resource
            elif kind == "ResourceFlavor":
                flavor_resources.append(resource)
            elif kind == "ClusterQueue":
                cluster_queues[name] = resource
            elif kind == "LocalQueue":
                self.local_queues[name] = resource
            self.resources.append(resource)
        self.register_outputs({"release": self.release.status if self.release is not None else "external",
                               "localQueues": [m["metadata"]["name"] for m in args.manifests
                                               if m["kind"] == "LocalQueue"]})


def _kebab(kind: str) -> str:
    out = "".join(f"-{ch.lower()}" if ch.isupper() else ch for ch in kind).lstrip("-")
    return {"resource-flavor": "flavor", "workload-priority-class": "priority", "cluster-queue": "cq",
            "local-queue": "lq", "provisioning-request-config": "prconfig"}.get(out, out)
