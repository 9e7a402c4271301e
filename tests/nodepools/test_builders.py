"""Pure builders: user data (MIME NodeConfig, Bottlerocket TOML), launch-template pieces, autoscaler tags and the
GPU plumbing values."""

from __future__ import annotations

import email
import json
import tomllib

import yaml

from infra.config.nodes import AutoscalerConfig
from infra.nodes.gpu import device_plugin_values, gpu_tolerations, node_patch_manifests
from infra.nodes.nodepools import (
    bottlerocket_user_data,
    metadata_options,
    mime_user_data,
    nodeconfig_raid0,
    user_data,
)
from infra.nodes.poolplan import plan_node_pools
from infra.nodes.scaling.autoscaler import autoscaler_policy, autoscaler_values
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool


def nodeconfigs_in(text: str) -> list[dict]:
    message = email.message_from_string(text)
    assert message.is_multipart() and message.get_content_type() == "multipart/mixed"
    parts = [part for part in message.walk() if not part.is_multipart()]
    assert all(part.get_content_type() == "application/node.eks.aws" for part in parts)
    return [yaml.safe_load(part.get_payload(decode=True)) for part in parts]


def test_nodeconfig_parses_back_from_the_mime_user_data() -> None:
    [document] = nodeconfigs_in(mime_user_data([nodeconfig_raid0()]))
    assert document == {
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {"instance": {"localStorage": {"strategy": "RAID0"}}},
    }


def test_user_data_is_identical_from_run_to_run() -> None:
    assert mime_user_data([nodeconfig_raid0()]) == mime_user_data([nodeconfig_raid0()])


def test_only_nvme_pools_get_user_data() -> None:
    nvme, plain = plan_node_pools(
        eks_config([gpu_pool("gpu"), {"name": "cpu", "instanceTypes": ["m6i.large"]}]), fixture_lookup
    )
    assert nodeconfigs_in(user_data(nvme) or "")[0]["spec"]["instance"]["localStorage"]["strategy"] == "RAID0"
    assert user_data(plain) is None


def test_bottlerocket_nvme_pool_gets_ephemeral_storage_settings() -> None:
    [plan] = plan_node_pools(eks_config([gpu_pool(amiFamily="bottlerocket")]), fixture_lookup)
    assert user_data(plan) == bottlerocket_user_data()
    settings = tomllib.loads(bottlerocket_user_data())
    command = settings["settings"]["bootstrap-commands"]["000-mount-instance-storage"]
    assert command["essential"] is True and command["mode"] == "always"
    assert command["commands"][0] == ["apiclient", "ephemeral-storage", "init"]
    bind = command["commands"][1]
    assert bind[:4] == ["apiclient", "ephemeral-storage", "bind", "--dirs"]
    assert {"/var/lib/containerd", "/var/lib/kubelet"} <= set(bind[4:])


def test_imds_v2_is_required_with_room_for_one_pod_hop() -> None:
    options = metadata_options()
    assert options["http_tokens"] == "required" and options["http_put_response_hop_limit"] == 2


def test_device_plugin_values_pin_placement_to_gpu_present_nodes_and_tolerate_all_gpu_taints() -> None:
    plans = plan_node_pools(
        eks_config(
            [
                gpu_pool(taints=[{"key": "dedicated", "value": "ml", "effect": "NO_EXECUTE"}]),
                {"name": "cpu", "instanceTypes": ["m6i.large"], "taints": [{"key": "system", "value": "x"}]},
            ]
        ),
        fixture_lookup,
    )
    values = device_plugin_values(plans)
    terms = values["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in values["tolerations"]
    assert {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"} in values["tolerations"]
    assert not any(t.get("key") == "system" for t in values["tolerations"])  # a CPU pool's taint is not ours
    assert gpu_tolerations(plans).count({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}) == 1


def test_autoscaler_values_discover_the_cluster_and_match_its_minor_version() -> None:
    values = autoscaler_values(AutoscalerConfig(), "ml-test", "us-west-2", "1.33")
    assert values["autoDiscovery"] == {"clusterName": "ml-test"} and values["awsRegion"] == "us-west-2"
    assert values["image"]["tag"] == "v1.33.6" and values["cloudProvider"] == "aws"
    assert values["rbac"]["serviceAccount"] == {"create": True, "name": "cluster-autoscaler"}
    pinned = autoscaler_values(AutoscalerConfig(imageTag="v1.33.2"), "ml-test", "us-west-2", "1.33")
    assert pinned["image"]["tag"] == "v1.33.2"


def test_autoscaler_policy_only_scales_the_clusters_own_groups() -> None:
    statements = json.loads(autoscaler_policy("ml-test"))["Statement"]
    mutating = [s for s in statements if "autoscaling:SetDesiredCapacity" in s["Action"]]
    assert len(mutating) == 1
    assert mutating[0]["Condition"] == {"StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/ml-test": "owned"}}
    others = [a for s in statements if s is not mutating[0] for a in s["Action"]]
    assert all(":Describe" in a or ":Get" in a for a in others)


def test_node_patches_label_each_existing_node() -> None:
    from infra.config.schema import parse_stack_config

    cfg = parse_stack_config(
        {
            "ml-cluster:platform": "onprem",
            "ml-cluster:onprem": {"clusterName": "lab", "kubernetesVersion": "1.31"},
            "ml-cluster:kubeconfig": "x",
            "ml-cluster:nodePools": [
                {
                    "name": "dgx",
                    "gpu": True,
                    "existing": {
                        "nodes": ["dgx-01", "dgx-02"],
                        "vcpus": 256,
                        "memory": "1Ti",
                        "gpuType": "a100",
                        "gpusPerNode": 8,
                        "nvmeGib": 14305,
                    },
                }
            ],
        },
        secret_keys=["ml-cluster:kubeconfig"],
    )
    plans = plan_node_pools(cfg, fixture_lookup)
    patches = node_patch_manifests(plans)
    assert [p["metadata"]["name"] for p in patches] == ["dgx-01", "dgx-02"]
    labels = patches[0]["metadata"]["labels"]
    assert labels["ml-cluster.io/gpu-type"] == "a100" and labels["nvidia.com/gpu.present"] == "true"
    assert labels["ml-cluster.io/disktype"] == "nvme" and labels["ml-cluster.io/nvme-gib"] == "14305"
    assert plans[0].cpu_per_gpu_millicores and plans[0].memory_per_gpu_bytes
