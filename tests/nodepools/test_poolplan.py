"""Pool config rules and the facts-based checks (fixtures answer get_instance_type), sizing and labels."""

from __future__ import annotations

import pytest

from infra.config.schema import ConfigError
from infra.nodes.instances import (
    GIB,
    kube_reserved_cpu_millicores,
    kube_reserved_memory_mib,
    node_allocatable,
    per_gpu_size,
    shape_from_result,
)
from infra.nodes.poolplan import plan_node_pools, pool_facts
from tests.nodepools.helpers import FIXTURES, eks_config, fixture_lookup, gpu_pool


def problems(error: ConfigError) -> dict[str, str]:
    return dict(error.problems)


@pytest.mark.parametrize(
    ("sizes", "shown"),
    [
        ({"minSize": 3, "desiredSize": 1, "maxSize": 4}, "minSize=3, desiredSize=1, maxSize=4"),
        ({"minSize": 0, "desiredSize": 5, "maxSize": 4}, "minSize=0, desiredSize=5, maxSize=4"),
        ({"minSize": 5, "maxSize": 4}, "minSize=5, desiredSize=5, maxSize=4"),
    ],
)
def test_bad_pool_sizes_name_the_pool_and_sizes(sizes: dict[str, int], shown: str) -> None:
    with pytest.raises(ConfigError) as caught:
        eks_config([{"name": "cpu", "instanceTypes": ["m6i.large"], **sizes}])
    [(path, why)] = caught.value.problems
    assert path == "nodePools.0"
    assert "node pool cpu" in why and shown in why


def test_duplicate_pool_names_are_an_error() -> None:
    with pytest.raises(ConfigError, match="node pool names must be unique: gpu"):
        eks_config([gpu_pool(), gpu_pool()])


def test_unknown_instance_type_names_pool_and_type() -> None:
    cfg = eks_config([{"name": "cpu", "instanceTypes": ["m6i.large"]}, gpu_pool(types=["g5.xlarge", "g9.mega"])])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    assert problems(caught.value) == {
        "nodePools.1.instanceTypes.1": "pool gpu: unknown instance type g9.mega (aws.ec2.get_instance_type has no "
        "answer in us-west-2)"
    }


def test_mixed_local_storage_names_pool_and_types() -> None:
    cfg = eks_config([gpu_pool("mixed", ["g5.xlarge", "g5.2xlarge"])])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    why = problems(caught.value)["nodePools.0.instanceTypes"]
    assert "pool mixed mixes local storage" in why
    assert "g5.xlarge (250 GB NVMe)" in why and "g5.2xlarge (450 GB NVMe)" in why


def test_mixed_local_storage_is_allowed_when_the_instance_store_is_left_alone() -> None:
    cfg = eks_config([gpu_pool("mixed", ["g5.xlarge", "g5.2xlarge"], localStorage={"mode": "none"})])
    [plan] = plan_node_pools(cfg, fixture_lookup)
    assert plan.nvme_gib == 0 and not any("disktype" in key for key in plan.labels)


def test_gpu_pool_with_a_cpu_type_is_an_error() -> None:
    cfg = eks_config([gpu_pool("gpu", ["m6i.xlarge"])])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    assert problems(caught.value)["nodePools.0.instanceTypes"] == "pool gpu is a GPU pool but m6i.xlarge has no GPU"


def test_cpu_pool_with_a_gpu_type_must_say_gpu() -> None:
    cfg = eks_config([{"name": "cpu", "instanceTypes": ["g5.xlarge"]}])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    assert "g5.xlarge (1x NVIDIA A10G)" in problems(caught.value)["nodePools.0.gpu"]


def test_mixed_gpu_shapes_are_an_error() -> None:
    cfg = eks_config([gpu_pool("gpu", ["g5.12xlarge", "g6e.12xlarge"], localStorage={"mode": "none"})])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    assert "mixes GPU shapes" in problems(caught.value)["nodePools.0.instanceTypes"]


def test_all_pool_problems_are_reported_together() -> None:
    cfg = eks_config([gpu_pool("a", ["m6i.large"]), gpu_pool("b", ["nope.large"])])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    assert set(problems(caught.value)) == {"nodePools.0.instanceTypes", "nodePools.1.instanceTypes.0"}


def test_existing_nodes_are_onprem_only() -> None:
    existing = {"nodes": ["n1"], "vcpus": 8, "memory": "64Gi"}
    cfg = eks_config([{"name": "lab", "existing": existing}])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    assert "belong to platform onprem" in problems(caught.value)["nodePools.0.existing"]


def test_gpu_pool_labels_taint_and_ami() -> None:
    [plan] = plan_node_pools(eks_config([gpu_pool("a10g", ["g5.xlarge"], labels={"team": "vision"})]), fixture_lookup)
    assert plan.ami_type == "AL2023_x86_64_NVIDIA"
    assert [(t.key, t.value, t.effect) for t in plan.taints] == [("nvidia.com/gpu", "true", "NO_SCHEDULE")]
    assert plan.labels == {
        "ml-cluster.io/pool": "a10g",
        "ml-cluster.io/gpu-type": "a10g",
        "ml-cluster.io/gpu-count": "1",
        "ml-cluster.io/gpu-memory-gib": "22",
        "nvidia.com/gpu.present": "true",
        "ml-cluster.io/disktype": "nvme",
        "ml-cluster.io/nvme-gib": "232",
        "team": "vision",
        # cluster-autoscaler's AWS GPU label: without it a scale-up from zero may launch extra GPU nodes
        "k8s.amazonaws.com/accelerator": "nvidia-a10g",
    }


def test_nvme_gib_is_the_total_instance_store_in_gib() -> None:
    # p4d.24xlarge: 8 x 1000 GB = 8e12 bytes = 7450 GiB (rounded down)
    [plan] = plan_node_pools(eks_config([gpu_pool("a100", ["p4d.24xlarge"])]), fixture_lookup)
    assert plan.nvme_gib == 8 * 1000 * 10**9 // GIB == 7450
    assert plan.labels["ml-cluster.io/nvme-gib"] == "7450"


def test_cpu_pool_without_instance_store_has_no_nvme_and_no_sizes() -> None:
    [plan] = plan_node_pools(
        eks_config([{"name": "system", "instanceTypes": ["m6i.large"], "maxSize": 2}]), fixture_lookup
    )
    assert plan.ami_type == "AL2023_x86_64_STANDARD" and plan.taints == ()
    assert plan.nvme_gib == 0 and plan.labels == {"ml-cluster.io/pool": "system"}
    assert plan.cpu_per_gpu_millicores is None and plan.memory_per_gpu_bytes is None


def test_raid0_override_with_size_labels_a_pool_detection_calls_plain() -> None:
    pool = {"name": "cpu", "instanceTypes": ["m6i.large"], "localStorage": {"mode": "raid0", "gib": 100}}
    [plan] = plan_node_pools(eks_config([pool]), fixture_lookup)
    assert plan.nvme_gib == 100 and plan.labels["ml-cluster.io/disktype"] == "nvme"


def test_raid0_override_without_size_on_a_type_without_instance_store_is_an_error() -> None:
    pool = {"name": "cpu", "instanceTypes": ["m6i.large"], "localStorage": {"mode": "raid0"}}
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(eks_config([pool]), fixture_lookup)
    assert "reports no instance store" in problems(caught.value)["nodePools.0.localStorage.gib"]


def test_bottlerocket_gpu_pool_uses_its_nvidia_ami_and_skips_the_gpu_present_label() -> None:
    [plan] = plan_node_pools(eks_config([gpu_pool(amiFamily="bottlerocket")]), fixture_lookup)
    assert plan.ami_type == "BOTTLEROCKET_x86_64_NVIDIA"
    assert "nvidia.com/gpu.present" not in plan.labels and not plan.needs_device_plugin_daemonset


def test_kube_reserved_follows_the_eks_ami_formula() -> None:
    # 6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25% beyond
    assert [kube_reserved_cpu_millicores(n) for n in (1, 2, 4, 8, 96)] == [60, 70, 80, 90, 310]
    assert kube_reserved_memory_mib(58) == 11 * 58 + 255 == 893


def test_eni_limits_give_the_vpc_cni_pod_limit_capped_by_managed_node_groups() -> None:
    small = shape_from_result(
        "x.large",
        {"defaultVcpus": 4, "memorySize": 16384, "maximumNetworkInterfaces": 4, "maximumIpv4AddressesPerInterface": 15},
    )
    assert small.eni_max_pods == 58 and small.max_pods == 58
    # the default network card's interfaces count, not the instance total
    big = shape_from_result(
        "x.metal",
        {
            "defaultVcpus": 96,
            "memorySize": 1179648,
            "maximumNetworkInterfaces": 60,
            "maximumIpv4AddressesPerInterface": 50,
            "defaultNetworkCardIndex": 0,
            "networkCards": [{"index": 0, "maximumInterfaces": 15}, {"index": 1, "maximumInterfaces": 15}],
        },
    )
    assert big.eni_max_pods == 737 and big.max_pods == 250
    unknown = shape_from_result("x.small", {"defaultVcpus": 2, "memorySize": 4096})
    assert unknown.eni_max_pods is None and unknown.max_pods == 110


def test_t_shirt_sizes_for_g5_xlarge_by_hand() -> None:
    # 4 vCPU, 16384 MiB, max pods 110 (no ENI facts in the fixture; under 30 vCPUs)
    cpu_allocatable = 4000 - 80 - 500
    memory_allocatable = int(16384 * 0.925 * 2**20) - (11 * 110 + 255 + 100) * 2**20 - 2**30
    [plan] = plan_node_pools(eks_config([gpu_pool()]), fixture_lookup)
    assert plan.cpu_per_gpu_millicores == cpu_allocatable // 100 * 100 == 3400
    assert plan.memory_per_gpu_bytes == memory_allocatable // GIB * GIB == 12 * GIB


def test_t_shirt_sizes_split_the_node_between_its_gpus() -> None:
    [plan] = plan_node_pools(eks_config([gpu_pool("h100", ["p5.48xlarge"])]), fixture_lookup)
    node = node_allocatable(192, FIXTURES["p5.48xlarge"]["memorySize"], 250, 500, GIB)
    assert (plan.cpu_per_gpu_millicores, plan.memory_per_gpu_bytes) == per_gpu_size(node, 8)
    assert plan.cpu_per_gpu_millicores * 8 <= node.cpu_millicores
    assert plan.memory_per_gpu_bytes * 8 <= node.memory_bytes < (plan.memory_per_gpu_bytes + GIB) * 8


def test_system_reserved_shrinks_the_t_shirt() -> None:
    base = plan_node_pools(eks_config([gpu_pool()]), fixture_lookup)[0]
    roomy = plan_node_pools(
        eks_config([gpu_pool()], {"sizing": {"systemReservedCpu": "1500m", "systemReservedMemory": "3Gi"}}),
        fixture_lookup,
    )[0]
    assert roomy.cpu_per_gpu_millicores == base.cpu_per_gpu_millicores - 1000
    assert roomy.memory_per_gpu_bytes == base.memory_per_gpu_bytes - 2 * GIB


def test_pool_facts_carry_what_the_job_renderer_needs() -> None:
    plans = plan_node_pools(
        eks_config([{"name": "system", "instanceTypes": ["m6i.large"]}, gpu_pool()]), fixture_lookup
    )
    system, gpu = pool_facts(plans)
    assert (system.name, system.gpu_type, system.gpus_per_node, system.nvme_gib) == ("system", None, 0, 0)
    assert (gpu.name, gpu.gpu_type, gpu.gpus_per_node, gpu.nvme_gib) == ("gpu", "a10g", 1, 232)
    assert gpu.cpu_per_gpu_millicores == 3400 and gpu.memory_per_gpu_bytes == 12 * GIB
    assert gpu.labels["ml-cluster.io/disktype"] == "nvme"


def test_label_keys_too_long_for_an_asg_tag_are_an_error() -> None:
    long_key = "team.research.example.com/" + "x" * 63  # a valid label key; as a tag key: 135 characters
    cfg = eks_config([gpu_pool(labels={long_key: "a"})])
    with pytest.raises(ConfigError) as caught:
        plan_node_pools(cfg, fixture_lookup)
    assert long_key in problems(caught.value)["nodePools.0.labels"]
