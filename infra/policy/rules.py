"""The stack's policies as pure functions over its resources (no pulumi, no pulumi_policy imports).

Each policy is a `PolicyRule`: per-resource rules name the type tokens they check and return messages for
one resource; stack-level rules see the whole `Plan` (a bucket's encryption, public access block and TLS
policy are separate resources). `evaluate` runs them over a plan; the CrossGuard pack
(infra/policy/pack/__main__.py) wraps the same rules as ResourceValidationPolicy / StackValidationPolicy.

Unknown values (None: an output not yet known during preview) never count as violations; `pulumi up` runs the
policies again once the values are known.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from infra.policy.plan import Plan, PlanResource, provider_endpoint
from workloads.quantity import parse_quantity

Enforcement = Literal["mandatory", "advisory"]

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
JOB_TYPE = "kubernetes:batch/v1:Job"
ROLE_TYPE = "aws:iam/role:Role"
ROLE_POLICY_TYPE = "aws:iam/rolePolicy:RolePolicy"
TEAM_ROLE_TAG = "ml-cluster-team"  # infra.tenancy tags every team role with its team
NAMESPACE_TYPE = "kubernetes:core/v1:Namespace"
RESOURCE_QUOTA_TYPE = "kubernetes:core/v1:ResourceQuota"
TEAM_LABEL_SUFFIX = "/team"  # <labelPrefix>/team on a tenant team's namespace (infra.tenancy)
# What a team namespace's ResourceQuota must bound so nothing that bypasses Kueue gets more than the team's share.
TEAM_QUOTA_KEYS = ("requests.nvidia.com/gpu", "requests.cpu", "requests.memory")
# Resources whose deletion loses data: protected and retained in protected stacks.
STATEFUL_TYPES = (*BUCKET_TYPES, EFS_TYPE, "aws:ebs/volume:Volume")

GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
SSE_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")
PUBLIC_ACCESS_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
_GPU_INSTANCE_FAMILY = re.compile(r"^(p|g|gr)\d")  # p4d, p5, g5, g6e, gr6 ...; not c6g/m6g (Graviton CPUs)


@dataclass(frozen=True)
class PolicyContext:
    """What the rules know about the stack beyond its resources (CrossGuard: the policy config)."""

    stack_protected: bool = False  # the stack file sets `ml-cluster:protected: true` (prod)


@dataclass(frozen=True)
class Violation:
    policy: str
    enforcement: Enforcement
    resource: PlanResource | None  # None for the stack as a whole
    message: str

    def __str__(self) -> str:
        where = f"{self.resource.type} {self.resource.name}" if self.resource else "stack"
        return f"{self.enforcement}: {self.policy}: {where}: {self.message}"


ResourceCheck = Callable[[PlanResource, PolicyContext], Iterable[str]]
StackCheck = Callable[[Plan, PolicyContext], Iterable[tuple[PlanResource | None, str]]]


@dataclass(frozen=True)
class PolicyRule:
    name: str
    description: str
    enforcement: Enforcement
    resource_types: tuple[str, ...] = ()  # per-resource rules: the type tokens they check
    check_resource: ResourceCheck | None = None
    check_stack: StackCheck | None = None
    reads_stack_protected: bool = False  # needs PolicyContext.stack_protected (CrossGuard config "protected")

    def run(self, plan: Plan, ctx: PolicyContext) -> list[Violation]:
        found: list[Violation] = []
        if self.check_resource is not None:
            for resource in plan.of_type(*self.resource_types):
                found += [self._violation(resource, m) for m in self.check_resource(resource, ctx)]
        if self.check_stack is not None:
            found += [self._violation(resource, m) for resource, m in self.check_stack(plan, ctx)]
        return found

    def _violation(self, resource: PlanResource | None, message: str) -> Violation:
        return Violation(self.name, self.enforcement, resource, message)


def evaluate(plan: Plan, ctx: PolicyContext, rules: Iterable[PolicyRule] | None = None) -> list[Violation]:
    """Every violation of `rules` (default: the whole pack) in the plan, mandatory and advisory."""
    return [v for rule in (POLICIES if rules is None else rules) for v in rule.run(plan, ctx)]


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


def check_team_roles_scoped(plan: Plan, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
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


def _metadata(resource: PlanResource) -> Mapping[str, Any]:
    metadata = resource.inputs.get("metadata")
    return metadata if isinstance(metadata, Mapping) else {}


def team_namespaces(plan: Plan) -> dict[str, PlanResource]:
    """Namespace name -> Namespace, for the namespaces labelled as a tenant team's."""
    found = {}
    for namespace in plan.of_type(NAMESPACE_TYPE):
        labels = _metadata(namespace).get("labels") or {}
        name = _metadata(namespace).get("name")
        if isinstance(labels, Mapping) and isinstance(name, str) and _label_ending(labels, TEAM_LABEL_SUFFIX):
            found[name] = namespace
    return found


def check_team_namespaces_have_quota(plan: Plan, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    """A team namespace without a ResourceQuota lets a pod that bypasses Kueue (no queue label, a bare Pod) take
    every free GPU of the cluster."""
    bounded: dict[str, set[str]] = {}
    for quota in plan.of_type(RESOURCE_QUOTA_TYPE):
        spec = quota.inputs.get("spec")
        hard = spec.get("hard") if isinstance(spec, Mapping) else None
        namespace = _metadata(quota).get("namespace")
        if isinstance(namespace, str) and isinstance(hard, Mapping):
            bounded.setdefault(namespace, set()).update(str(key) for key in hard)
    for name, namespace in sorted(team_namespaces(plan).items()):
        missing = [key for key in TEAM_QUOTA_KEYS if key not in bounded.get(name, set())]
        if missing:
            yield namespace, (f"team namespace {name} has no ResourceQuota on {', '.join(missing)}"
                              if name in bounded else f"team namespace {name} has no ResourceQuota")


def check_gpu_jobs_in_team_namespaces(plan: Plan, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    """Once a stack declares tenant teams, a GPU Job outside their namespaces spends GPUs no team is charged for and
    runs with the shared Jobs role. Advisory: the stack's own Jobs (acceptance tests, platform runs) may do so."""
    teams = team_namespaces(plan)
    if not teams:
        return
    for job in plan.of_type(JOB_TYPE):
        namespace = _metadata(job).get("namespace")
        if isinstance(namespace, str) and namespace not in teams and _is_gpu_job(job):
            yield job, (f"GPU Job in namespace {namespace}, not a team's ({', '.join(sorted(teams))}): no team's "
                        "quota or role applies to it")


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


def check_buckets_encrypted(plan: Plan, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
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
    plan: Plan, ctx: PolicyContext
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


def check_buckets_tls_only(plan: Plan, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
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


# --- Kubernetes Jobs ---


def _pod_spec(job: PlanResource) -> Mapping[str, Any]:
    return ((job.inputs.get("spec") or {}).get("template") or {}).get("spec") or {}


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def _quantity(value: Any) -> Decimal | None:
    if value is None:
        return None
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def _gpus(container: Mapping[str, Any]) -> Decimal:
    resources = container.get("resources") or {}
    counts = [_quantity((resources.get(kind) or {}).get(GPU_RESOURCE)) for kind in ("limits", "requests")]
    return max((c for c in counts if c is not None), default=Decimal(0))


def _is_gpu_job(job: PlanResource) -> bool:
    return any(_gpus(c) > 0 for c in _containers(_pod_spec(job)))


def _volumes(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {v.get("name"): v for v in pod.get("volumes") or []}


def _mounted(
    container: Mapping[str, Any], volumes: Mapping[str, Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    names = [m.get("name") for m in container.get("volumeMounts") or []]
    return [volumes[n] for n in names if n in volumes]


def _is_memory_volume(volume: Mapping[str, Any]) -> bool:
    return (volume.get("emptyDir") or {}).get("medium") == "Memory"


def _is_disk_scratch(volume: Mapping[str, Any]) -> bool:
    return "emptyDir" in volume and not _is_memory_volume(volume)


def check_job_gpu_limits_equal_requests(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    if not _is_gpu_job(resource):
        return
    for container in _containers(_pod_spec(resource)):
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for name in sorted(set(limits) | set(requests)):
            limit, request = _quantity(limits.get(name)), _quantity(requests.get(name, limits.get(name)))
            if name in requests and name not in limits:
                yield (
                    f"container {container.get('name')}: requests {name} without a limit "
                    "(GPU Jobs need limits = requests)"
                )
            elif limit is not None and request is not None and limit != request:
                yield (
                    f"container {container.get('name')}: {name} limit {limits.get(name)} != request "
                    f"{requests.get(name)} (GPU Jobs need limits = requests)"
                )


def check_job_gpu_shm(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    pod = _pod_spec(resource)
    volumes = _volumes(pod)
    for container in _containers(pod):
        if _gpus(container) <= 0:
            continue
        shm = [
            m
            for m in container.get("volumeMounts") or []
            if m.get("mountPath") == "/dev/shm" and _is_memory_volume(volumes.get(m.get("name"), {}))
        ]
        if not shm:
            yield (
                f"container {container.get('name')} uses GPUs but mounts no emptyDir medium Memory at "
                "/dev/shm (the 64Mi default makes DataLoader workers crash)"
            )


def check_job_memory_covers_memory_volumes(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    pod = _pod_spec(resource)
    volumes = _volumes(pod)
    for name, volume in volumes.items():
        if _is_memory_volume(volume) and _quantity(volume["emptyDir"].get("sizeLimit")) is None:
            yield f"memory-backed volume {name} has no sizeLimit (it could take the node's memory)"
    for container in _containers(pod):
        in_memory = [v for v in _mounted(container, volumes) if _is_memory_volume(v)]
        if not in_memory:
            continue
        sizes = [_quantity(v["emptyDir"].get("sizeLimit")) for v in in_memory]
        total = sum((s for s in sizes if s is not None), Decimal(0))
        raw_limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        limit = _quantity(raw_limit)
        if limit is None:
            yield f"container {container.get('name')} mounts memory-backed volumes but has no memory limit"
        elif limit <= total:
            yield (
                f"container {container.get('name')}: memory limit {raw_limit} does not exceed its "
                f"memory-backed volumes ({', '.join(str(v.get('name')) for v in in_memory)}: {total} bytes), "
                "which count against it"
            )


def _ephemeral_limit(container: Mapping[str, Any]) -> Decimal | None:
    return _quantity(((container.get("resources") or {}).get("limits") or {}).get("ephemeral-storage"))


def check_job_ephemeral_storage_limits(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    """Disk scratch is bounded: its users set ephemeral-storage limits that together cover its sizeLimits.

    The kubelet charges emptyDir usage to the pod, whose limit is the sum over the app containers and native
    sidecars (init containers with restartPolicy Always); plain init containers run before them and add none.
    """
    pod = _pod_spec(resource)
    volumes = _volumes(pod)
    scratch = {name: v for name, v in volumes.items() if _is_disk_scratch(v)}
    if not scratch:
        return
    for container in _containers(pod):
        mounted = [v for v in _mounted(container, volumes) if _is_disk_scratch(v)]
        if mounted and _ephemeral_limit(container) is None:
            yield (
                f"container {container.get('name')} uses disk scratch "
                f"({', '.join(str(v.get('name')) for v in mounted)}) but sets no ephemeral-storage limit"
            )
    sizes = [_quantity(v["emptyDir"].get("sizeLimit")) for v in scratch.values()]
    long_running = [*(pod.get("containers") or [])]
    long_running += [c for c in pod.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
    pod_limit = sum((limit for c in long_running if (limit := _ephemeral_limit(c)) is not None), Decimal(0))
    if all(size is not None for size in sizes):
        total = sum((size for size in sizes if size is not None), Decimal(0))
        if pod_limit < total:
            yield (
                f"the containers' ephemeral-storage limits ({pod_limit} bytes) do not cover the sizeLimits "
                f"of the disk scratch volumes ({', '.join(scratch)}: {total} bytes)"
            )


def check_job_no_host_path(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    for name, volume in _volumes(_pod_spec(resource)).items():
        if "hostPath" in volume:
            yield f"volume {name} is a hostPath volume"


def check_job_not_privileged(resource: PlanResource, ctx: PolicyContext) -> Iterator[str]:
    pod = _pod_spec(resource)
    for container in [*_containers(pod), *(pod.get("ephemeralContainers") or [])]:
        if (container.get("securityContext") or {}).get("privileged") is True:
            yield f"container {container.get('name')} is privileged"


def _label_ending(labels: Mapping[str, Any], suffix: str) -> Any:
    return next((value for key, value in labels.items() if key.endswith(suffix)), None)


def check_multi_node_jobs_use_efa(plan: Plan, ctx: PolicyContext) -> Iterator[tuple[PlanResource | None, str]]:
    """A gang placed on a GPU type that has EFA node groups asks for EFA: over TCP alone the most expensive
    GPUs wait on every all-reduce."""
    efa_types = set()
    for group in plan.of_type(NODE_GROUP_TYPE):
        labels = group.inputs.get("labels") or {}
        if isinstance(labels, Mapping) and _label_ending(labels, "/efa") == "true":
            efa_types.add(_label_ending(labels, "/gpu-type"))
    for job in plan.of_type(JOB_TYPE):
        spec = job.inputs.get("spec") or {}
        selector = _pod_spec(job).get("nodeSelector") or {}
        if not isinstance(spec, Mapping) or not isinstance(selector, Mapping) or (spec.get("parallelism") or 1) < 2:
            continue
        gpu_type = _label_ending(selector, "/gpu-type")
        if gpu_type is None or gpu_type not in efa_types:
            continue
        for container in _containers(_pod_spec(job)):
            if _gpus(container) and not _quantity(((container.get("resources") or {}).get("limits") or {})
                                                  .get(EFA_RESOURCE)):
                yield job, (f"container {container.get('name')} of a {spec.get('parallelism')}-pod gang on GPU type "
                            f"{gpu_type}, which has EFA node groups, requests no {EFA_RESOURCE}")


POLICIES: tuple[PolicyRule, ...] = (
    PolicyRule(
        "s3-bucket-encrypted",
        "S3 buckets have default server-side encryption.",
        "mandatory",
        check_stack=check_buckets_encrypted,
    ),
    PolicyRule(
        "s3-bucket-public-access-blocked",
        "S3 buckets block all four kinds of public access.",
        "mandatory",
        check_stack=check_buckets_public_access_blocked,
    ),
    PolicyRule(
        "s3-bucket-tls-only",
        "Buckets refuse plain-HTTP requests (S3: bucket policy; COS: https endpoint).",
        "mandatory",
        check_stack=check_buckets_tls_only,
    ),
    PolicyRule(
        "efs-encrypted",
        "EFS file systems are encrypted at rest.",
        "mandatory",
        (EFS_TYPE,),
        check_efs_encrypted,
    ),
    PolicyRule(
        "launch-template-imdsv2",
        "Launch templates require IMDSv2 (httpTokens required).",
        "mandatory",
        (LAUNCH_TEMPLATE_TYPE,),
        check_imdsv2,
    ),
    PolicyRule(
        "gpu-node-group-tainted",
        "GPU node groups carry the nvidia.com/gpu NoSchedule taint.",
        "mandatory",
        (NODE_GROUP_TYPE,),
        check_gpu_node_group_tainted,
    ),
    PolicyRule(
        "job-gpu-limits-equal-requests",
        "GPU Jobs set limits equal to requests in every container.",
        "mandatory",
        (JOB_TYPE,),
        check_job_gpu_limits_equal_requests,
    ),
    PolicyRule(
        "job-gpu-shm",
        "GPU containers mount a memory-backed emptyDir at /dev/shm.",
        "mandatory",
        (JOB_TYPE,),
        check_job_gpu_shm,
    ),
    PolicyRule(
        "job-memory-covers-memory-volumes",
        "Memory-backed volumes have a sizeLimit and the memory limit of containers mounting them exceeds it.",
        "mandatory",
        (JOB_TYPE,),
        check_job_memory_covers_memory_volumes,
    ),
    PolicyRule(
        "job-ephemeral-storage-limits",
        "Containers using disk scratch (emptyDir) set ephemeral-storage limits.",
        "mandatory",
        (JOB_TYPE,),
        check_job_ephemeral_storage_limits,
    ),
    PolicyRule(
        "multi-node-jobs-use-efa",
        "Multi-node GPU Jobs on a GPU type with EFA node groups request vpc.amazonaws.com/efa.",
        "mandatory",
        check_stack=check_multi_node_jobs_use_efa,
    ),
    PolicyRule(
        "job-no-host-path",
        "Jobs mount no hostPath volumes.",
        "mandatory",
        (JOB_TYPE,),
        check_job_no_host_path,
    ),
    PolicyRule(
        "job-not-privileged",
        "Job containers are not privileged.",
        "mandatory",
        (JOB_TYPE,),
        check_job_not_privileged,
    ),
    PolicyRule(
        "team-roles-scoped",
        "Team roles name only S3 buckets and prefixes: no wildcard bucket, no whole bucket.",
        "mandatory",
        check_stack=check_team_roles_scoped,
    ),
    PolicyRule(
        "team-namespaces-have-quota",
        "Every tenant team's namespace has a ResourceQuota on GPU, CPU and memory requests.",
        "mandatory",
        check_stack=check_team_namespaces_have_quota,
    ),
    PolicyRule(
        "gpu-jobs-in-team-namespaces",
        "Advisory: where tenant teams are declared, GPU Jobs run in a team's namespace.",
        "advisory",
        check_stack=check_gpu_jobs_in_team_namespaces,
    ),
    PolicyRule(
        "protected-stateful-resources",
        "In protected stacks, file systems, buckets and volumes are "
        "protected, retained on delete and never force-destroyed.",
        "mandatory",
        STATEFUL_TYPES,
        check_stateful_protected,
        reads_stack_protected=True,
    ),
    PolicyRule(
        "prod-training-pools-spot",
        "Advisory: GPU training pools of protected (prod) stacks use SPOT capacity.",
        "advisory",
        (NODE_GROUP_TYPE,),
        check_prod_training_pools_spot,
        reads_stack_protected=True,
    ),
)
