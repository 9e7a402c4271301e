"""Kueue topology-aware placement of a run's pods: the podset topology annotation its pod template carries when the
pods' GPU type has a Kueue Topology (the stack's kueue.topology; infra/topology.py builds the Topology)."""

from __future__ import annotations

from workloads.cluster_facts import ClusterFacts, TopologyFacts
from workloads.jobspec.fields import JobSpecError
from workloads.jobspec.spec import TrainingJobSpec

# Kueue's podset topology annotations, read from a podset's pod template (kueue v0.19.2 apis/kueue/v1beta2/
# topology_types.go:28 and :39).
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
HOSTNAME_LABEL = "kubernetes.io/hostname"
NETWORK_LAYER = "topology.k8s.aws/network-node-"


def topology_annotations(spec: TrainingJobSpec, facts: ClusterFacts, gpu_type: str | None) -> dict[str, str]:
    """The pod template's podset topology annotation when the pods' GPU type has a Kueue Topology.

    Every pod bound for such a flavor carries one, a single-node Job too: Kueue gives a flavor with a topology only
    to podsets that ask for topology-aware scheduling unless every flavor of the queue has one (kueue v0.19.2
    pkg/scheduler/flavorassigner/tas_flavorassigner.go:197-201), and the `cpu` flavor has none. The default is
    preferred at the bottom network layer, which never keeps a gang out: it widens to the next layer up, then
    spreads."""
    topology = (facts.topology or {}).get(gpu_type or "") if spec.gpus > 0 else None
    if topology is None:
        if spec.topology is not None:
            raise JobSpecError("topology", f"stack {facts.stack} has no Kueue Topology for "
                                           f"{gpu_type or 'these pods'} (kueue.topology, EFA pools of a type EC2 "
                                           "reports a topology for)")
        return {}
    mode = spec.topology.mode if spec.topology is not None else "preferred"
    level = _level_label(spec, topology)
    if mode == "required" and not topology.fixed_size:
        raise JobSpecError("topology.mode", f"required needs nodes that exist: the {gpu_type} pools scale, and the "
                                            "autoscaler does not place new nodes by network layer, so a required "
                                            "domain may never fit (use preferred, or pools with minSize == maxSize)")
    return {REQUIRED_TOPOLOGY if mode == "required" else PREFERRED_TOPOLOGY: level}


def _level_label(spec: TrainingJobSpec, topology: TopologyFacts) -> str:
    """The node label of the spec's level (default: the bottom network layer, the level before the hostname)."""
    level = spec.topology.level if spec.topology is not None else None
    if level is None:
        return topology.levels[-2]
    wanted = HOSTNAME_LABEL if level == "hostname" else f"{NETWORK_LAYER}{level}"
    if wanted not in topology.levels:
        raise JobSpecError("topology.level", f"{level} is not a level of this GPU type's Topology "
                                             f"({', '.join(topology.levels)})")
    return wanted
