"""Kueue: flavors and quotas generated from the node pools, team queues in a cohort, the config errors for what
Kueue would accept but never run, gang admission of multi-node Jobs, and how a team addition reads in a plan diff.

The objects are checked against the pinned chart's CRDs by the render check (tests/charts/test_render_charts.py);
these tests read the session's stack plans or build pool plans in memory from the instance-type fixtures.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config.queueing import KueueConfig
from infra.config.schema import ConfigError
from infra.nodes.poolplan import plan_node_pools, pool_facts
from infra.plan.view import diff, format_diff
from infra.queueing import kueue_facts, queue_manifests
from infra.quota import Amounts, check_queueing, job_podsets, pod_requests
from tests.conftest import resources_of, stack_values
from tests.jobs.facts import GIB, dev_facts, prod_facts
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool
from workloads.cluster_facts import facts_from_dict, facts_to_dict
from workloads.jobspec import JobSpecError, parse_spec, render_job

Plan = dict[str, Any]
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def inputs_of(plan: Plan, kind: str) -> dict[str, dict[str, Any]]:
    token = f"kubernetes:kueue.x-k8s.io/v1beta2:{kind}"
    return {r["inputs"]["metadata"]["name"]: r["inputs"] for r in resources_of(plan, token)}


def quotas(cluster_queue: dict[str, Any]) -> dict[str, dict[str, str]]:
    [group] = cluster_queue["spec"]["resourceGroups"]
    assert group["coveredResources"] == ["cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"]
    return {flavor["name"]: {r["name"]: r["nominalQuota"] for r in flavor["resources"]} for flavor in group["flavors"]}


# GPUs the shared queue holds: every GPU pool's maxSize (onprem: its nodes) x GPUs per node, per GPU type.
EXPECTED_GPUS = {
    "dev": {"a10g": "2", "cpu": "0"},  # g5.xlarge (1 A10G) x 2
    "staging": {"a10g": "16", "l40s": "16", "cpu": "0"},  # g5.12xlarge (4 A10G) x 4, g6e.12xlarge (4 L40S) x 4
    "prod": {"a100": "64", "h100": "128", "cpu": "0"},  # p4d.24xlarge (8 A100) x 8, p5.48xlarge (8 H100) x 16
    "onprem": {"a100": "16", "cpu": "0"},  # 2 DGX A100 x 8
}


@pytest.mark.parametrize("stack", sorted(EXPECTED_GPUS))
def test_flavors_and_the_shared_queue_come_from_the_pools(stack: str, stack_plan: Callable[[str], Plan]) -> None:
    plan = stack_plan(stack)
    flavors = inputs_of(plan, "ResourceFlavor")
    assert set(flavors) == set(EXPECTED_GPUS[stack])
    for name, flavor in flavors.items():
        if name == "cpu":
            assert flavor["spec"] == {}  # CPU Jobs tolerate no GPU taint, so they never get GPU quota
        else:
            # prod and staging gate GPU flavors on the burn-in's label (gpu.health); dev and onprem run no burn-in
            gate = {"ml-cluster.io/gpu-health": "passed"} if stack in ("prod", "staging") else {}
            assert flavor["spec"]["nodeLabels"] == {"ml-cluster.io/gpu-type": name, **gate}
            assert {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"} in flavor["spec"]["nodeTaints"]
    cluster_queues = inputs_of(plan, "ClusterQueue")
    teams = {team["name"] for team in stack_values(stack).get("ml-cluster:kueue", {}).get("teams", [])}
    assert set(cluster_queues) == {"shared", *teams}  # one queue each for the stack's teams (staging has two)
    # the pools' GPUs are shared out: the teams' guaranteed quotas, the shared queue the rest
    total: dict[str, int] = {}
    for queue in cluster_queues.values():
        for flavor, amounts in quotas(queue).items():
            total[flavor] = total.get(flavor, 0) + int(amounts["nvidia.com/gpu"])
    assert {flavor: str(gpus) for flavor, gpus in total.items()} == EXPECTED_GPUS[stack]
    assert cluster_queues["shared"]["spec"]["cohortName"] == "gpus"
    assert cluster_queues["shared"]["spec"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "training"}}
    assert inputs_of(plan, "LocalQueue")["training"]["spec"] == {"clusterQueue": "shared"}
    assert inputs_of(plan, "LocalQueue")["training"]["metadata"]["namespace"] == "training"


def test_dev_quota_is_the_pools_allocatable_at_max_size(stack_plan: Callable[[str], Plan]) -> None:
    # g5.xlarge: 3400m and 12Gi per GPU after reservations, 208Gi of its 232 GiB NVMe; maxSize 2.
    a10g = quotas(inputs_of(stack_plan("dev"), "ClusterQueue")["shared"])["a10g"]
    assert a10g == {"cpu": "6800m", "memory": "24Gi", "ephemeral-storage": "416Gi", "nvidia.com/gpu": "2"}


def test_custom_resources_need_the_release_and_queued_jobs_their_queue(stack_plan: Callable[[str], Plan]) -> None:
    plan = stack_plan("prod")
    by_name = {r["name"]: r for r in plan["resources"]}
    release = by_name["mlc-prod-kueue-release"]
    assert release["inputs"]["chart"] == "oci://registry.k8s.io/kueue/charts/kueue"
    assert release["inputs"]["version"] == "0.19.2"
    for resource in plan["resources"]:
        if resource["type"].startswith("kubernetes:kueue.x-k8s.io/"):
            assert "mlc-prod-kueue-release" in resource["options"]["dependsOn"], resource["name"]
    assert "mlc-prod-kueue-cq-shared" in by_name["mlc-prod-kueue-lq-training"]["options"]["dependsOn"]
    for job in resources_of(plan, "kubernetes:batch/v1:Job"):
        assert "mlc-prod-kueue-lq-training" in job["options"]["dependsOn"], job["name"]


# --- multi-node DDP: one workload, admitted whole ---------------------------------------------------------------


def test_the_stacks_multi_node_job_is_one_gang_held_until_started(stack_plan: Callable[[str], Plan]) -> None:
    jobs = [r["inputs"] for r in resources_of(stack_plan("prod"), "kubernetes:batch/v1:Job")
            if r["name"] == "mlc-prod-jobs-resnet50-ddp"]
    assert len(jobs) == 1  # one Job: Kueue makes one Workload of it
    [job] = jobs
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 2
    assert job["spec"]["suspend"] is True
    assert QUEUE_LABEL not in job["metadata"]["labels"]  # held: Kueue leaves it alone until `submit start`
    assert job["metadata"]["annotations"]["ml-cluster.io/queue-name"] == "training"
    [podset] = job_podsets(job)
    assert podset["name"] == "main" and podset["count"] == 2 and "minCount" not in podset  # all or nothing
    assert podset["requests"].gpus == 8


def kueue_prod_facts() -> Any:
    return replace(prod_facts(), **kueue_facts(KueueConfig.model_validate(
        {"enabled": True, "teams": [{"name": "vision"}], "priorityClasses": [{"name": "high", "value": 1000}]})))


def test_facts_carry_the_queues_through_the_stack_output() -> None:
    facts = kueue_prod_facts()
    assert (facts.kueue, facts.local_queue, facts.local_queues) == (True, "training", ("training", "vision"))
    assert facts_from_dict(json.loads(json.dumps(facts_to_dict(facts)))) == facts  # `--facts facts.json`


def test_submitted_multi_node_job_carries_the_queue_label_and_starts_suspended() -> None:
    spec = parse_spec({"name": "ddp", "image": IMAGE, "nodes": 4, "gpus": 8, "gpuType": "h100",
                       "workloadPriority": "high"})
    job, _, _ = render_job(spec, kueue_prod_facts())  # `workloads.submit submit`: not held
    assert job["metadata"]["labels"][QUEUE_LABEL] == "training"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert job["spec"]["suspend"] is True  # Kueue unsuspends it once all 4 pods fit
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 4
    [podset] = job_podsets(job)
    assert (podset["count"], podset["requests"].gpus) == (4, 8)
    team, = render_job(parse_spec({"name": "one", "image": IMAGE, "gpuType": "a100", "queue": "vision"}),
                       kueue_prod_facts())
    assert team["metadata"]["labels"][QUEUE_LABEL] == "vision"


def test_a_spec_that_asks_to_be_held_is_kept_out_of_the_queue_until_started() -> None:
    spec = parse_spec({"name": "later", "image": IMAGE, "gpuType": "h100", "suspend": True})
    job, = render_job(spec, kueue_prod_facts())
    assert job["spec"]["suspend"] is True and QUEUE_LABEL not in job["metadata"]["labels"]
    assert job["metadata"]["annotations"]["ml-cluster.io/queue-name"] == "training"
    plain, = render_job(parse_spec({"name": "now", "image": IMAGE, "gpuType": "h100"}), prod_facts())
    assert plain["spec"]["suspend"] is False and "ml-cluster.io/queue-name" not in plain["metadata"]["annotations"]


@pytest.mark.parametrize(("fields", "path", "words"), [
    ({"queue": "nlp"}, "queue", "is not a LocalQueue of stack prod"),
    ({"workloadPriority": "urgent"}, "workloadPriority", "is not a WorkloadPriorityClass"),
])
def test_unknown_queue_or_priority_is_a_spec_error(fields: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        render_job(parse_spec({"name": "one", "image": IMAGE, "gpuType": "a100", **fields}), kueue_prod_facts())
    assert caught.value.path == path and words in caught.value.reason


def test_pod_requests_follow_kubernetes_init_and_sidecar_rules() -> None:
    def container(cpu: str, memory: str, **extra: Any) -> dict[str, Any]:
        return {"resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}

    copy = {"initContainers": [container("8", "2Gi")], "containers": [container("4", "16Gi")]}
    assert pod_requests(copy) == Amounts(cpu=8000, memory=16 * GIB)  # the larger of init and main, per resource
    rolling = {"initContainers": [container("2", "2Gi", restartPolicy="Always")],
               "containers": [container("4", "16Gi")]}
    assert pod_requests(rolling) == Amounts(cpu=6000, memory=18 * GIB)  # a native sidecar adds up


# --- config errors --------------------------------------------------------------------------------------------


def dev_pools() -> Any:
    return plan_node_pools(eks_config([{"name": "system", "instanceTypes": ["m6i.large"]},
                                       gpu_pool("gpu-a10g", ["g5.xlarge"])]), fixture_lookup)


def problems(cfg: dict[str, Any], jobs: tuple[dict[str, Any], ...] = ()) -> list[tuple[str, str]]:
    config = KueueConfig.model_validate({"enabled": True, **cfg})
    facts = replace(dev_facts(), pools=pool_facts(dev_pools()), **kueue_facts(config))
    rendered = [render_job(parse_spec({"image": IMAGE, **job}), facts, suspended_by_default=True) for job in jobs]
    queues = [manifests[0]["metadata"]["annotations"].get("ml-cluster.io/queue-name") for manifests in rendered]
    with pytest.raises(ConfigError) as caught:
        check_queueing(config, dev_pools(), "ml-cluster.io", rendered, queues)
    return caught.value.shown()


def test_a_team_quota_naming_a_flavor_no_pool_provides() -> None:
    [(path, why)] = problems({"teams": [{"name": "vision", "quotas": [{"flavor": "h100", "gpus": 1}]}]})
    assert path == "ml-cluster:kueue.teams[0].quotas[0].flavor"
    assert why == ("team vision: no node pool provides flavor h100 (flavors, one per GPU type and per reserved pool: "
                   "a10g, cpu)")


def test_teams_guaranteed_more_gpus_than_the_pools_hold() -> None:
    [(path, why)] = problems({"teams": [{"name": "vision", "quotas": [{"flavor": "a10g", "gpus": 1}]},
                                        {"name": "nlp", "quotas": [{"flavor": "a10g", "gpus": 2}]}]})
    assert path == "ml-cluster:kueue.teams[1].quotas[0].gpus"
    assert why == "the teams are guaranteed 3 a10g GPUs but the pools hold 2 at their maximum size (gpu-a10g 2x1)"


def test_a_gang_larger_than_its_queue_can_ever_get() -> None:
    # 3 nodes x 1 A10G: the pools hold 2 at their maximum size, and borrowing cannot add what does not exist.
    [(path, why)] = problems({}, ({"name": "ddp", "nodes": 3, "gpus": 1, "gpuType": "a10g"},))
    assert path == "ml-cluster:jobs[0].gpus"
    assert "needs more a10g quota than ClusterQueue shared can ever get" in why and "nvidia.com/gpu 3 > 2" in why


def test_a_team_without_borrowing_cannot_run_a_gang_beyond_its_quota() -> None:
    team = {"name": "vision", "quotas": [{"flavor": "a10g", "gpus": 1, "borrowingLimit": 0}]}
    [(path, why)] = problems({"teams": [team]}, ({"name": "ddp", "nodes": 2, "gpuType": "a10g", "queue": "vision"},))
    assert path == "ml-cluster:jobs[0].gpus" and "ClusterQueue vision" in why and "nvidia.com/gpu 2 > 1" in why


def test_the_same_gang_fits_when_the_team_may_borrow() -> None:
    config = KueueConfig.model_validate({"enabled": True, "teams": [
        {"name": "vision", "quotas": [{"flavor": "a10g", "gpus": 1}]}]})
    facts = replace(dev_facts(), pools=pool_facts(dev_pools()), **kueue_facts(config))
    rendered = [render_job(parse_spec({"name": "ddp", "image": IMAGE, "nodes": 2, "gpuType": "a10g",
                                       "queue": "vision"}), facts)]
    check_queueing(config, dev_pools(), "ml-cluster.io", rendered, ["vision"])  # 1 own + 1 borrowed from shared
    manifests = {(m["kind"], m["metadata"]["name"]): m for m in queue_manifests(
        config, dev_pools(), "training", "dev", "ml-cluster.io")}
    assert quotas(manifests[("ClusterQueue", "vision")])["a10g"]["nvidia.com/gpu"] == "1"
    assert quotas(manifests[("ClusterQueue", "vision")])["cpu"]["nvidia.com/gpu"] == "0"  # listed: may borrow
    assert quotas(manifests[("ClusterQueue", "shared")])["a10g"]["nvidia.com/gpu"] == "1"  # 2 in the pools - 1


@pytest.mark.parametrize(("raw", "words"), [
    ({"localQueue": "default"}, "no LocalQueue may be named 'default'"),
    ({"teams": [{"name": "shared"}]}, "ClusterQueue names must be unique"),
    ({"cohort": None, "teams": [{"name": "a", "quotas": [{"flavor": "a10g", "gpus": 1, "borrowingLimit": 1}]}]},
     "need a cohort"),
    ({"integrations": ["jobset.x-k8s.io/jobset"]}, "must include batch/job"),
    ({"teams": [{"name": "a", "fairSharingWeight": 2}]}, "has no effect without fairSharing"),
    ({"preemption": {"reclaimWithinCohort": "Never", "borrowWithinCohort": "LowerPriority"}},
     "needs reclaimWithinCohort other than Never"),
])
def test_kueue_config_rules(raw: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        KueueConfig.model_validate(raw)


def test_existing_nodes_without_a_declared_disk_would_admit_nothing() -> None:
    from infra.config.schema import parse_stack_config
    from infra.nodes.poolplan import plan_node_pools as plan_pools

    raw = {"ml-cluster:platform": "onprem", "ml-cluster:onprem": {"clusterName": "lab", "kubernetesVersion": "1.31"},
           "ml-cluster:kubeconfig": "k", "ml-cluster:nodePools": [
               {"name": "cpu", "existing": {"nodes": ["cpu-01"], "vcpus": 64, "memory": "256Gi"}}]}
    plans = plan_pools(parse_stack_config(raw, ["ml-cluster:kubeconfig"]))
    with pytest.raises(ConfigError) as caught:
        check_queueing(KueueConfig(enabled=True), plans, "ml-cluster.io")
    assert [path for path, _ in caught.value.shown()] == ["ml-cluster:nodePools[0].existing.kubeletDiskGib"]


def test_a_stack_job_queue_without_kueue_is_a_config_error_before_anything_is_registered(
        plan_config: Callable[..., Plan]) -> None:
    jobs = stack_values("dev")["ml-cluster:jobs"]
    jobs[0]["queue"] = "training"
    with pytest.raises(ConfigError) as caught:
        plan_config("dev", {"ml-cluster:kueue": {"enabled": False}, "ml-cluster:jobs": jobs})
    assert caught.value.lines() == ["error: ml-cluster:jobs[0].queue: queue training: Kueue is not enabled in this "
                                    "stack (ml-cluster:kueue.enabled)"]


# --- the plan diff of adding a team -------------------------------------------------------------------------------


def test_adding_a_team_reads_as_its_queues_and_the_shared_quota_it_takes(
        stack_plan: Callable[[str], Plan], plan_config: Callable[..., Plan]) -> None:
    kueue = stack_values("dev")["ml-cluster:kueue"]
    kueue["teams"] = [{"name": "vision", "quotas": [{"flavor": "a10g", "gpus": 1}]}]
    kueue["priorityClasses"] = [{"name": "high", "value": 1000}]
    text = format_diff(diff(stack_plan("dev"), plan_config("dev", {"ml-cluster:kueue": kueue})))
    # Only Kueue objects change, and the job facts submit reads (the queues a Job may name): no Job, release or
    # other queue is touched by a new team.
    assert text.splitlines() == [
        "stack dev: 3 to add, 0 to remove, 2 to change, 0 to replace",
        "+ kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue  mlc-dev-kueue-cq-vision",
        "+ kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue  mlc-dev-kueue-lq-vision",
        "+ kubernetes:kueue.x-k8s.io/v1beta2:WorkloadPriorityClass  mlc-dev-kueue-priority-high",
        "~ kubernetes:core/v1:ConfigMap  mlc-dev-jobs-facts-training",
        '    inputs.data["facts.json"].local_queues: ["training"] -> ["training", "vision"]',
        '    inputs.data["facts.json"].workload_priority_classes: [] -> ["high"]',
        "~ kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue  mlc-dev-kueue-cq-shared",
        '    inputs.spec.resourceGroups[0].flavors[0].resources[0].nominalQuota: "6800m" -> "3400m"',
        '    inputs.spec.resourceGroups[0].flavors[0].resources[1].nominalQuota: "24Gi" -> "12Gi"',
        '    inputs.spec.resourceGroups[0].flavors[0].resources[2].nominalQuota: "416Gi" -> "208Gi"',
        '    inputs.spec.resourceGroups[0].flavors[0].resources[3].nominalQuota: "2" -> "1"',
    ]


# --- after `up`: scripts/verify_stack.py ---------------------------------------------------------------------------


def test_verify_stack_reports_inactive_or_missing_queues() -> None:
    from infra.storage.verify import check_queues

    outputs = {"jobFacts": {"kueue": True, "namespace": "training", "local_queues": ["training", "vision"]}}

    def queue(kind: str, name: str, active: str, message: str, **spec: str) -> dict[str, Any]:
        metadata = {"name": name, **({"namespace": "training"} if kind == "LocalQueue" else {})}
        return {"kind": kind, "metadata": metadata, "spec": spec, "status": {"conditions": [
            {"type": "Active", "status": active, "reason": "Ready" if active == "True" else "FlavorNotFound",
             "message": message}]}}

    checks = check_queues(outputs, [queue("ClusterQueue", "shared", "False", "Can't admit new workloads: "
                                          "references missing ResourceFlavor(s): h100")],
                          [queue("LocalQueue", "training", "True", "Can submit new workloads to localQueue",
                                 clusterQueue="shared")])
    assert [(c.name, c.status) for c in checks] == [("localqueue training/training", "FAIL"),
                                                    ("localqueue training/vision", "FAIL")]
    assert "missing ResourceFlavor(s): h100" in checks[0].detail and checks[1].detail == "missing"
    assert check_queues({"jobFacts": {"kueue": False}}, [], [])[0].status == "SKIP"


def test_efa_gangs_are_admissible_kueue_excludes_per_node_devices(stack_plan: Callable[[str], Plan]) -> None:
    from infra.config.queueing import KueueConfig
    from infra.queueing import manager_config
    from infra.quota import KUEUE_EXCLUDED_RESOURCE_PREFIXES, undeclared_resources

    jobs = [r["inputs"] for r in stack_plan("prod")["resources"] if r["type"] == "kubernetes:batch/v1:Job"]
    gang = next(job for job in jobs if job["spec"].get("parallelism") == 2)
    [train] = [c for c in gang["spec"]["template"]["spec"]["containers"] if c["name"] == "train"]
    assert {"vpc.amazonaws.com/efa", "hugepages-2Mi"} <= set(train["resources"]["requests"])
    assert undeclared_resources(gang) == set()
    assert manager_config(KueueConfig())["resources"] == {
        "excludeResourcePrefixes": list(KUEUE_EXCLUDED_RESOURCE_PREFIXES)}
    other = json.loads(json.dumps(gang))
    other["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["example.com/fpga"] = "1"
    assert undeclared_resources(other) == {"example.com/fpga"}


def test_a_job_requesting_a_resource_kueue_would_block_on_is_a_config_error() -> None:
    config = KueueConfig.model_validate({"enabled": True})
    facts = replace(dev_facts(), pools=pool_facts(dev_pools()), **kueue_facts(config))
    rendered = [render_job(parse_spec({"name": "fpga", "image": IMAGE, "gpuType": "a10g"}), facts)]
    rendered[0][0]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["example.com/fpga"] = "1"
    with pytest.raises(ConfigError) as caught:
        check_queueing(config, dev_pools(), "ml-cluster.io", rendered, [config.local_queue])
    [(path, why)] = caught.value.shown()
    assert path == "ml-cluster:jobs[0].queue" and why.startswith("requests example.com/fpga, which no ClusterQueue")
