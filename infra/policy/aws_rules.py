"""Policies over the stack's AWS resources: buckets (encryption, public access, TLS only), EFS encryption, IMDSv2
on launch templates, the GPU taint on GPU node groups, protected stateful resources, Spot for prod training pools
and team roles scoped to their own bucket prefixes. Pure functions over a plan (infra/policy/plan.py).

Unknown values (None: an output not yet known during preview) never count as violations.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from infra.policy.plan import PlannedStack, PlanResource, provider_endpoint
from infra.policy.rule import PolicyContext

BUCKET_TYPES = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
PUBLIC_ACCESS_BLOCK_TYPE = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
SSE_CONFIG_TYPES = (
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
)
BUCKET_POLICY_TYPE = "aws:s3/bucketPolicy:BucketPolicy"
EFS_TYPE = "aws:efs/fileSystem:FileSystem"
LAUNCH_TEMPLATE_TYPE = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP_TYPE = "aws:eks/nodeGroup:NodeGroup"
ROLE_TYPE = "aws:iam/role:Role"
ROLE_POLICY_TYPE = "aws:iam/rolePolicy:RolePolicy"
TEAM_ROLE_TAG = "ml-cluster-team"  # infra.tenancy tags every team role with its team
# Resources whose deletion loses data: protected and retained in protected stacks.
STATEFUL_TYPES = (*BUCKET_TYPES, EFS_TYPE, "aws:ebs/volume:Volume")
GPU_RESOURCE = "nvidia.com/gpu"
SSE_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")
PUBLIC_ACCESS_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
_GPU_INSTANCE_FAMILY = re.compile(r"^(p|g|gr)\d")  # p4d, p5, g5, g6e, gr6 ...; not c6g/m6g (Graviton CPUs)


# --- team roles ---


def _s3_resource_problem(arn: str) -> str | None:
    """Why an S3 ARN in a team policy reaches beyond the team's own prefixes (None: it does not)."""
    if arn == "*" or not arn.startswith("arn:") or ":s3:::" not in arn:
        return f"resource {arn!r} is not a named S3 bucket"
    bucket, _, key = arn.split(":::", 1)[1].partition("/")
    if not bucket or any(ch in bucket for ch in "*?"):
        return f"resource {arn!r} has a wildcard bucket"
    if "/" in arn.split(":::", 1)[1] and (not key or key.startswith("*") or "/" not in key):
        return f"resource {arn!r} covers a whole bucket, not a team prefix"
    return None


def check_team_roles_scoped(plan: PlannedStack, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    for role in plan.of_type(ROLE_TYPE):
        team = (role.inputs.get("tags") or {}).get(TEAM_ROLE_TAG)
        if team is None:
            continue
        # Attached by reference, or (in an offline plan, where ids are unknown) by the role's physical name.
        attached = {r.key: r for r in plan.referrers(role, (ROLE_POLICY_TYPE,), "role")}
        if role.inputs.get("name"):
            attached.update({r.key: r for r in plan.of_type(ROLE_POLICY_TYPE)
                             if r.inputs.get("role") == role.inputs["name"]})
        policies = [r.inputs.get("policy") for r in attached.values()]
        policies += [p.get("policy") for p in _as_list(role.inputs.get("inlinePolicies")) if isinstance(p, Mapping)]
        for policy in policies:
            document = _policy_document(policy)
            if document is None:
                continue  # not known yet
            for statement in _as_list(document.get("Statement")):
                if statement.get("Effect") != "Allow":
                    continue
                if "NotResource" in statement:
                    yield role, f"team {team}: an Allow with NotResource reaches every other bucket"
                for arn in _as_list(statement.get("Resource")):
                    problem = _s3_resource_problem(str(arn))
                    if problem is not None:
                        yield role, f"team {team}: {problem}"



# --- buckets (stack-level: the bucket and the resources that configure it) ---


def _is_s3_compatible(bucket: PlanResource) -> bool:
    """A bucket on an S3-compatible store (IBM COS, MinIO) through a provider with a custom s3 endpoint."""
    return provider_endpoint(bucket.provider, "s3") is not None


def _sse_algorithms(value: Any) -> Iterator[Any]:
    """Every sseAlgorithm under an applyServerSideEncryptionByDefault, in whatever nesting holds it."""
    if isinstance(value, Mapping):
        default = value.get("applyServerSideEncryptionByDefault")
        if isinstance(default, Mapping):
            yield default.get("sseAlgorithm")
        for key, item in value.items():
            if key != "applyServerSideEncryptionByDefault":
                yield from _sse_algorithms(item)
    elif isinstance(value, list):
        for item in value:
            yield from _sse_algorithms(item)


def check_buckets_encrypted(plan: PlannedStack, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    for bucket in plan.of_type(*BUCKET_TYPES):
        if _is_s3_compatible(bucket):
            continue  # COS encrypts at rest itself and has no PutBucketEncryption
        configs = [bucket.inputs.get("serverSideEncryptionConfiguration")]
        configs += [r.inputs.get("rules") for r in plan.referrers(bucket, SSE_CONFIG_TYPES, "bucket")]
        if any(config is None for config in configs[1:]):
            continue  # an SSE configuration whose rules are not known yet
        algorithms = [a for config in configs for a in _sse_algorithms(config)]
        if not algorithms:
            yield (
                bucket,
                (
                    "has no server-side encryption: add an aws.s3.BucketServerSideEncryptionConfiguration "
                    f"for it with sseAlgorithm one of {', '.join(SSE_ALGORITHMS)}"
                ),
            )
        for algorithm in algorithms:
            if algorithm is not None and algorithm not in SSE_ALGORITHMS:
                yield bucket, f"sseAlgorithm {algorithm!r} is not one of {', '.join(SSE_ALGORITHMS)}"


def check_buckets_public_access_blocked(
    plan: PlannedStack, ctx: PolicyContext
) -> Iterator[tuple[PlanResource | None, str]]:
    for bucket in plan.of_type(*BUCKET_TYPES):
        if _is_s3_compatible(bucket):
            continue  # S3-compatible stores have no PutPublicAccessBlock
        blocks = plan.referrers(bucket, (PUBLIC_ACCESS_BLOCK_TYPE,), "bucket")
        if not blocks:
            yield bucket, "has no aws.s3.BucketPublicAccessBlock"
        for block in blocks:
            off = [
                flag
                for flag in PUBLIC_ACCESS_FLAGS
                if block.inputs.get(flag) is False or (flag not in block.inputs)
            ]
            if off:
                yield block, f"public access block for {bucket.name} must set {', '.join(off)} to true"


def _policy_document(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, Mapping) else None


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _denies_insecure_transport(document: Mapping[str, Any]) -> bool:
    """A statement that denies every S3 action to everyone when aws:SecureTransport is false."""
    for statement in _as_list(document.get("Statement")):
        if not isinstance(statement, Mapping) or statement.get("Effect") != "Deny":
            continue
        principal = statement.get("Principal")
        everyone = principal == "*" or (
            isinstance(principal, Mapping) and "*" in _as_list(principal.get("AWS"))
        )
        all_actions = any(action in ("s3:*", "*") for action in _as_list(statement.get("Action")))
        condition = statement.get("Condition") or {}
        secure = (
            (condition.get("Bool") or {}).get("aws:SecureTransport")
            if isinstance(condition, Mapping)
            else None
        )
        if everyone and all_actions and str(secure).lower() == "false":
            return True
    return False


def check_buckets_tls_only(plan: PlannedStack, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    for bucket in plan.of_type(*BUCKET_TYPES):
        endpoint = provider_endpoint(bucket.provider, "s3")
        if endpoint is not None:
            if not endpoint.startswith("https://"):
                yield bucket, f"S3-compatible endpoint {endpoint!r} is not https"
            continue
        policies = [bucket.inputs["policy"]] if bucket.inputs.get("policy") else []
        policies += [r.inputs.get("policy") for r in plan.referrers(bucket, (BUCKET_POLICY_TYPE,), "bucket")]
        if any(p is None for p in policies):
            continue  # a policy document that embeds outputs not known yet
        documents = [_policy_document(p) for p in policies]
        if not any(d is not None and _denies_insecure_transport(d) for d in documents):
            yield (
                bucket,
                "has no bucket policy denying s3:* to '*' when aws:SecureTransport is false (TLS-only)",
            )



# --- per-resource AWS rules ---


def check_efs_encrypted(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    if resource.inputs.get("encrypted") is not True:
        yield "file system must set encrypted: true"


def check_imdsv2(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    options = resource.inputs.get("metadataOptions") or {}
    if options.get("httpTokens") != "required":
        yield "metadataOptions.httpTokens must be 'required' (IMDSv2)"


def is_gpu_node_group(resource: PlanResource) -> bool:
    ami_type = str(resource.inputs.get("amiType") or "")
    if "NVIDIA" in ami_type or "GPU" in ami_type:
        return True
    return any(_GPU_INSTANCE_FAMILY.match(str(t)) for t in resource.inputs.get("instanceTypes") or [])


def check_gpu_node_group_tainted(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    if not is_gpu_node_group(resource):
        return
    taints = resource.inputs.get("taints") or []
    if not any(
        t.get("key") == GPU_RESOURCE and t.get("effect") in ("NO_SCHEDULE", "NO_EXECUTE") for t in taints
    ):
        yield f"GPU node group needs the taint {GPU_RESOURCE} with effect NO_SCHEDULE"


def check_stateful_protected(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    if not ctx.stack_protected:
        return
    if not resource.protect:
        yield "stateful resource in a protected stack must set protect=True"
    if resource.retain_on_delete is False:
        yield "stateful resource in a protected stack must set retain_on_delete=True"
    if resource.inputs.get("forceDestroy") is True:
        yield "bucket in a protected stack must not set force_destroy"


def check_prod_training_pools_spot(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    if ctx.stack_protected and is_gpu_node_group(resource):
        capacity = resource.inputs.get("capacityType") or "ON_DEMAND"
        if capacity != "SPOT":
            yield (
                f"GPU training pool uses {capacity} capacity: checkpointed training jobs can run on SPOT "
                "at a fraction of the price"
            )
