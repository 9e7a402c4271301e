"""EFA from the pool config to the Job: the launch template's interfaces, one AZ and a cluster placement group, the
node security group open to itself both ways, the EFA device plugin, and every multi-node Job on an EFA pool asking
for its interfaces, hugepages and the libfabric/NCCL environment."""

from __future__ import annotations

import email
import tomllib
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from infra.config.schema import ConfigError
from infra.nodes.nodepools import efa_network_interfaces, user_data
from infra.nodes.poolplan import EFA_NODE_HUGEPAGES, plan_node_pools
from tests.nodepools.helpers import FIXTURES, eks_config, fixture_lookup, gpu_pool
from workloads.cluster_facts import ClusterFacts, PoolFacts
from workloads.jobspec import TrainingJobSpec, render_job
from workloads.jobspec.fields import JobSpecError

PREFIX = "ml-cluster.io"
IMAGE = "registry.example.com/train:1.0"


def by_name(plan: dict[str, Any], token: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in plan["resources"] if r["type"] == token}


def test_p5_pools_get_32_interfaces_a_placement_group_one_subnet_and_both_self_rules(stack_plan: Any) -> None:
    plan = stack_plan("prod")
    template = by_name(plan, "aws:ec2/launchTemplate:LaunchTemplate")["mlc-prod-nodepools-gpu-h100-lt"]["inputs"]
    interfaces = template["networkInterfaces"]
    assert [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in interfaces] == \
        [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, 32)]
    assert "vpcSecurityGroupIds" not in template  # the groups are on the interfaces
    [group] = by_name(plan, "aws:ec2/placementGroup:PlacementGroup").values()
    assert group["inputs"] == {"name": "mlc-prod-gpu-h100", "strategy": "cluster",
                               "tags": group["inputs"]["tags"]}
    assert template["placement"] == {"groupName": "mlc-prod-gpu-h100"}
    node_group = by_name(plan, "aws:eks/nodeGroup:NodeGroup")["mlc-prod-nodepools-gpu-h100-ng"]["inputs"]
    assert len(node_group["subnetIds"]) == 1 and node_group["labels"][f"{PREFIX}/efa"] == "true"
    other = by_name(plan, "aws:eks/nodeGroup:NodeGroup")["mlc-prod-nodepools-gpu-a100-ng"]["inputs"]
    assert len(other["subnetIds"]) > 1 and f"{PREFIX}/efa" not in other["labels"]
    ingress = by_name(plan, "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")[
        "mlc-prod-cluster-node-from-node"]
    egress = by_name(plan, "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")[
        "mlc-prod-cluster-node-to-node"]
    for rule in (ingress, egress):
        assert rule["inputs"]["referencedSecurityGroupId"] == rule["inputs"]["securityGroupId"]
        assert rule["inputs"]["ipProtocol"] == "-1"


def test_the_efa_device_plugin_runs_on_efa_pools_only_and_scale_from_zero_knows_the_interfaces(
        stack_plan: Any) -> None:
    plan = stack_plan("prod")
    releases = {r["inputs"]["chart"]: r["inputs"] for r in plan["resources"]
                if r["type"] == "kubernetes:helm.sh/v3:Release"}
    efa = releases["aws-efa-k8s-device-plugin"]
    assert efa["repositoryOpts"]["repo"] == "https://aws.github.io/eks-charts" and efa["version"] == "v0.5.30"
    assert efa["values"]["nodeSelector"] == {f"{PREFIX}/efa": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in efa["values"]["tolerations"]
    assert "aws-efa-k8s-device-plugin" not in {r["inputs"]["chart"] for r in stack_plan("dev")["resources"]
                                               if r["type"] == "kubernetes:helm.sh/v3:Release"}
    tags = {r["inputs"]["tag"]["key"]: r["inputs"]["tag"]["value"] for r in plan["resources"]
            if r["type"] == "aws:autoscaling/tag:Tag" and "gpu-h100" in r["name"]}
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "32"
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/hugepages-2Mi"] == "5120Mi"


def test_efa_nodes_preallocate_hugepages_and_lose_them_from_allocatable_memory() -> None:
    efa, plain = plan_node_pools(eks_config([gpu_pool("efa", ["p5.48xlarge"], efa=True),
                                             gpu_pool("plain", ["p5.48xlarge"])]), fixture_lookup)
    assert efa.efa_interfaces == 32 and plain.efa_interfaces == 0
    assert f"vm.nr_hugepages={EFA_NODE_HUGEPAGES}" in (user_data(efa) or "")
    assert "nr_hugepages" not in (user_data(plain) or "")
    assert plain.allocatable_memory_bytes - efa.allocatable_memory_bytes == EFA_NODE_HUGEPAGES * 2 * 2**20
    [bottlerocket] = plan_node_pools(eks_config([gpu_pool("br", ["p5.48xlarge"], efa=True,
                                                          amiFamily="bottlerocket")]), fixture_lookup)
    assert f'"vm.nr_hugepages" = "{EFA_NODE_HUGEPAGES}"' in (user_data(bottlerocket) or "")


def test_efa_nodes_give_containers_an_unlimited_locked_memory_limit() -> None:
    """libfabric registers memory on EFA: AL2023 EFA pools restate the AMI's containerd rlimits with RLIMIT_MEMLOCK
    unlimited (a NodeConfig part nodeadm merges), Bottlerocket EFA pools set max-locked-memory; other pools keep the
    AMI's defaults."""
    efa, plain = plan_node_pools(eks_config([gpu_pool("efa", ["p5.48xlarge"], efa=True),
                                             gpu_pool("plain", ["p5.48xlarge"])]), fixture_lookup)
    message = email.message_from_string(user_data(efa) or "")
    documents = [yaml.safe_load(part.get_payload(decode=True)) for part in message.walk()
                 if part.get_content_type() == "application/node.eks.aws"]
    rlimits = [d["spec"]["containerd"]["baseRuntimeSpec"]["process"]["rlimits"] for d in documents
               if "containerd" in d["spec"]]
    assert rlimits == [[{"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576},
                        {"type": "RLIMIT_MEMLOCK", "soft": 2**64 - 1, "hard": 2**64 - 1}]]
    assert "RLIMIT_MEMLOCK" not in (user_data(plain) or "")
    [bottlerocket] = plan_node_pools(eks_config([gpu_pool("br", ["p5.48xlarge"], efa=True,
                                                          amiFamily="bottlerocket")]), fixture_lookup)
    settings_toml = tomllib.loads(user_data(bottlerocket) or "")
    assert settings_toml["settings"]["oci-defaults"]["resource-limits"]["max-locked-memory"] == {
        "soft-limit": "unlimited", "hard-limit": "unlimited"}


@pytest.mark.parametrize(("types", "interfaces"), [(["p4d.24xlarge"], 4), (["p5en.48xlarge"], 16),
                                                   (["g6e.48xlarge"], 4), (["g5.48xlarge"], 1),
                                                   (["p6-b200.48xlarge"], 8), (["p6-b300.48xlarge"], 16)])
def test_an_ena_primary_and_one_efa_only_interface_per_efa_card(types: list[str], interfaces: int) -> None:
    """AWS's layout (EC2 User Guide, efa-acc-inst-types): ENA at card 0 device 0; EFA-only at card 0 device 1 where
    card 0 has EFA, at device 0 on every other EFA card; each card used once per device index."""
    [plan] = plan_node_pools(eks_config([gpu_pool("efa", types, efa=True)]), fixture_lookup)
    layout = efa_network_interfaces(plan)
    efa = [i for i in layout if i["interface_type"] == "efa-only"]
    assert len(efa) == interfaces == FIXTURES[types[0]]["efaMaximumInterfaces"]
    assert layout[0] == {"network_card_index": 0, "device_index": 0, "interface_type": "interface",
                         "delete_on_termination": "true"}
    slots = [(i["network_card_index"], i["device_index"]) for i in layout]
    assert len(set(slots)) == len(slots) and {card for card, _ in slots} <= set(plan.network_cards)
    assert all(i["device_index"] == (1 if i["network_card_index"] == 0 else 0) for i in efa)
    card0_efa = any(i["network_card_index"] == 0 for i in efa)
    # p6-b300 has 17 cards for 16 EFA interfaces: card 0 stays ENA only
    assert card0_efa == (len(plan.network_cards) == interfaces)


@pytest.mark.parametrize(("pool", "path", "why"), [
    (gpu_pool("efa", ["g5.xlarge"], efa=True), "nodePools[0].efa", "pool efa has efa: true but g5.xlarge has no EFA"),
    (gpu_pool("efa", ["p4d.24xlarge", "p5.48xlarge"], efa=True), "nodePools[0].instanceTypes", "mixes"),
    (gpu_pool("efa", ["p5.48xlarge"], efa=True, availabilityZones=["us-west-2a", "us-west-2b"]), "nodePools[0]",
     "an EFA pool lives in one availability zone"),
])
def test_bad_efa_pools_are_one_line_config_errors(pool: dict[str, Any], path: str, why: str) -> None:
    with pytest.raises((ConfigError, ValidationError)) as caught:
        plan_node_pools(eks_config([pool]), fixture_lookup)
    text = str(caught.value)
    assert why in text and "efa" in text


EFA_TYPES = sorted(name for name, facts in FIXTURES.items() if facts.get("efaSupported"))
GPU_TYPES = sorted(name for name, facts in FIXTURES.items() if facts.get("gpuses"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(types=st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=3, unique=True),
       zones=st.lists(st.sampled_from(["us-west-2a", "us-west-2b", "us-west-2c"]), max_size=3, unique=True))
def test_no_efa_pool_ever_plans_with_two_zones_or_a_type_without_efa(types: list[str], zones: list[str]) -> None:
    pool = gpu_pool("efa", types, efa=True, availabilityZones=zones)
    try:
        [plan] = plan_node_pools(eks_config([pool]), fixture_lookup)
    except (ConfigError, ValidationError, ValueError):
        return
    assert len(zones) <= 1 and all(t in EFA_TYPES for t in types)
    assert plan.efa_interfaces == FIXTURES[types[0]]["efaMaximumInterfaces"]


def _facts(*pools: PoolFacts) -> ClusterFacts:
    return ClusterFacts(stack="t", label_prefix=PREFIX, pools=pools)


H100_EFA = PoolFacts(name="h100", gpu_type="h100", gpus_per_node=8, nvme_gib=28000, cpu_per_gpu_millicores=23000,
                     memory_per_gpu_bytes=230 * 2**30, efa_interfaces=32)


def _train(job: list[dict[str, Any]]) -> dict[str, Any]:
    [manifest] = [m for m in job if m["kind"] == "Job"]
    [train] = [c for c in manifest["spec"]["template"]["spec"]["containers"] if c["name"] == "train"]
    return {"job": manifest, "train": train}


def test_a_multi_node_job_on_an_efa_pool_asks_for_every_interface_and_sets_libfabric() -> None:
    spec = TrainingJobSpec.model_validate({"name": "ddp", "nodes": 2, "gpus": 8, "image": IMAGE,
                                            "env": {"FI_EFA_FORK_SAFE": "0"}})
    rendered = _train(render_job(spec, _facts(H100_EFA)))
    limits = rendered["train"]["resources"]["limits"]
    assert limits["vpc.amazonaws.com/efa"] == "32" and limits["hugepages-2Mi"] == "5120Mi"
    assert rendered["train"]["resources"]["requests"] == limits  # hugepages need requests == limits
    env = [(e["name"], e.get("value")) for e in rendered["train"]["env"]]
    assert ("FI_PROVIDER", "efa") in env and ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1") in env
    assert [value for name, value in env if name == "FI_EFA_FORK_SAFE"] == ["0"]  # the spec's own value wins
    assert rendered["job"]["spec"]["template"]["spec"]["nodeSelector"][f"{PREFIX}/efa"] == "true"
    one_node = TrainingJobSpec.model_validate({"name": "one", "gpus": 8, "image": IMAGE})
    single = _train(render_job(one_node, _facts(H100_EFA)))
    assert "vpc.amazonaws.com/efa" not in single["train"]["resources"]["limits"]


def test_a_gang_prefers_efa_pools_and_refuses_mixed_efa_layouts() -> None:
    tcp = PoolFacts(name="h100-tcp", gpu_type="h100", gpus_per_node=8, nvme_gib=28000,
                    cpu_per_gpu_millicores=23000, memory_per_gpu_bytes=230 * 2**30)
    spec = TrainingJobSpec.model_validate({"name": "ddp", "nodes": 2, "gpus": 8, "image": IMAGE})
    rendered = _train(render_job(spec, _facts(tcp, H100_EFA)))
    assert rendered["train"]["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
    tcp_only = _train(render_job(spec, _facts(tcp)))
    assert "vpc.amazonaws.com/efa" not in tcp_only["train"]["resources"]["limits"]
    assert ("FI_PROVIDER", "efa") not in [(e["name"], e.get("value")) for e in tcp_only["train"]["env"]]
    p4d_like = PoolFacts(name="h100-4", gpu_type="h100", gpus_per_node=8, nvme_gib=28000,
                         cpu_per_gpu_millicores=23000, memory_per_gpu_bytes=230 * 2**30, efa_interfaces=4)
    with pytest.raises(JobSpecError, match="different EFA layouts"):
        render_job(spec, _facts(H100_EFA, p4d_like))


def test_every_multi_node_job_of_every_stack_on_an_efa_pool_carries_efa(stack_plan: Any) -> None:
    checked = 0
    for stack in ("dev", "staging", "prod"):
        plan = stack_plan(stack)
        efa_types = {r["inputs"]["labels"][f"{PREFIX}/gpu-type"] for r in plan["resources"]
                     if r["type"] == "aws:eks/nodeGroup:NodeGroup" and r["inputs"]["labels"].get(f"{PREFIX}/efa")}
        for job in (r["inputs"] for r in plan["resources"] if r["type"] == "kubernetes:batch/v1:Job"):
            pod = job["spec"]["template"]["spec"]
            if (job["spec"].get("parallelism") or 1) < 2 or pod["nodeSelector"].get(f"{PREFIX}/gpu-type") \
                    not in efa_types:
                continue
            [train] = [c for c in pod["containers"] if c["name"] == "train"]
            assert int(train["resources"]["limits"]["vpc.amazonaws.com/efa"]) > 0
            assert {"name": "FI_PROVIDER", "value": "efa"} in train["env"]
            checked += 1
    assert checked >= 1  # prod's resnet50-ddp on p5.48xlarge
