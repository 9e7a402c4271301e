"""Kueue's topology-aware scheduling (TAS) on the EKS network topology labels.

EKS labels a node of a type that EC2 reports a topology for with `topology.k8s.aws/network-node-layer-1..N`, top
of the network hierarchy first, the bottom layer (the most selective: nodes sharing it are physically closest) last
(EKS User Guide, "Place distributed AI/ML workloads with network topology labels"). N is 3 or 4 by instance type
(EC2 User Guide, "Prerequisites for Amazon EC2 topology", instance types). A Kueue `Topology` per depth lists those
labels and `kubernetes.io/hostname`; a GPU flavor names it when every pool of its GPU type is an EFA pool (one AZ,
a cluster placement group: the pools multi-node gangs run on) of types of that depth. Other pools, onprem and
non-EFA, keep their flavors as they were.

Why ProvisioningRequests come with it (kubernetes-sigs/kueue v0.19.2, read, not run): TAS computes a placement
from the nodes it has cached, and only Ready, schedulable nodes are cached (pkg/cache/scheduler/tas_nodes_cache.go
:57-66; the SchedulerLibraryIntegration gate that changes this is alpha and off, pkg/features/kube_features.go
:927-929) that carry the flavor's node labels and every level label (pkg/util/tas/node.go:21-33, used at
pkg/cache/scheduler/tas_flavor.go:199). With no such node there is no domain ("no topology domains at level",
tas_flavor_snapshot.go:1340-1343), the assignment fails, the workload gets no quota (pkg/scheduler/flavorassigner/
flavorassigner.go:860-890) and its Job stays suspended: no pending pod ever asks cluster-autoscaler for a node. That
holds for preferred and unconstrained requests as much as for required ones. With a ProvisioningRequest admission
check on the flavor, Kueue reserves the quota first and delays the topology (tas_flavorassigner.go:104-108), the
check's ProvisioningRequest makes the autoscaler add the nodes, and the topology is assigned in a second pass once
they are Ready (pkg/workload/workload.go:940-952, retried at 1 s doubling to 30 s, pkg/cache/queue/
second_pass_queue.go:31-33). So a topology flavor whose pools can grow is refused without ProvisioningRequests.

Everything here is pure (manifests as dicts); infra/queueing.py registers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.config.queueing import PROVISIONING_CHECK, KueueConfig
from infra.nodes.poolplan import PoolPlan
from workloads.cluster_facts import TopologyFacts

Manifest = dict[str, Any]
API_VERSION = "kueue.x-k8s.io/v1beta2"  # Topology, AdmissionCheck and ProvisioningRequestConfig: served, storage
NETWORK_LAYER = "topology.k8s.aws/network-node-layer-"
HOSTNAME_LABEL = "kubernetes.io/hostname"
GPU_RESOURCE = "nvidia.com/gpu"
# Kueue's built-in ProvisioningRequest admission check controller (apis/kueue/v1beta2/provisioningrequestconfig_types.go
# :29); the stack's check and its parameters are named PROVISIONING_CHECK (infra/config/queueing.py).
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"

# How many network nodes EC2 returns for an instance type (EC2 User Guide, "Prerequisites for Amazon EC2 topology":
# "Returns 3 network nodes" / "Returns 4 network nodes"); EKS labels one layer per node.
_FOUR_LAYERS = frozenset({"p6-b200.48xlarge", "p6-b300.48xlarge"})
_THREE_LAYER_FAMILIES = frozenset({"g6e", "g7e", "hpc6a", "hpc6id", "hpc7a", "hpc7g", "hpc8a", "p3dn", "p4d", "p4de",
                                   "p5", "p5e", "p5en", "p6e-gb200", "trn1", "trn1n", "trn2", "trn2u"})


def layer_depth(instance_type: str) -> int | None:
    """The EC2 topology depth of an instance type (3 or 4), None when EC2 reports no topology for it."""
    if instance_type in _FOUR_LAYERS:
        return 4
    return 3 if instance_type.split(".", 1)[0] in _THREE_LAYER_FAMILIES else None


def topology_name(depth: int) -> str:
    return f"eks-network-{depth}-layers"


def topology_levels(depth: int) -> tuple[str, ...]:
    """The Topology's node labels, top to bottom; the hostname last (Kueue allows it only there)."""
    return (*(f"{NETWORK_LAYER}{layer}" for layer in range(1, depth + 1)), HOSTNAME_LABEL)


def pool_depth(plan: PoolPlan) -> int | None:
    """An EFA GPU pool on EKS whose types all have the same EC2 topology depth: that depth; else None."""
    if not (plan.is_gpu and plan.efa_interfaces and plan.ami_type is not None):
        return None
    depths = {layer_depth(instance_type) for instance_type in plan.config.instance_types}
    return depths.pop() if len(depths) == 1 else None


def gpu_topologies(cfg: KueueConfig, plans: Sequence[PoolPlan]) -> dict[str, int]:
    """GPU type -> topology depth, for the GPU types whose every pool (reserved ones too) is a topology pool of one
    depth. Empty unless Kueue and its topology are on."""
    if not (cfg.enabled and cfg.topology.enabled):
        return {}
    by_type: dict[str, set[int | None]] = {}
    for plan in plans:
        if plan.is_gpu and plan.gpu_type:
            by_type.setdefault(plan.gpu_type, set()).add(pool_depth(plan))
    return {gpu_type: depth for gpu_type, depths in sorted(by_type.items())
            if len(depths) == 1 and (depth := next(iter(depths))) is not None}


def _grows(plan: PoolPlan) -> bool:
    return plan.config.existing is None and plan.config.min_size < plan.config.max_size


def topology_problems(cfg: KueueConfig, plans: Sequence[PoolPlan]) -> list[tuple[str, str]]:
    """What Kueue would accept but never run: a topology flavor on pools that grow, without ProvisioningRequests.
    A GPU type with a pool that is not a topology pool (a non-EFA Capacity Block beside an EFA pool, say) keeps
    its flavors without a topology: its pods could not use both kinds."""
    if not (cfg.enabled and cfg.topology.enabled):
        return []
    topologies = gpu_topologies(cfg, plans)
    if not any(pool_depth(plan) for plan in plans):
        return [("kueue.topology.enabled", "no GPU pool is an EFA pool of an instance type EC2 reports a topology "
                 "for (EC2 User Guide, 'Prerequisites for Amazon EC2 topology'): nothing would use the Topology")]
    problems = []
    if not cfg.topology.provisioning:
        for plan in plans:
            if plan.gpu_type in topologies and _grows(plan):
                problems.append((
                    "kueue.topology.provisioning",
                    f"false, but pool {plan.name} ({plan.gpu_type}) scales from "
                    f"minSize {plan.config.min_size} to maxSize {plan.config.max_size}: Kueue places a topology "
                    "request only on nodes that are Ready, so a gang larger than the running nodes would never be "
                    "admitted and never scale the pool up (turn provisioning on, or set minSize to maxSize)"))
    return problems


def provisioning_on(cfg: KueueConfig, plans: Sequence[PoolPlan]) -> bool:
    """Whether the stack runs ProvisioningRequests: topology flavors exist and provisioning is on."""
    return bool(gpu_topologies(cfg, plans)) and cfg.topology.provisioning


def topology_facts(cfg: KueueConfig, plans: Sequence[PoolPlan]) -> dict[str, TopologyFacts] | None:
    """What a Job renderer needs: per topology GPU type, the levels and whether its pools keep all their nodes."""
    topologies = gpu_topologies(cfg, plans)
    if not topologies:
        return None
    return {gpu_type: TopologyFacts(levels=topology_levels(depth),
                                    fixed_size=not any(_grows(plan) for plan in plans if plan.gpu_type == gpu_type))
            for gpu_type, depth in topologies.items()}


def _metadata(name: str, stack: str, label_prefix: str) -> Manifest:
    return {"name": name, "labels": {
        "app.kubernetes.io/part-of": "ml-cluster", "app.kubernetes.io/managed-by": "pulumi",
        "app.kubernetes.io/component": "queueing", f"{label_prefix}/stack": stack}}


def topology_manifests(cfg: KueueConfig, plans: Sequence[PoolPlan], stack: str, label_prefix: str) -> list[Manifest]:
    """The Topology objects (one per depth in use), then the ProvisioningRequestConfig and its AdmissionCheck."""
    topologies = gpu_topologies(cfg, plans)
    manifests: list[Manifest] = [
        {"apiVersion": API_VERSION, "kind": "Topology",
         "metadata": _metadata(topology_name(depth), stack, label_prefix),
         "spec": {"levels": [{"nodeLabel": label} for label in topology_levels(depth)]}}
        for depth in sorted(set(topologies.values()))]
    if manifests and cfg.topology.provisioning:
        retry = cfg.topology.retry
        manifests.append({
            "apiVersion": API_VERSION, "kind": "ProvisioningRequestConfig",
            "metadata": _metadata(PROVISIONING_CHECK, stack, label_prefix),
            "spec": {"provisioningClassName": cfg.topology.provisioning_class, "managedResources": [GPU_RESOURCE],
                     "retryStrategy": {"backoffLimitCount": retry.backoff_limit_count,
                                       "backoffBaseSeconds": retry.backoff_base_seconds,
                                       "backoffMaxSeconds": retry.backoff_max_seconds}}})
        manifests.append({
            "apiVersion": API_VERSION, "kind": "AdmissionCheck",
            "metadata": _metadata(PROVISIONING_CHECK, stack, label_prefix),
            "spec": {"controllerName": PROVISIONING_CONTROLLER,
                     "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "ProvisioningRequestConfig",
                                    "name": PROVISIONING_CHECK}}})
    return manifests
