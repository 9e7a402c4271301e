"""The node-pool and GPU rules on the offline plan of every committed stack.

Expected values come from the stack files and the instance-type fixtures directly, not from the code under test.
"""

from __future__ import annotations

import base64
import email
import json
import re
import tomllib
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.nodes.scaling.autoscaler import AUTOSCALER_RELEASES
from infra.plan.engine import validate_kubernetes_objects
from tests.conftest import AWS_STACKS, resources_of, stack_values
from tests.nodepools.helpers import FIXTURES

PREFIX = "ml-cluster.io"
CAS = "k8s.io/cluster-autoscaler/node-template"
PINNED = re.compile(r"^\d+\.\d+\.\d+$")


def pools_of(stack: str) -> list[dict[str, Any]]:
    return stack_values(stack).get("ml-cluster:nodePools", [])


def ssd_gb(instance_type: str) -> int:
    return sum(d["count"] * d["size"] for d in FIXTURES[instance_type]["instanceDisks"] if d["type"] == "ssd")


def by_name(plan: dict[str, Any], token: str) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in resources_of(plan, token)}


def release(plan: dict[str, Any], chart: str) -> dict[str, Any] | None:
    found = [r for r in resources_of(plan, "kubernetes:helm.sh/v3:Release") if r["inputs"]["chart"] == chart]
    assert len(found) <= 1
    return found[0] if found else None


def autoscaler_tags(plan: dict[str, Any], stack: str, pool: str) -> dict[str, str]:
    prefix = f"mlc-{stack}-nodepools-{pool}-cas-"
    tags = [r["inputs"] for r in resources_of(plan, "aws:autoscaling/tag:Tag") if r["name"].startswith(prefix)]
    groups = {tag["autoscalingGroupName"] for tag in tags}
    assert len(groups) == 1 and f"mlc-{stack}-nodepools-{pool}-ng" in groups.pop()  # the pool's own ASG
    assert all(tag["tag"]["propagateAtLaunch"] is False for tag in tags)
    return {tag["tag"]["key"]: tag["tag"]["value"] for tag in tags}


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_pool_is_a_node_group_with_an_imdsv2_launch_template(stack: str, stack_plan: Any) -> None:
    plan = stack_plan(stack)
    groups = by_name(plan, "aws:eks/nodeGroup:NodeGroup")
    templates = by_name(plan, "aws:ec2/launchTemplate:LaunchTemplate")
    assert len(groups) == len(templates) == len(pools_of(stack))
    for pool in pools_of(stack):
        group = groups[f"mlc-{stack}-nodepools-{pool['name']}-ng"]["inputs"]
        template = templates[f"mlc-{stack}-nodepools-{pool['name']}-lt"]["inputs"]
        assert group["instanceTypes"] == pool["instanceTypes"]
        assert group["scalingConfig"]["minSize"] == pool.get("minSize", 0)
        assert group["launchTemplate"]["id"].startswith("lt-")
        assert "diskSize" not in group  # with a launch template the disk is set there
        assert template["metadataOptions"]["httpTokens"] == "required"
        assert template["metadataOptions"]["httpPutResponseHopLimit"] == 2
        # the node SG and the EKS cluster SG: on the template, or on each of an EFA pool's interfaces
        groups_of = [template.get("vpcSecurityGroupIds")] if not pool.get("efa") else \
            [interface["securityGroups"] for interface in template["networkInterfaces"]]
        assert groups_of and all(len(groups) == 2 for groups in groups_of)
        assert template["blockDeviceMappings"][0]["ebs"]["encrypted"] == "true"


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_gpu_pools_have_nvidia_ami_gpu_taint_and_gpu_labels(stack: str, stack_plan: Any) -> None:
    groups = by_name(stack_plan(stack), "aws:eks/nodeGroup:NodeGroup")
    gpu_pools = [pool for pool in pools_of(stack) if pool.get("gpu")]
    assert gpu_pools, f"{stack} declares no GPU pool"
    for pool in gpu_pools:
        group = groups[f"mlc-{stack}-nodepools-{pool['name']}-ng"]["inputs"]
        [gpu] = FIXTURES[pool["instanceTypes"][0]]["gpuses"]
        assert group["amiType"].endswith("_NVIDIA")
        assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"} in group["taints"]
        assert group["labels"][f"{PREFIX}/gpu-type"] == gpu["name"].lower()
        assert group["labels"][f"{PREFIX}/gpu-count"] == str(gpu["count"])
        bottlerocket = group["amiType"].startswith("BOTTLEROCKET")
        # the device plugin DaemonSet goes exactly where this label is (Bottlerocket runs it on the host)
        assert (group["labels"].get("nvidia.com/gpu.present") == "true") is not bottlerocket
    for pool in pools_of(stack):
        if not pool.get("gpu"):
            group = groups[f"mlc-{stack}-nodepools-{pool['name']}-ng"]["inputs"]
            assert not group["amiType"].endswith("_NVIDIA") and not group.get("taints")


def decode_user_data(template: dict[str, Any]) -> str | None:
    data = template.get("userData")
    return base64.b64decode(data).decode() if data else None


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_exactly_the_nvme_pools_get_raid0_and_nvme_labels(stack: str, stack_plan: Any) -> None:
    plan = stack_plan(stack)
    groups = by_name(plan, "aws:eks/nodeGroup:NodeGroup")
    templates = by_name(plan, "aws:ec2/launchTemplate:LaunchTemplate")
    for pool in pools_of(stack):
        labels = groups[f"mlc-{stack}-nodepools-{pool['name']}-ng"]["inputs"]["labels"]
        text = decode_user_data(templates[f"mlc-{stack}-nodepools-{pool['name']}-lt"]["inputs"])
        store_gb = ssd_gb(pool["instanceTypes"][0])
        if not store_gb:
            assert text is None and f"{PREFIX}/disktype" not in labels and f"{PREFIX}/nvme-gib" not in labels
            continue
        assert labels[f"{PREFIX}/disktype"] == "nvme"
        assert labels[f"{PREFIX}/nvme-gib"] == str(store_gb * 10**9 // 2**30)
        assert text is not None
        if pool.get("amiFamily") == "bottlerocket":
            command = tomllib.loads(text)["settings"]["bootstrap-commands"]["000-mount-instance-storage"]
            assert ["apiclient", "ephemeral-storage", "init"] in command["commands"]
            continue
        message = email.message_from_string(text)
        assert message.get_content_type() == "multipart/mixed"
        nodeconfigs = [yaml.safe_load(p.get_payload(decode=True)) for p in message.walk()
                       if p.get_content_type() == "application/node.eks.aws"]
        # an EFA pool's second part raises the containers' locked-memory limit (tests/nodepools/test_efa.py)
        [nodeconfig] = [n for n in nodeconfigs if "instance" in n["spec"]]
        assert all(n["apiVersion"] == "node.eks.aws/v1alpha1" and n["kind"] == "NodeConfig" for n in nodeconfigs)
        assert nodeconfig["spec"]["instance"]["localStorage"]["strategy"] == "RAID0"


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_pool_carries_scale_from_zero_tags_for_its_labels_taints_and_resources(
    stack: str, stack_plan: Any
) -> None:
    plan = stack_plan(stack)
    groups = by_name(plan, "aws:eks/nodeGroup:NodeGroup")
    assert any(pool.get("gpu") and pool.get("minSize", 0) == 0 for pool in pools_of(stack))
    for pool in pools_of(stack):
        group = groups[f"mlc-{stack}-nodepools-{pool['name']}-ng"]["inputs"]
        tags = autoscaler_tags(plan, stack, pool["name"])
        for key, value in group["labels"].items():
            assert tags[f"{CAS}/label/{key}"] == value
        for taint in group.get("taints") or []:
            effect = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute"}[taint["effect"]]
            assert tags[f"{CAS}/taint/{taint['key']}"] == f"{taint['value']}:{effect}"
        assert tags[f"{CAS}/label/eks.amazonaws.com/capacityType"] == pool.get("capacityType", "ON_DEMAND")
        assert re.fullmatch(r"\d+Gi", tags[f"{CAS}/resources/ephemeral-storage"])
        if pool.get("gpu"):
            [gpu] = FIXTURES[pool["instanceTypes"][0]]["gpuses"]
            assert tags[f"{CAS}/resources/nvidia.com/gpu"] == str(gpu["count"])
        else:
            assert f"{CAS}/resources/nvidia.com/gpu" not in tags


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_device_plugin_release_is_pinned_official_and_placed_on_gpu_nodes(stack: str, stack_plan: Any) -> None:
    device_plugin = release(stack_plan(stack), "nvidia-device-plugin")
    assert device_plugin is not None
    inputs = device_plugin["inputs"]
    assert PINNED.match(inputs["version"])
    assert inputs["repositoryOpts"]["repo"] == "https://nvidia.github.io/k8s-device-plugin"
    terms = inputs["values"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in inputs["values"]["tolerations"]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_cluster_autoscaler_is_pinned_discovers_the_cluster_and_uses_pod_identity(stack: str, stack_plan: Any) -> None:
    plan = stack_plan(stack)
    values = stack_values(stack)
    autoscaler = release(plan, "cluster-autoscaler")
    assert autoscaler is not None
    inputs = autoscaler["inputs"]
    assert PINNED.match(inputs["version"])
    assert inputs["repositoryOpts"]["repo"] == "https://kubernetes.github.io/autoscaler"
    cluster = values["ml-cluster:cluster"]
    assert inputs["values"]["autoDiscovery"] == {"clusterName": cluster["name"]}
    assert inputs["values"]["awsRegion"] == values["aws:region"]
    # the newest autoscaler release of the cluster's own minor
    assert inputs["values"]["image"]["tag"] == AUTOSCALER_RELEASES[cluster["kubernetesVersion"]]
    assert AUTOSCALER_RELEASES[cluster["kubernetesVersion"]].startswith(f"v{cluster['kubernetesVersion']}.")
    [association] = [
        r["inputs"]
        for r in resources_of(plan, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
        if r["inputs"]["serviceAccount"] == inputs["values"]["rbac"]["serviceAccount"]["name"]
    ]
    assert association["namespace"] == inputs["namespace"] and association["clusterName"] == cluster["name"]
    [policy] = [r["inputs"] for r in resources_of(plan, "aws:iam/rolePolicy:RolePolicy") if "autoscaler" in r["name"]]
    statements = json.loads(policy["policy"])["Statement"]
    scaling = [s for s in statements if "autoscaling:SetDesiredCapacity" in s["Action"]]
    assert scaling[0]["Condition"]["StringEquals"] == {
        f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster['name']}": "owned"
    }
    assert f"mlc-{stack}-gpu-autoscaler-identity" in autoscaler["options"]["dependsOn"]


def test_onprem_labels_existing_nodes_and_installs_the_device_plugin_without_autoscaler(stack_plan: Any) -> None:
    plan = stack_plan("onprem")
    patches = {r["inputs"]["metadata"]["name"]: r for r in resources_of(plan, "kubernetes:core/v1:NodePatch")}
    expected = {node: pool for pool in pools_of("onprem") for node in pool["existing"]["nodes"]}
    assert set(patches) == set(expected)
    for node, pool in expected.items():
        labels = patches[node]["inputs"]["metadata"]["labels"]
        existing = pool["existing"]
        assert labels[f"{PREFIX}/pool"] == pool["name"]
        if existing.get("gpuType"):
            assert labels[f"{PREFIX}/gpu-type"] == existing["gpuType"]
            assert labels["nvidia.com/gpu.present"] == "true"
        if existing.get("nvmeGib"):
            assert labels[f"{PREFIX}/disktype"] == "nvme"
            assert labels[f"{PREFIX}/nvme-gib"] == str(existing["nvmeGib"])
        assert patches[node]["provider"] == "mlc-onprem-cluster-k8s"
    assert release(plan, "nvidia-device-plugin") is not None and release(plan, "cluster-autoscaler") is None
    assert not resources_of(plan, "aws:eks/nodeGroup:NodeGroup")
    patch_plan = {"resources": list(patches.values())}
    version = stack_values("onprem")["ml-cluster:onprem"]["kubernetesVersion"]
    assert validate_kubernetes_objects(patch_plan, version) == []


def test_bad_pool_sizes_stop_the_plan_before_any_resource(plan_config: Any) -> None:
    pools = pools_of("dev")
    pools[1] = {**pools[1], "minSize": 3, "maxSize": 2}
    with pytest.raises(ConfigError) as caught:
        plan_config("dev", {"ml-cluster:nodePools": pools})
    assert "node pool gpu-a10g" in str(caught.value) and "minSize=3" in str(caught.value)
