"""Kueue topology-aware scheduling on the EKS network layers: a Topology per layer depth for the GPU types whose pools
are all EFA pools of a type EC2 reports a topology for, the flavors naming it, the ProvisioningRequest check that
lets a gang on pools at size 0 be admitted at all, and the podset annotation every pod bound for such a flavor
carries. The custom resources are checked strictly against the CRDs of the pinned Kueue chart."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import pytest

from infra.config.queueing import KueueConfig
from infra.nodes.poolplan import plan_node_pools
from infra.queueing import kueue_values, queue_manifests
from infra.topology import topology_facts, topology_problems
from tests.jobs.facts import prod_facts
from tests.monitoring.crds import UPSTREAM, render_charts
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool
from workloads.cluster_facts import TopologyFacts
from workloads.jobspec import JobSpecError, parse_spec, render_job

PREFIX = "ml-cluster.io"
IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/ml-cluster-train:0.1.0"
LAYERS_3 = ("topology.k8s.aws/network-node-layer-1", "topology.k8s.aws/network-node-layer-2",
            "topology.k8s.aws/network-node-layer-3", "kubernetes.io/hostname")
ON = {"enabled": True, "topology": {"enabled": True}}


@functools.cache
def kueue_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """The served schemas of the CRDs the pinned Kueue chart renders (its CRDs are templates)."""
    cfg = KueueConfig()
    release = {"inputs": {"chart": "kueue", "version": cfg.chart_version, "namespace": cfg.namespace,
                          "values": kueue_values(cfg)}}
    return {key: schema for manifest in render_charts().rendered_objects(release, UPSTREAM)
            if manifest["kind"] == "CustomResourceDefinition"
            for key, schema in render_charts().crd_schemas(manifest).items()}


def pools(h100: dict[str, Any] | None = None, extra: list[dict[str, Any]] | None = None) -> Any:
    """system, an EFA p5 pool (the prod shape, 0..16) and a p4d pool without EFA."""
    return plan_node_pools(eks_config([
        {"name": "system", "instanceTypes": ["m6i.large"]},
        gpu_pool("gpu-h100", ["p5.48xlarge"], maxSize=16, efa=True, availabilityZones=["us-west-2a"], **(h100 or {})),
        gpu_pool("gpu-a100", ["p4d.24xlarge"], maxSize=8),
        *(extra or []),
    ]), fixture_lookup)


def by_kind(manifests: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def test_efa_pools_get_the_eks_layers_and_everything_validates_against_the_kueue_crds() -> None:
    cfg = KueueConfig.model_validate({**ON, "teams": [{"name": "vision", "quotas": [{"flavor": "h100", "gpus": 8}]}]})
    manifests = queue_manifests(cfg, pools(), "training", "prod", PREFIX, {f"{PREFIX}/gpu-health": "passed"})
    [topology] = by_kind(manifests, "Topology").values()
    assert topology["metadata"]["name"] == "eks-network-3-layers"
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]] == list(LAYERS_3)
    flavors = by_kind(manifests, "ResourceFlavor")
    assert flavors["h100"]["spec"]["topologyName"] == "eks-network-3-layers"
    assert "topologyName" not in flavors["a100"]["spec"]  # no EFA: today's flavor
    assert "topologyName" not in flavors["cpu"]["spec"]
    [config] = by_kind(manifests, "ProvisioningRequestConfig").values()
    assert config["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    [check] = by_kind(manifests, "AdmissionCheck").values()
    assert check["spec"]["parameters"]["name"] == config["metadata"]["name"]
    for queue in by_kind(manifests, "ClusterQueue").values():  # the shared queue and the team's
        assert queue["spec"]["admissionChecksStrategy"] == {
            "admissionChecks": [{"name": check["metadata"]["name"], "onFlavors": ["h100"]}]}
    plan = {"resources": [{"type": f"kubernetes:{m['apiVersion']}:{m['kind']}", "name": m["metadata"]["name"],
                           "inputs": m} for m in manifests]}
    assert render_charts().custom_resource_problems(plan, kueue_crds()) == (len(manifests), [])
    # and the check does see a wrong field of the new kinds
    bad = {**topology, "spec": {"levels": [{"label": "x"}]}}
    assert render_charts().validate_custom(bad, kueue_crds())


def test_four_layer_types_get_their_own_topology_and_off_means_nothing_changes() -> None:
    b300 = pools(extra=[gpu_pool("gpu-b300", ["p6-b300.48xlarge"], maxSize=2, efa=True,
                                 availabilityZones=["us-west-2a"])])
    manifests = queue_manifests(KueueConfig.model_validate(ON), b300, "training", "prod", PREFIX)
    topologies = by_kind(manifests, "Topology")
    assert sorted(topologies) == ["eks-network-3-layers", "eks-network-4-layers"]
    assert topologies["eks-network-4-layers"]["spec"]["levels"][3] == {
        "nodeLabel": "topology.k8s.aws/network-node-layer-4"}
    assert by_kind(manifests, "ResourceFlavor")["b300"]["spec"]["topologyName"] == "eks-network-4-layers"
    # kueue.topology off: the same pools give exactly the manifests they gave before
    off = queue_manifests(KueueConfig.model_validate({"enabled": True}), b300, "training", "prod", PREFIX)
    assert {m["kind"] for m in off} == {"ResourceFlavor", "ClusterQueue", "LocalQueue"}
    assert not any("topologyName" in m.get("spec", {}) or "admissionChecksStrategy" in m.get("spec", {})
                   for m in off)


def test_a_topology_on_pools_that_scale_needs_provisioning_requests() -> None:
    no_provisioning = KueueConfig.model_validate({"enabled": True, "topology": {"enabled": True,
                                                                                "provisioning": False}})
    [(where, problem)] = topology_problems(no_provisioning, pools())
    assert where == "kueue.topology.provisioning"
    assert "pool gpu-h100 (h100) scales from minSize 0 to maxSize 16" in problem
    assert "never be admitted" in problem
    fixed = pools({"minSize": 16, "desiredSize": 16})
    assert topology_problems(no_provisioning, fixed) == []
    manifests = queue_manifests(no_provisioning, fixed, "training", "prod", PREFIX)
    assert not by_kind(manifests, "AdmissionCheck") and by_kind(manifests, "Topology")
    [(_, nothing)] = topology_problems(KueueConfig.model_validate(ON), plan_node_pools(eks_config([
        {"name": "system", "instanceTypes": ["m6i.large"]}, gpu_pool("gpu-a10g", ["g5.xlarge"])]), fixture_lookup))
    assert "nothing would use the Topology" in nothing
    # an H100 Capacity Block without EFA beside the EFA pool: the type keeps flavors without a topology
    mixed = pools(extra=[gpu_pool("h100-block", ["p5.48xlarge"], maxSize=2)])
    assert topology_problems(KueueConfig.model_validate(ON), mixed) == []
    assert topology_facts(KueueConfig.model_validate(ON), mixed) is None


def facts(fixed_size: bool = False) -> Any:
    return replace(prod_facts(), kueue=True, local_queue="training", local_queues=("training",),
                   topology={"h100": TopologyFacts(levels=LAYERS_3, fixed_size=fixed_size)})


def template_annotations(spec: dict[str, Any], cluster: Any = None) -> dict[str, str]:
    [job, *_] = render_job(parse_spec({"image": IMAGE, "name": "gang", "gpus": 8, "gpuType": "h100", **spec}),
                           cluster if cluster is not None else facts())
    return job["spec"]["template"]["metadata"]["annotations"]


def test_gangs_ask_for_the_bottom_layer_and_required_only_where_the_nodes_exist() -> None:
    preferred = "kueue.x-k8s.io/podset-preferred-topology"
    required = "kueue.x-k8s.io/podset-required-topology"
    assert template_annotations({"nodes": 2})[preferred] == "topology.k8s.aws/network-node-layer-3"
    assert template_annotations({})[preferred] == "topology.k8s.aws/network-node-layer-3"  # single node: admissible
    assert template_annotations({"nodes": 2, "topology": {"level": "layer-2"}})[preferred] == (
        "topology.k8s.aws/network-node-layer-2")
    with pytest.raises(JobSpecError, match=r"^topology.mode: required needs nodes that exist"):
        template_annotations({"nodes": 2, "topology": {"mode": "required"}})
    fixed = template_annotations({"nodes": 2, "topology": {"mode": "required", "level": "hostname"}}, facts(True))
    assert fixed == {**fixed, required: "kubernetes.io/hostname"} and preferred not in fixed
    with pytest.raises(JobSpecError, match=r"^topology.level: layer-4 is not a level"):
        template_annotations({"nodes": 2, "topology": {"level": "layer-4"}})
    # the A100 type has no Topology: no annotation, and asking for one is refused
    assert not any("topology" in key for key in template_annotations({"gpuType": "a100"}))
    with pytest.raises(JobSpecError, match=r"^topology: stack prod has no Kueue Topology for a100"):
        template_annotations({"gpuType": "a100", "topology": {"mode": "preferred"}})


def test_topology_facts_follow_the_pools() -> None:
    assert topology_facts(KueueConfig.model_validate(ON), pools()) == {
        "h100": TopologyFacts(levels=LAYERS_3, fixed_size=False)}
    assert topology_facts(KueueConfig.model_validate({"enabled": True}), pools()) is None
