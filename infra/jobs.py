"""Training Jobs declared in the stack (`ml-cluster:jobs`), deployed as Kubernetes Jobs.

`TrainingNamespace` creates the Jobs' namespace early (storage puts its claims and COS Secret there).
`TrainingJobs` then creates the Jobs' ServiceAccount, on EKS a Pod Identity association whose IAM role may read
only the stack's own buckets (and write checkpoints only to the buckets that specs checkpoint to), and one
batch/v1 Job (plus a headless Service for multi-node) per spec, rendered by `workloads.jobspec.render_job`.

Lifecycle under `pulumi up`: a Job is created held (suspended; on a stack with Kueue without the queue label, its
queue recorded in an annotation) until `workloads.submit start` releases it; it carries `pulumi.com/skipAwait`, so
`up` returns at once; a queued Job depends on its Kueue LocalQueue, so `destroy` removes it first; its name holds
the spec's hash, so a changed spec replaces the Job (deleteBeforeReplace: the old run stops first) instead of
failing on an immutable field; every Job depends on the storage drivers, claims and device plugin it needs, so
`destroy` removes Jobs before the volumes under them.

ttlSecondsAfterFinished (default 7 days) deletes a finished Job in the cluster while Pulumi's state still holds
it: a plain `pulumi up` leaves it alone, but `pulumi up --refresh` would create (and so re-run) it. A stack Job
that must never re-run after a refresh sets `ttlSecondsAfterFinished: null`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.schema import ConfigError
from infra.config.stackcheck import JobBucketAccess
from infra.context import ClusterInfo, StackContext, stack_labels
from infra.iam import pod_identity_trust_policy, policy_document
from workloads.cluster_facts import ClusterFacts
from workloads.jobspec import (
    KUEUE_QUEUE_LABEL,
    EgressRules,
    JobSpecError,
    TrainingJobSpec,
    namespace_network_policies,
    queue_annotation,
    render_job,
)
from workloads.jobspec.prediction import annotate_prediction

CONFIG_KEY = "ml-cluster:jobs"

Manifest = dict[str, Any]


def check_jobs(specs: Sequence[TrainingJobSpec], facts: ClusterFacts) -> list[list[Manifest]]:
    """Render every stack Job against the cluster's facts; raise ConfigError naming each spec that cannot be.

    Called before any resource is registered, so a spec that does not fit the cluster stops the program early.
    A spec of a tenant team renders in that team's namespace (`facts.teams`). Each run carries its predicted
    goodput as an annotation (the plan's `jobGoodput` figure), for `submit status|watch`.
    """
    rendered, problems = [], []
    for index, spec in enumerate(specs):
        try:
            # Suspended unless the spec says otherwise: no GPU hours before the data is there (submit start).
            manifests = render_job(spec, facts, suspended_by_default=True)
            annotate_prediction(manifests[0], spec, facts)  # submit status prints it beside the measured goodput
            rendered.append(manifests)
        except JobSpecError as error:
            problems.append((f"{CONFIG_KEY}[{index}].{error.path}", error.reason))
    if problems:
        raise ConfigError(problems)
    return rendered


def namespace_manifest(name: str, stack: str, label_prefix: str) -> Manifest:
    """The Jobs' namespace; Pod Security `restricted` is enforced (every rendered Job complies)."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                **stack_labels(stack, label_prefix),
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            },
        },
    }


def service_account_manifest(name: str, namespace: str, stack: str, label_prefix: str) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/component": "training", **stack_labels(stack, label_prefix)},
        },
    }


def bucket_name_of(bucket_arn: str) -> str:
    return bucket_arn.split(":::", 1)[1]


def job_access_policy(readable_arns: Sequence[str], writable_arns: Sequence[str]) -> str:
    """Read on the buckets the Jobs stage or resume from; checkpoint writes only on the buckets they checkpoint to.

    Which buckets those are is derived from the specs before any resource exists
    (infra.config.stackcheck.job_bucket_access), where a bucket the stack cannot grant is a config error.
    """
    bucket_arns = sorted(set(readable_arns) | set(writable_arns))
    statements: list[dict[str, Any]] = [
        {"Sid": "ListStackBuckets", "Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
         "Resource": sorted(bucket_arns)},
        {"Sid": "ReadStackObjects", "Effect": "Allow", "Action": ["s3:GetObject"],
         "Resource": sorted(f"{arn}/*" for arn in bucket_arns)},
    ]
    writable = sorted(set(writable_arns))
    if writable:
        statements.append({
            "Sid": "WriteCheckpoints", "Effect": "Allow",
            "Action": ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts",
                       "s3:DeleteObject"],
            "Resource": [f"{arn}/*" for arn in writable],
        })
    return policy_document(*statements)


@dataclass(frozen=True)
class TrainingNamespaceArgs:
    cluster: ClusterInfo
    facts: ClusterFacts
    egress: EgressRules | None = None  # None: egress open
    # The namespace whose Prometheus scrapes the Jobs (None: monitoring off, no ingress at all), and the ports.
    metrics_namespace: str | None = None
    metrics_ports: tuple[int, ...] = ()


class TrainingNamespace(pulumi.ComponentResource):
    """The Jobs' namespace; created before storage, which puts claims and Secrets in it."""

    def __init__(self, ctx: StackContext, args: TrainingNamespaceArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:TrainingNamespace", ctx.name("jobs", "namespace"), None, opts)
        manifest = namespace_manifest(args.facts.namespace, ctx.stack, ctx.label_prefix)
        self.name = args.facts.namespace
        self.namespace = k8s.core.v1.Namespace(
            ctx.name("jobs", f"ns-{self.name}"), metadata=manifest["metadata"],
            opts=pulumi.ResourceOptions(parent=self, provider=args.cluster.provider,
                                        depends_on=list(args.cluster.eks_dependencies)))
        labels = manifest["metadata"]["labels"]
        policy_labels = {k: v for k, v in labels.items() if not k.startswith("pod-security.")}
        for policy in namespace_network_policies(self.name, policy_labels, metrics_namespace=args.metrics_namespace,
                                                 metrics_ports=args.metrics_ports, egress=args.egress):
            k8s.networking.v1.NetworkPolicy(
                ctx.name("jobs", f"netpol-{policy['metadata']['name']}"), metadata=policy["metadata"],
                spec=policy["spec"], opts=pulumi.ResourceOptions(parent=self, provider=args.cluster.provider,
                                                                 depends_on=[self.namespace]))
        self.register_outputs({"name": self.name})


@dataclass(frozen=True)
class TrainingJobsArgs:
    cluster: ClusterInfo
    facts: ClusterFacts
    specs: Sequence[TrainingJobSpec]
    # Each spec's manifests as the facts phase rendered and checked them (check_jobs), in spec order: never
    # rendered again.
    rendered: Sequence[Sequence[Manifest]]
    namespace: pulumi.Resource  # TrainingNamespace.namespace
    bucket_arns: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # the stack's S3 buckets by key
    bucket_access: JobBucketAccess = JobBucketAccess()  # which of them the Jobs read and write
    # Storage drivers, dataset/checkpoint claims, COS Secret, NVIDIA device plugin: what a Job needs to start and
    # what `destroy` must keep until the Jobs are gone.
    depends_on: Sequence[pulumi.Resource] = ()
    # Kueue LocalQueues by name: a queued Job depends on its queue, so `destroy` deletes the Job (and its Workload)
    # before the queue, whose finalizer waits for its workloads.
    local_queues: Mapping[str, pulumi.Resource] = field(default_factory=dict)
    # Tenant teams: what a team's Job needs first (namespace, service account, Pod Identity association, its claim:
    # infra.tenancy.Teams).
    team_needs: Mapping[str, Sequence[pulumi.Resource]] = field(default_factory=dict)


# The typed resource classes of the objects a run renders; any other kind of the kind table (a controller's custom
# resource) is registered as a CustomResource of its apiVersion and kind.
_TYPED: dict[tuple[str, str], Any] = {
    ("batch/v1", "Job"): k8s.batch.v1.Job,
    ("v1", "Service"): k8s.core.v1.Service,
    ("networking.k8s.io/v1", "NetworkPolicy"): k8s.networking.v1.NetworkPolicy,
}
_COMPANION_SUFFIX = {"Service": "service", "NetworkPolicy": "netpol"}


def _companion_suffix(manifest: Manifest) -> str:
    return _COMPANION_SUFFIX.get(manifest["kind"], manifest["kind"].lower())


def register_manifest(name: str, manifest: Manifest, opts: pulumi.ResourceOptions) -> pulumi.Resource:
    """One rendered object as a Pulumi resource: its typed class, else a CustomResource."""
    typed = _TYPED.get((manifest["apiVersion"], manifest["kind"]))
    if typed is not None:
        resource: pulumi.Resource = typed(name, metadata=manifest["metadata"], spec=manifest["spec"], opts=opts)
        return resource
    return k8s.apiextensions.CustomResource(name, api_version=manifest["apiVersion"], kind=manifest["kind"],
                                            metadata=manifest["metadata"], spec=manifest["spec"], opts=opts)


class TrainingJobs(pulumi.ComponentResource):
    def __init__(self, ctx: StackContext, args: TrainingJobsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:TrainingJobs", ctx.name("jobs", "all"), None, opts)
        cluster, facts = args.cluster, args.facts
        # Rendered and checked before any resource was registered (infra.facts): a spec that cannot be rendered
        # failed there.
        rendered = list(zip(args.specs, args.rendered, strict=True))
        in_cluster = pulumi.ResourceOptions(parent=self, provider=cluster.provider)

        account = service_account_manifest(facts.job_service_account, facts.namespace, ctx.stack, ctx.label_prefix)
        self.service_account = k8s.core.v1.ServiceAccount(
            ctx.name("jobs", "service-account"), metadata=account["metadata"],
            opts=pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(depends_on=[args.namespace])))
        job_needs: list[pulumi.Resource] = [args.namespace, self.service_account, *args.depends_on]

        self.role_arn: pulumi.Output[str] | None = None
        access = args.bucket_access
        if cluster.is_eks and access.used:
            child = pulumi.ResourceOptions(parent=self)
            role = aws.iam.Role(ctx.name("jobs", "role"), assume_role_policy=pod_identity_trust_policy(),
                                description=f"Training Jobs of {ctx.stack}: the stack buckets they use",
                                tags=ctx.tags, opts=child)
            readable = [args.bucket_arns[key] for key in access.read]
            writable = [args.bucket_arns[key] for key in access.write]
            aws.iam.RolePolicy(ctx.name("jobs", "bucket-access"), role=role.id,
                               policy=pulumi.Output.all(readable, writable).apply(
                                   lambda arns: job_access_policy(arns[0], arns[1])),
                               opts=child)
            association = aws.eks.PodIdentityAssociation(
                ctx.name("jobs", "pod-identity"), cluster_name=cluster.name, namespace=facts.namespace,
                service_account=facts.job_service_account, role_arn=role.arn, tags=ctx.tags,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.service_account]))
            self.role_arn = role.arn
            job_needs.append(association)

        self.job_names: dict[str, str] = {}  # spec name -> Job name (with the spec hash)
        for spec, manifests in rendered:
            workload, *companions = manifests
            namespace_needs = ([args.namespace] if spec.team is None
                               else list(args.team_needs.get(spec.team, []))[:1])
            companion_opts = pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(
                depends_on=namespace_needs, delete_before_replace=True))
            # in the wrapper's order (an Indexed Job: its headless Service, then its NetworkPolicy)
            companion_resources = [
                register_manifest(ctx.name("jobs", f"{spec.name}-{_companion_suffix(manifest)}"), manifest,
                                  companion_opts)
                for manifest in companions]
            queue = workload["metadata"]["labels"].get(KUEUE_QUEUE_LABEL) or workload["metadata"]["annotations"].get(
                queue_annotation(ctx.label_prefix))
            queue_needs = [args.local_queues[queue]] if queue in args.local_queues else []
            register_manifest(
                ctx.name("jobs", spec.name), workload,
                pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(
                    delete_before_replace=True,
                    depends_on=[*(job_needs if spec.team is None else args.team_needs.get(spec.team, [])),
                                *companion_resources, *queue_needs],
                    # `submit start` and Kueue resume suspended Jobs, and `submit start` puts a held Job in its
                    # Kueue queue; neither is drift to undo on the next `up` (Kueue refuses a queue change on a
                    # running Job).
                    ignore_changes=["spec.suspend", f'metadata.labels["{KUEUE_QUEUE_LABEL}"]'])))
            self.job_names[spec.name] = workload["metadata"]["name"]
        self.register_outputs({"jobNames": self.job_names})
