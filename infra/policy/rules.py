"""The stack's policies as pure functions over its resources (no pulumi, no pulumi_policy imports).

The rules live by what they check (infra/policy/aws_rules.py, infra/policy/kubernetes_rules.py); this module is
the pack's table of them. Each policy is a `PolicyRule` (infra/policy/rule.py): per-resource rules name the type
tokens they check and return messages for one resource; stack-level rules see the whole `PlannedStack` (a bucket's
encryption, public access block and TLS policy are separate resources). `evaluate` runs them over a plan; the
CrossGuard pack (infra/policy/pack/__main__.py) wraps the same rules as ResourceValidationPolicy /
StackValidationPolicy.

Unknown values (None: an output not yet known during preview) never count as violations; `pulumi up` runs the
policies again once the values are known.
"""

from __future__ import annotations

from collections.abc import Iterable

from infra.policy.aws_rules import (
    EFS_TYPE,
    LAUNCH_TEMPLATE_TYPE,
    NODE_GROUP_TYPE,
    STATEFUL_TYPES,
    check_buckets_encrypted,
    check_buckets_public_access_blocked,
    check_buckets_tls_only,
    check_efs_encrypted,
    check_gpu_node_group_tainted,
    check_imdsv2,
    check_prod_training_pools_spot,
    check_stateful_protected,
    check_team_roles_scoped,
)
from infra.policy.kubernetes_rules import (
    JOB_TYPE,
    check_gpu_jobs_in_team_namespaces,
    check_job_ephemeral_storage_limits,
    check_job_gpu_limits_equal_requests,
    check_job_gpu_shm,
    check_job_memory_covers_memory_volumes,
    check_job_no_host_path,
    check_job_not_privileged,
    check_multi_node_jobs_use_efa,
    check_team_namespaces_have_quota,
)
from infra.policy.plan import PlannedStack
from infra.policy.rule import PolicyContext, PolicyRule, Violation

__all__ = ["POLICIES", "PolicyContext", "PolicyRule", "Violation", "evaluate"]


def evaluate(plan: PlannedStack, ctx: PolicyContext, rules: Iterable[PolicyRule] | None = None) -> list[Violation]:
    """Every violation of `rules` (default: the whole pack) in the plan, mandatory and advisory."""
    return [v for rule in (POLICIES if rules is None else rules) for v in rule.run(plan, ctx)]


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
