"""Each policy of the pack, passing and failing, on small synthetic plan documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.policy.rules import POLICIES, PolicyContext, Violation, evaluate
from tests.policy.builders import (
    compliant_stack,
    container,
    copy_of,
    gpu_job,
    gpu_node_group,
    plan,
    pod_spec,
    resource,
    s3_bucket,
    tls_only_policy,
)

UNPROTECTED = PolicyContext(stack_protected=False)
PROTECTED = PolicyContext(stack_protected=True)


def violations(resources: list[dict[str, Any]], ctx: PolicyContext = UNPROTECTED) -> list[Violation]:
    return evaluate(plan(*resources), ctx)


def only(found: list[Violation], policy: str) -> list[Violation]:
    """Assert every violation is of `policy` (one change breaks one rule) and return them."""
    assert found, f"expected a {policy} violation"
    assert {v.policy for v in found} == {policy}, [str(v) for v in found]
    return found


def replace(resources: list[dict[str, Any]], type_token: str, **inputs: Any) -> list[dict[str, Any]]:
    """Copy of `resources` with the inputs of every resource of `type_token` updated."""
    result = [copy_of(r) for r in resources]
    for raw in result:
        if raw["type"] == type_token:
            raw["inputs"].update(inputs)
    return result


def test_policy_names_are_unique_and_both_levels_are_used() -> None:
    names = [rule.name for rule in POLICIES]
    assert len(names) == len(set(names))
    assert {rule.enforcement for rule in POLICIES} == {"mandatory", "advisory"}


def test_every_policy_has_a_failing_test_in_this_module() -> None:
    source = Path(__file__).read_text()
    assert [rule.name for rule in POLICIES if f'"{rule.name}")' not in source] == []


@pytest.mark.parametrize("ctx", [UNPROTECTED, PROTECTED], ids=["unprotected", "protected"])
def test_compliant_stack_passes_every_policy(ctx: PolicyContext) -> None:
    assert violations(compliant_stack(protected=ctx.stack_protected), ctx) == []


# --- buckets ---


def test_bucket_without_encryption_fails() -> None:
    resources = [r for r in s3_bucket() if "ServerSideEncryption" not in r["type"]]
    found = only(violations(resources), "s3-bucket-encrypted")
    assert found[0].resource is not None and found[0].resource.name == "data"


def test_bucket_with_inline_encryption_passes() -> None:
    resources = [r for r in s3_bucket() if "ServerSideEncryption" not in r["type"]]
    resources = replace(
        resources,
        "aws:s3/bucket:Bucket",
        serverSideEncryptionConfiguration={"rule": {"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}},
    )
    assert violations(resources) == []


def test_bucket_with_unknown_algorithm_fails() -> None:
    resources = replace(
        s3_bucket(),
        s3_bucket()[1]["type"],
        rules=[{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "none"}}],
    )
    assert "'none'" in only(violations(resources), "s3-bucket-encrypted")[0].message


def test_encryption_of_another_bucket_does_not_count() -> None:
    other = s3_bucket("other")
    resources = [*(r for r in s3_bucket() if "ServerSideEncryption" not in r["type"]), *other]
    found = only(violations(resources), "s3-bucket-encrypted")
    assert [v.resource.name for v in found if v.resource] == ["data"]


def test_bucket_without_public_access_block_fails() -> None:
    resources = [r for r in s3_bucket() if "PublicAccessBlock" not in r["type"]]
    assert (
        "no aws.s3.BucketPublicAccessBlock" in only(violations(resources), "s3-bucket-public-access-blocked")[0].message
    )


def test_partial_public_access_block_fails_naming_the_flag() -> None:
    resources = replace(
        s3_bucket(), "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", restrictPublicBuckets=False
    )
    message = only(violations(resources), "s3-bucket-public-access-blocked")[0].message
    assert "restrictPublicBuckets" in message and "blockPublicAcls" not in message


def test_bucket_without_tls_policy_fails() -> None:
    resources = [r for r in s3_bucket() if r["type"] != "aws:s3/bucketPolicy:BucketPolicy"]
    only(violations(resources), "s3-bucket-tls-only")


def test_bucket_policy_that_allows_http_fails() -> None:
    document = json.loads(tls_only_policy("mlc-data"))
    document["Statement"][0]["Condition"] = {"Bool": {"aws:SecureTransport": "true"}}
    resources = replace(s3_bucket(), "aws:s3/bucketPolicy:BucketPolicy", policy=json.dumps(document))
    only(violations(resources), "s3-bucket-tls-only")


def test_bucket_policy_not_known_yet_is_not_a_violation() -> None:
    # During a real preview the policy JSON embeds the bucket ARN, an unknown output (None here).
    resources = replace(s3_bucket(), "aws:s3/bucketPolicy:BucketPolicy", policy=None)
    assert violations(resources) == []


def cos_bucket(endpoint: str) -> list[dict[str, Any]]:
    provider = resource(
        "pulumi:providers:aws", "cos", {"endpoints": json.dumps([{"s3": endpoint}]), "region": "us-south"}
    )
    bucket = resource("aws:s3/bucket:Bucket", "cos-data", {"bucket": "mlc-cos-data"}, provider="cos")
    return [provider, bucket]


def test_cos_bucket_on_https_endpoint_passes_without_s3_only_resources() -> None:
    assert violations(cos_bucket("https://s3.us-south.cloud-object-storage.appdomain.cloud")) == []


def test_cos_bucket_on_plain_http_endpoint_fails() -> None:
    found = only(violations(cos_bucket("http://minio.local:9000")), "s3-bucket-tls-only")
    assert "not https" in found[0].message


# --- EFS, launch templates, node groups ---


def test_unencrypted_efs_fails() -> None:
    resources = replace(compliant_stack(), "aws:efs/fileSystem:FileSystem", encrypted=False)
    only(violations(resources), "efs-encrypted")


def test_launch_template_without_imdsv2_fails() -> None:
    resources = replace(
        compliant_stack(), "aws:ec2/launchTemplate:LaunchTemplate", metadataOptions={"httpTokens": "optional"}
    )
    only(violations(resources), "launch-template-imdsv2")
    without_options = replace(compliant_stack(), "aws:ec2/launchTemplate:LaunchTemplate", metadataOptions=None)
    only(violations(without_options), "launch-template-imdsv2")


def test_untainted_gpu_node_group_fails() -> None:
    only(violations([gpu_node_group(taints=[])]), "gpu-node-group-tainted")


def test_gpu_node_group_is_recognised_by_instance_type_too() -> None:
    group = gpu_node_group(amiType="CUSTOM", instanceTypes=["p5.48xlarge"], taints=None)
    only(violations([group]), "gpu-node-group-tainted")


def test_gpu_taint_with_prefer_no_schedule_fails() -> None:
    group = gpu_node_group(taints=[{"key": "nvidia.com/gpu", "value": "true", "effect": "PREFER_NO_SCHEDULE"}])
    only(violations([group]), "gpu-node-group-tainted")


def test_cpu_node_group_needs_no_taint() -> None:
    group = resource(
        "aws:eks/nodeGroup:NodeGroup",
        "system",
        {"amiType": "AL2023_ARM_64_STANDARD", "instanceTypes": ["m7g.large", "c6g.xlarge"]},
    )
    assert violations([group]) == []


# --- Jobs ---


def test_gpu_job_with_limits_above_requests_fails() -> None:
    job = gpu_job()
    container(job, "train")["resources"]["requests"]["cpu"] = "4"
    message = only(violations([job]), "job-gpu-limits-equal-requests")[0].message
    assert "container train" in message and "cpu" in message


def test_gpu_job_with_burstable_init_container_fails() -> None:
    job = gpu_job()
    container(job, "stage")["resources"]["limits"]["memory"] = "4Gi"
    assert "container stage" in only(violations([job]), "job-gpu-limits-equal-requests")[0].message


def test_request_without_limit_in_gpu_job_fails() -> None:
    job = gpu_job()
    del container(job, "stage")["resources"]["limits"]["cpu"]
    assert "without a limit" in only(violations([job]), "job-gpu-limits-equal-requests")[0].message


def test_equal_quantities_in_different_units_pass() -> None:
    job = gpu_job()
    container(job, "train")["resources"]["requests"]["cpu"] = "8000m"
    assert violations([job]) == []


def test_cpu_job_may_be_burstable() -> None:
    job = gpu_job()
    for name in ("train", "stage"):
        resources = container(job, name)["resources"]
        resources["limits"].pop("nvidia.com/gpu", None)
        resources["requests"].pop("nvidia.com/gpu", None)
        resources["requests"]["cpu"] = "500m"
    assert violations([job]) == []


def test_gpu_container_without_memory_backed_shm_fails() -> None:
    job = gpu_job()
    train = container(job, "train")
    train["volumeMounts"] = [m for m in train["volumeMounts"] if m["mountPath"] != "/dev/shm"]
    only(violations([job]), "job-gpu-shm")


def test_shm_on_disk_does_not_count() -> None:
    job = gpu_job()
    pod_spec(job)["volumes"][0]["emptyDir"] = {"sizeLimit": "16Gi"}  # dshm, now disk-backed
    container(job, "train")["resources"]["limits"]["ephemeral-storage"] = "200Gi"
    container(job, "train")["resources"]["requests"]["ephemeral-storage"] = "200Gi"
    only(violations([job]), "job-gpu-shm")


def test_memory_limit_not_covering_memory_volumes_fails() -> None:
    job = gpu_job()
    for kind in ("limits", "requests"):
        container(job, "train")["resources"][kind]["memory"] = "16Gi"  # == the 16Gi /dev/shm
    assert "dshm" in only(violations([job]), "job-memory-covers-memory-volumes")[0].message


def test_memory_volume_without_size_limit_fails() -> None:
    job = gpu_job()
    pod_spec(job)["volumes"][0]["emptyDir"] = {"medium": "Memory"}
    assert "no sizeLimit" in only(violations([job]), "job-memory-covers-memory-volumes")[0].message


def test_memory_volume_in_container_without_memory_limit_fails() -> None:
    job = gpu_job()
    for kind in ("limits", "requests"):
        del container(job, "train")["resources"][kind]["memory"]
    assert "no memory limit" in only(violations([job]), "job-memory-covers-memory-volumes")[0].message


def test_scratch_user_without_ephemeral_storage_limit_fails() -> None:
    job = gpu_job()
    for kind in ("limits", "requests"):
        del container(job, "stage")["resources"][kind]["ephemeral-storage"]
    assert "container stage" in only(violations([job]), "job-ephemeral-storage-limits")[0].message


def test_ephemeral_limits_below_scratch_size_fail() -> None:
    job = gpu_job()
    for kind in ("limits", "requests"):
        container(job, "train")["resources"][kind]["ephemeral-storage"] = "50Gi"  # scratch is 100Gi
    assert "do not cover" in only(violations([job]), "job-ephemeral-storage-limits")[0].message


def test_native_sidecar_limit_counts_towards_the_pod() -> None:
    job = gpu_job()
    stage = container(job, "stage")
    stage["restartPolicy"] = "Always"
    for kind in ("limits", "requests"):
        stage["resources"][kind]["ephemeral-storage"] = "60Gi"
        container(job, "train")["resources"][kind]["ephemeral-storage"] = "50Gi"
    assert violations([job]) == []


def test_host_path_volume_fails() -> None:
    job = gpu_job()
    pod_spec(job)["volumes"].append({"name": "host", "hostPath": {"path": "/var/lib"}})
    assert "host" in only(violations([job]), "job-no-host-path")[0].message


def test_privileged_container_fails() -> None:
    job = gpu_job()
    container(job, "train")["securityContext"]["privileged"] = True
    only(violations([job]), "job-not-privileged")


# --- protected stacks ---


def test_stateful_resources_unprotected_in_protected_stack_fail() -> None:
    resources = replace(compliant_stack(protected=False), "aws:eks/nodeGroup:NodeGroup", capacityType="SPOT")
    found = only(violations(resources, PROTECTED), "protected-stateful-resources")
    assert {(v.resource.type, v.resource.name) for v in found if v.resource} == {
        ("aws:s3/bucket:Bucket", "data"),
        ("aws:efs/fileSystem:FileSystem", "shared"),
    }
    assert any("retain_on_delete" in v.message for v in found) and any("protect=True" in v.message for v in found)


def test_protected_bucket_with_force_destroy_fails() -> None:
    resources = replace(compliant_stack(protected=True), "aws:s3/bucket:Bucket", forceDestroy=True)
    assert "force_destroy" in only(violations(resources, PROTECTED), "protected-stateful-resources")[0].message


def test_unprotected_stack_may_destroy_its_data() -> None:
    resources = replace(compliant_stack(protected=False), "aws:s3/bucket:Bucket", forceDestroy=True)
    assert violations(resources, UNPROTECTED) == []


def test_on_demand_gpu_pool_in_protected_stack_is_advisory() -> None:
    resources = replace(compliant_stack(protected=True), "aws:eks/nodeGroup:NodeGroup", capacityType="ON_DEMAND")
    found = only(violations(resources, PROTECTED), "prod-training-pools-spot")
    assert [v.enforcement for v in found] == ["advisory"]
    assert [v.resource.name for v in found if v.resource] == ["gpu"]  # the CPU system pool is not a training pool


# --- EFA ---


def _gang_on(gpu_type: str, efa: str | None) -> list[dict[str, Any]]:
    job = gpu_job("ddp")
    job["inputs"]["spec"]["parallelism"] = 2
    pod_spec(job)["nodeSelector"] = {"x.io/gpu-type": gpu_type}
    if efa is not None:
        for kind in ("requests", "limits"):
            container(job, "train")["resources"][kind]["vpc.amazonaws.com/efa"] = efa
    group = gpu_node_group("h100", labels={"x.io/gpu-type": "h100", "x.io/efa": "true"})
    return [group, job]


def test_a_gang_on_a_gpu_type_with_efa_pools_must_request_efa() -> None:
    [violation] = only(violations(_gang_on("h100", None)), "multi-node-jobs-use-efa")
    assert "2-pod gang on GPU type h100" in violation.message and violation.resource is not None
    assert violations(_gang_on("h100", "32")) == []
    assert violations(_gang_on("a10g", None)) == []  # no EFA pools for that type: TCP is all there is
    single = _gang_on("h100", None)
    single[1]["inputs"]["spec"]["parallelism"] = 1
    assert violations(single) == []


# --- team roles ---


def _team_role(resources: list[str]) -> list[dict[str, Any]]:
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": ["s3:GetObject"],
                                                      "Resource": resources}]}
    return [resource("aws:iam/role:Role", "team-a-role", {"name": "mlc-prod-team-a", "tags": {"ml-cluster-team": "a"}}),
            resource("aws:iam/rolePolicy:RolePolicy", "team-a-access",
                     {"role": "mlc-prod-team-a", "policy": json.dumps(policy)})]


@pytest.mark.parametrize(("arn", "words"), [
    ("arn:aws:s3:::*/team-a/*", "wildcard bucket"),
    ("arn:aws:s3:::data-*/team-a/*", "wildcard bucket"),
    ("arn:aws:s3:::datasets/*", "whole bucket"),
    ("*", "not a named S3 bucket"),
])
def test_team_role_with_a_wildcard_bucket_fails(arn: str, words: str) -> None:
    found = only(violations(_team_role(["arn:aws:s3:::datasets/team-a/*", arn])), "team-roles-scoped")
    assert len(found) == 1 and words in found[0].message


def test_team_role_scoped_to_its_prefixes_passes() -> None:
    assert violations(_team_role(["arn:aws:s3:::datasets/team-a/*", "arn:aws:s3:::datasets"])) == []


# --- team namespaces ---


def _team_namespace(name: str = "team-a", quota: dict[str, str] | None = None) -> list[dict[str, Any]]:
    namespace = resource("kubernetes:core/v1:Namespace", f"{name}-ns", {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "labels": {"ml-cluster.io/team": name.removeprefix("team-")}}})
    hard = {"requests.nvidia.com/gpu": "8", "requests.cpu": "96", "requests.memory": "1Ti"} if quota is None else quota
    return [namespace, resource("kubernetes:core/v1:ResourceQuota", f"{name}-quota", {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "team-quota", "namespace": name}, "spec": {"hard": hard}})]


def test_team_namespace_with_its_quota_and_its_jobs_passes() -> None:
    job = gpu_job()
    job["inputs"]["metadata"]["namespace"] = "team-a"
    assert violations([*_team_namespace(), job]) == []


def test_team_namespace_without_quota_fails() -> None:
    namespace, _ = _team_namespace()
    found = only(violations([namespace]), "team-namespaces-have-quota")
    assert [v.message for v in found] == ["team namespace team-a has no ResourceQuota"]


def test_team_quota_in_another_namespace_or_without_gpus_fails() -> None:
    namespace, _ = _team_namespace()
    _, elsewhere = _team_namespace("team-b")
    found = only(violations([namespace, elsewhere]), "team-namespaces-have-quota")
    assert [v.message for v in found] == ["team namespace team-a has no ResourceQuota"]
    cpu_only = _team_namespace(quota={"requests.cpu": "96", "requests.memory": "1Ti"})
    found = only(violations(cpu_only), "team-namespaces-have-quota")
    assert [v.message for v in found] == ["team namespace team-a has no ResourceQuota on requests.nvidia.com/gpu"]


def test_gpu_job_outside_the_team_namespaces_is_reported() -> None:
    found = only(violations([*_team_namespace(), gpu_job()]), "gpu-jobs-in-team-namespaces")
    assert [(v.enforcement, v.message) for v in found] == [
        ("advisory", "GPU Job in namespace training, not a team's (team-a): no team's quota or role applies to it")]


def test_gpu_job_in_a_stack_without_teams_is_not_reported() -> None:
    assert violations([gpu_job()]) == []
