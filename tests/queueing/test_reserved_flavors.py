"""Kueue and reserved capacity: a pool with a capacity reservation is a flavor of its own, listed before its GPU
type's flavor, so a Job fills reserved GPUs first and goes on to the autoscaled pools only when the reservation is
full; each flavor's node labels select exactly its own pools' nodes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from infra.config.queueing import KueueConfig
from infra.config.schema import ConfigError
from infra.nodes.poolplan import plan_node_pools, pool_facts
from infra.queueing import RESERVED_FIRST, kueue_facts, queue_manifests
from infra.quota import check_queueing, flavors, job_podsets
from tests.jobs.facts import dev_facts
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool
from workloads.jobspec import parse_spec, render_job

PREFIX = "ml-cluster.io"
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
BLOCK = {"id": "cr-0123456789abcdef0", "availabilityZone": "us-west-2a", "instanceCount": 2}
ODCR = {"id": "cr-0fedcba9876543210", "availabilityZone": "us-west-2b", "instanceCount": 3}


def reserved_pools() -> Any:
    """A10G everywhere: an on-demand pool (4 nodes), a Spot pool (2), a Capacity Block (2 of 2 reserved) and an
    On-Demand Capacity Reservation (3 of 3); an L4 pool without a reservation; a CPU pool."""
    return plan_node_pools(eks_config([
        {"name": "system", "instanceTypes": ["m6i.large"]},
        gpu_pool("a10g-od", ["g5.12xlarge"], maxSize=4),
        gpu_pool("a10g-block", ["g5.12xlarge"], maxSize=2, capacityType="CAPACITY_BLOCK",
                 capacityReservation=BLOCK),
        gpu_pool("a10g-spot", ["g5.12xlarge"], maxSize=2, capacityType="SPOT"),
        gpu_pool("a10g-odcr", ["g5.12xlarge"], maxSize=3, capacityReservation=ODCR),
        gpu_pool("l4", ["g6.xlarge"], maxSize=2),
    ]), fixture_lookup)


def manifests(config: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    cfg = KueueConfig.model_validate({"enabled": True, **(config or {})})
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for manifest in queue_manifests(cfg, reserved_pools(), "training", "test", PREFIX):
        by_kind.setdefault(manifest["kind"], []).append(manifest)
    return by_kind


def test_each_reservation_is_a_flavor_before_its_gpu_types_and_quota_is_what_is_reserved() -> None:
    by_kind = manifests()
    assert [f["metadata"]["name"] for f in by_kind["ResourceFlavor"]] == [
        "reserved-a10g-block", "reserved-a10g-odcr", "a10g", "l4", "cpu"]
    labels = {f["metadata"]["name"]: f["spec"].get("nodeLabels") for f in by_kind["ResourceFlavor"]}
    assert labels["reserved-a10g-block"] == {f"{PREFIX}/gpu-type": "a10g", f"{PREFIX}/pool": "a10g-block"}
    assert labels["a10g"] == {f"{PREFIX}/gpu-type": "a10g", f"{PREFIX}/capacity": "unreserved"}
    assert labels["l4"] == {f"{PREFIX}/gpu-type": "l4"}  # a type without reservations is as before
    [shared] = by_kind["ClusterQueue"]
    [group] = shared["spec"]["resourceGroups"]
    gpus = {f["name"]: next(r["nominalQuota"] for r in f["resources"] if r["name"] == "nvidia.com/gpu")
            for f in group["flavors"]}
    # g5.12xlarge has 4 GPUs: the block 2 x 4, the ODCR 3 x 4, the on-demand and Spot pools (4 + 2) x 4
    assert gpus == {"reserved-a10g-block": "8", "reserved-a10g-odcr": "12", "a10g": "24", "l4": "2", "cpu": "0"}
    assert shared["spec"]["flavorFungibility"] == RESERVED_FIRST == {
        "whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}


def test_a_stack_without_reservations_keeps_its_flavors_and_queues() -> None:
    pools = plan_node_pools(eks_config([gpu_pool("a10g", ["g5.xlarge"])]), fixture_lookup)
    assert all(f"{PREFIX}/capacity" not in plan.labels for plan in pools)
    [queue] = [m for m in queue_manifests(KueueConfig(enabled=True), pools, "training", "test", PREFIX)
               if m["kind"] == "ClusterQueue"]
    assert "flavorFungibility" not in queue["spec"]


def _satisfies(labels: dict[str, str], selector: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def test_each_flavor_selects_exactly_its_own_pools_nodes() -> None:
    """What the scheduler sees after admission: the Job's nodeSelector with the flavor's nodeLabels injected
    (ResourceFlavorSpec.nodeLabels, apis/kueue/v1beta2/resourceflavor_types.go:53-66). The nodes it may land on,
    and the node groups the autoscaler may grow for it, must be the flavor's pools and no others; otherwise a Job
    admitted against on-demand quota would run on (and be counted off) a reservation."""
    pools = reserved_pools()
    job_selector = {f"{PREFIX}/gpu-type": "a10g"}
    for flavor in flavors(pools, PREFIX):
        if flavor.gpu_type != "a10g":
            continue
        selector = {**job_selector, **flavor.node_labels}
        landing = {plan.name for plan in pools if _satisfies(plan.labels, selector)}
        assert landing == {plan.name for plan in flavor.pools}, flavor.name
    by_name = {plan.name: plan.labels for plan in pools}
    assert by_name["a10g-block"][f"{PREFIX}/capacity"] == "reserved"
    assert by_name["a10g-odcr"][f"{PREFIX}/capacity"] == "reserved"
    assert by_name["a10g-spot"][f"{PREFIX}/capacity"] == "unreserved"
    assert f"{PREFIX}/capacity" not in by_name["l4"]


def kueue_assign(cluster_queue: dict[str, Any], resource_flavors: list[dict[str, Any]], pod: dict[str, Any],
                 count: int, used: dict[str, int]) -> str | None:
    """The flavor Kueue v0.19.2 gives a one-podset Workload in a ClusterQueue without borrowing, GPUs only: flavors in
    the resource group's order (pkg/scheduler/flavorassigner/flavorassigner.go:1089); a flavor whose nodeLabels
    contradict the pod's nodeSelector on the flavor's own keys, or whose NoSchedule taints the pod does not tolerate,
    is skipped (:1227-1253); the first that fits is taken, and with whenCanPreempt TryNextFlavor one that would need
    preemption is passed over (:1259-1275). `used`: GPUs already admitted per flavor."""
    specs = {f["metadata"]["name"]: f["spec"] for f in resource_flavors}
    assert cluster_queue["spec"]["flavorFungibility"]["whenCanPreempt"] == "TryNextFlavor"
    selector = pod.get("nodeSelector") or {}
    tolerated = {t["key"] for t in pod.get("tolerations") or []}
    gpus = job_podsets({"metadata": {}, "spec": {"parallelism": count, "template": {"spec": pod}}})[0]["requests"].gpus
    for flavor in cluster_queue["spec"]["resourceGroups"][0]["flavors"]:
        spec = specs[flavor["name"]]
        node_labels = spec.get("nodeLabels") or {}
        if any(key in node_labels and node_labels[key] != value for key, value in selector.items()):
            continue
        if any(taint["key"] not in tolerated for taint in spec.get("nodeTaints") or []):
            continue
        quota = int(next(r["nominalQuota"] for r in flavor["resources"] if r["name"] == "nvidia.com/gpu"))
        if used.get(flavor["name"], 0) + gpus * count <= quota:
            return str(flavor["name"])
    return None


def test_jobs_fill_the_reservations_first_then_the_autoscaled_pools() -> None:
    by_kind = manifests()
    [shared] = by_kind["ClusterQueue"]
    cfg = KueueConfig(enabled=True)
    facts = replace(dev_facts(), pools=pool_facts(reserved_pools()), **kueue_facts(cfg))
    [job, *_] = render_job(parse_spec({"image": IMAGE, "name": "fill", "gpus": 4, "gpuType": "a10g",
                                       "queue": "training"}), facts)
    pod = job["spec"]["template"]["spec"]
    used: dict[str, int] = {}
    order = []
    for _ in range(12):  # 4-GPU Jobs, one node each: 2 fill the block, 3 the ODCR, 6 the autoscaled pools
        flavor = kueue_assign(shared, by_kind["ResourceFlavor"], pod, 1, used)
        if flavor is None:
            break
        used[flavor] = used.get(flavor, 0) + 4
        order.append(flavor)
    assert order == ["reserved-a10g-block"] * 2 + ["reserved-a10g-odcr"] * 3 + ["a10g"] * 6
    [l4_job, *_] = render_job(parse_spec({"image": IMAGE, "name": "l4", "gpus": 1, "gpuType": "l4",
                                          "queue": "training"}), facts)
    assert kueue_assign(shared, by_kind["ResourceFlavor"], l4_job["spec"]["template"]["spec"], 1, {}) == "l4"


def test_team_queues_list_the_reserved_flavors_first_too() -> None:
    by_kind = manifests({"teams": [{"name": "vision", "quotas": [{"flavor": "reserved-a10g-block", "gpus": 4},
                                                                {"flavor": "a10g", "gpus": 8}]}]})
    vision = next(q for q in by_kind["ClusterQueue"] if q["metadata"]["name"] == "vision")
    assert [f["name"] for f in vision["spec"]["resourceGroups"][0]["flavors"]] == [
        "reserved-a10g-block", "reserved-a10g-odcr", "a10g", "l4", "cpu"]
    assert vision["spec"]["flavorFungibility"] == RESERVED_FIRST
    shared = next(q for q in by_kind["ClusterQueue"] if q["metadata"]["name"] == "shared")
    block = next(f for f in shared["spec"]["resourceGroups"][0]["flavors"] if f["name"] == "reserved-a10g-block")
    assert next(r["nominalQuota"] for r in block["resources"] if r["name"] == "nvidia.com/gpu") == "4"


def test_a_team_guaranteed_more_than_a_reservation_holds_is_a_config_error() -> None:
    cfg = KueueConfig.model_validate({"enabled": True, "teams": [
        {"name": "vision", "quotas": [{"flavor": "reserved-a10g-block", "gpus": 12}]}]})
    with pytest.raises(ConfigError) as caught:
        check_queueing(cfg, reserved_pools(), PREFIX)
    assert caught.value.shown() == [(
        "ml-cluster:kueue.teams[0].quotas[0].gpus",
        "the teams are guaranteed 12 reserved-a10g-block GPUs but the pools hold 8 at their maximum size "
        "(a10g-block 2x4)")]


def _gang_problems(nodes: int, pools: Any) -> list[tuple[str, str]]:
    cfg = KueueConfig(enabled=True)
    facts = replace(dev_facts(), pools=pool_facts(pools), **kueue_facts(cfg))
    rendered = [render_job(parse_spec({"image": IMAGE, "name": "gang", "gpus": 4, "nodes": nodes, "gpuType": "a10g",
                                       "queue": "training"}), facts)]
    try:
        check_queueing(cfg, pools, PREFIX, rendered, ["training"])
    except ConfigError as error:
        return error.shown()
    return []


def test_a_gang_must_fit_one_flavor_whole() -> None:
    pools = reserved_pools()
    assert _gang_problems(3, pools) == []  # the ODCR's 3 nodes (the block has 2)
    assert _gang_problems(6, pools) == []  # the on-demand and Spot pools' 6
    [(path, why)] = _gang_problems(7, pools)
    assert path == "ml-cluster:jobs[0].gpus"
    assert why.startswith("the gang (7 pod(s)) needs more a10g quota than ClusterQueue shared can ever get (")
    assert "nvidia.com/gpu 28 > 24)" in why
    assert why.endswith(", nor from reserved-a10g-block, reserved-a10g-odcr (a gang gets one flavor); Kueue would "
                        "keep it pending forever")



def test_a_pool_may_not_set_the_capacity_label_itself() -> None:
    with pytest.raises(ConfigError) as caught:
        eks_config([gpu_pool("a10g", ["g5.xlarge"], labels={f"{PREFIX}/capacity": "reserved"})])
    assert caught.value.shown() == [("ml-cluster:nodePools[0].labels",
                                     "ml-cluster.io/capacity is set by the stack (reserved capacity), never by a pool")]
