"""The training Jobs of every stack's offline plan keep every rule; IAM, Pod Identity and ordering are right."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.config import ConfigError
from tests.conftest import STACKS, resources_of, stack_values
from tests.jobs.jobrules import check_job, check_network_policy, check_service, validate_strict

Plan = dict[str, Any]
JOB = "kubernetes:batch/v1:Job"


def kubernetes_version(stack: str) -> str:
    values = stack_values(stack)
    section = values.get("ml-cluster:cluster") or values.get("ml-cluster:onprem") or {}
    return str(section.get("kubernetesVersion", "1.33"))


def manifest(resource: dict[str, Any]) -> dict[str, Any]:
    return {key: resource["inputs"][key] for key in ("apiVersion", "kind", "metadata", "spec")}


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_job_keeps_the_rules(stack: str, stack_plan: Callable[[str], Plan]) -> None:
    plan = stack_plan(stack)
    services = {r["inputs"]["metadata"]["name"]: manifest(r) for r in resources_of(plan, "kubernetes:core/v1:Service")}
    policies = {r["inputs"]["metadata"]["name"]: manifest(r)
                for r in resources_of(plan, "kubernetes:networking.k8s.io/v1:NetworkPolicy")}
    # Nothing reaches a training pod that a policy does not admit.
    deny = policies["default-deny-ingress"]
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    validate_strict(deny, kubernetes_version(stack))
    for resource in resources_of(plan, JOB):
        job = manifest(resource)
        check_job(job, kubernetes_version=kubernetes_version(stack))
        assert resource["options"]["deleteBeforeReplace"] is True, resource["name"]
        # No GPU hours before the data exists: created suspended, started by `submit start`, which `up` keeps.
        assert job["spec"]["suspend"] is True, resource["name"]
        assert resource["options"]["ignoreChanges"] == [
            "spec.suspend", 'metadata.labels["kueue.x-k8s.io/queue-name"]'], resource["name"]
        # Held out of Kueue's reach (no queue label) until `submit start` puts it in the recorded queue; destroy
        # deletes it before its queue.
        assert "kueue.x-k8s.io/queue-name" not in job["metadata"]["labels"], resource["name"]
        assert job["metadata"]["annotations"]["ml-cluster.io/queue-name"] == "training", resource["name"]
        needs = set(resource["options"]["dependsOn"])
        assert {f"mlc-{stack}-jobs-service-account", f"mlc-{stack}-jobs-ns-training",
                f"mlc-{stack}-kueue-lq-training"} <= needs
        pod = job["spec"]["template"]["spec"]
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        assert {f"mlc-{stack}-storage-pvc-{claim}" for claim in claims} <= needs, resource["name"]
        if any("nvidia.com/gpu" in c["resources"]["limits"] for c in pod["containers"]):
            assert f"mlc-{stack}-gpu-device-plugin" in needs, resource["name"]
        if job["spec"].get("completionMode") == "Indexed":
            check_service(services[job["metadata"]["name"]], job, kubernetes_version(stack))
            check_network_policy(policies[job["metadata"]["name"]], job, kubernetes_version(stack))


def test_dev_and_prod_hold_the_four_example_kinds(stack_plan: Callable[[str], Plan]) -> None:
    pods = [manifest(r)["spec"] for stack in ("dev", "prod") for r in resources_of(stack_plan(stack), JOB)]
    templates = [job["template"]["spec"] for job in pods]

    def stager(template: dict[str, Any]) -> dict[str, Any] | None:
        return next(iter(template.get("initContainers", [])), None)

    assert any((s := stager(t)) and "restartPolicy" not in s and "workloads.data" in s["command"]
               and t["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1" for t in templates)
    assert any(not stager(t) and any(v.get("persistentVolumeClaim", {}).get("claimName") == "datasets-efs"
                                     for v in t["volumes"]) for t in templates)
    assert any((s := stager(t)) and s.get("restartPolicy") == "Always" and "--budget" in s["command"]
               and "--linger" in s["command"] for t in templates)
    assert any(job.get("completionMode") == "Indexed" for job in pods)


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_job_role_reads_only_the_stacks_buckets(stack: str, stack_plan: Callable[[str], Plan]) -> None:
    plan = stack_plan(stack)
    policy, = [r for r in resources_of(plan, "aws:iam/rolePolicy:RolePolicy")
               if r["name"].endswith("-jobs-bucket-access")]
    statements = {s["Sid"]: s for s in json.loads(policy["inputs"]["policy"])["Statement"]}
    # The plan's buckets by logical name (the resource is named <prefix>-storage-s3-<logical>).
    physical = {r["name"].rsplit("-s3-", 1)[1]: r["inputs"]["bucket"]
                for r in resources_of(plan, "aws:s3/bucket:Bucket")}
    # Derived from what the stack's Jobs use (stage from, checkpoint to), never a bucket outside the stack.
    jobs = stack_values(stack)["ml-cluster:jobs"]
    targets = [job[part] for job in jobs for part in ("dataset", "checkpoint") if job.get(part)]
    used = ({physical[target["bucket"]] for target in targets if "bucket" in target}
            | {target["uri"].removeprefix("s3://").split("/", 1)[0] for target in targets if "uri" in target})
    assert used and used <= set(physical.values())
    assert set(statements["ListStackBuckets"]["Resource"]) == {f"arn:aws:s3:::{name}" for name in used}
    assert all("*" not in arn.removesuffix("/*") for s in statements.values() for arn in s["Resource"])
    if stack == "prod":  # resnet50-laion uploads checkpoints to the checkpoints bucket, and only there
        assert statements["WriteCheckpoints"]["Resource"] == ["arn:aws:s3:::mlc-prod-checkpoints-111122223333/*"]
    else:
        assert "WriteCheckpoints" not in statements
    association, = [r for r in resources_of(plan, "aws:eks/podIdentityAssociation:PodIdentityAssociation")
                    if r["name"].endswith("-jobs-pod-identity")]
    assert association["inputs"]["namespace"] == "training" and association["inputs"]["serviceAccount"] == "training"


def test_a_stack_job_that_fits_no_pool_stops_the_plan(plan_config: Callable[..., Plan]) -> None:
    jobs = stack_values("dev")["ml-cluster:jobs"]
    jobs[1] = {**jobs[1], "gpuType": "h100"}
    with pytest.raises(ConfigError) as caught:
        plan_config("dev", {"ml-cluster:jobs": jobs})
    assert "ml-cluster:jobs[1].gpuType: h100 is not offered by stack dev" in str(caught.value)


def test_a_stack_job_with_an_unknown_claim_stops_the_plan(plan_config: Callable[..., Plan]) -> None:
    jobs = stack_values("dev")["ml-cluster:jobs"]
    jobs[1] = {**jobs[1], "dataset": {"claimName": "no-such-claim"}}
    with pytest.raises(ConfigError) as caught:
        plan_config("dev", {"ml-cluster:jobs": jobs})
    assert "ml-cluster:jobs[1].dataset.claimName: no-such-claim is not a claim" in str(caught.value)
