"""Every physical name a stack derives, from its parsed config, checked before any resource is registered.

`derived_names` lists what each receiving service will see (S3 bucket names, IAM role and EKS node-group names
after Pulumi's auto-naming suffix, the CloudWatch log group, Kubernetes objects by kind/namespace/name, label
values); `check_derived_names` applies each service's naming rules and checks uniqueness across the whole stack.
`check_stack_name` rejects a stack name that cannot become part of those names, and says why.

No Pulumi import here: the list is derived from config alone (plus the rendered Job manifests, which the caller
passes in), so the same check runs in `pulumi up`, `pulumi preview` and the offline plan.
"""

from __future__ import annotations

import ipaddress
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.config.base import JOBS_NAMESPACE
from infra.config.nodepools import BURN_IN_NAME
from infra.config.queueing import (
    PROVISIONING_CHECK,
    TEAM_KUEUE_VIEW_BINDING,
    TEAM_KUEUE_VIEWER,
    TEAM_LIMITS_NAME,
    TEAM_QUOTA_NAME,
    TeamConfig,
)
from workloads.cluster_facts import FACTS_CONFIG_MAP
from workloads.jobspec import namespace_network_policies
from workloads.k8snames import is_dns_label, is_dns_subdomain, is_label_value

if TYPE_CHECKING:
    from infra.config.schema import StackConfig

CONFIG = "ml-cluster:"
STACK_PATH = "stack"
JOBS_SERVICE_ACCOUNT = "training"  # ClusterFacts.job_service_account
PACK_SERVICE_ACCOUNT = "packer"  # ClusterFacts.pack_service_account: dataset packs (infra/packing.py)
COS_JOB_SECRET = "cos-credentials"  # infra.storage.COS_JOB_SECRET
AUTONAME_SUFFIX = 8  # Pulumi auto-naming appends "-" and 7 random hex characters to the logical name
PLACEHOLDER_ACCOUNT = "000000000000"  # account ids are always 12 digits: right for every length rule

_S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IAM_NAME = re.compile(r"^[\w+=,.@-]+$")

# Kubernetes kinds whose names are DNS-1123 labels (the rest are subdomains).
_LABEL_NAMED_KINDS = {"Namespace", "Service"}


@dataclass(frozen=True)
class DerivedName:
    """One name a service receives: `service` (s3, cos, iam, eks, logs, kubernetes, label), `kind`, the Kubernetes
    namespace ("" where there is none), the name itself, and the config path that produced it."""

    service: str
    kind: str
    namespace: str
    name: str
    path: str
    unique: bool = True  # False: checked against the service's rules only (e.g. a label value)


def stack_prefix(stack: str) -> str:
    """Logical-name prefix `mlc-<stack>` (also the start of default bucket names)."""
    return f"mlc-{stack}"


def default_bucket_name(stack: str, key: str, account_id: str | None) -> str:
    """`<prefix>-<key>[-<account>]`: the account id keeps S3's global namespace from colliding."""
    return f"{stack_prefix(stack)}-{key}" + (f"-{account_id}" if account_id else "")


def s3_claim_name(bucket_key: str) -> str:
    return f"s3-{bucket_key}"


def cos_claim_name(bucket_key: str) -> str:
    return f"cos-{bucket_key}"


def static_volume_name(namespace: str, claim: str) -> str:
    return f"{namespace}-{claim}"


def check_stack_name(stack: str) -> list[tuple[str, str]]:
    """A stack name becomes part of bucket names (lower-case, digits, '-'), label values and DNS names."""
    if not is_dns_label(stack, max_length=None):
        return [(STACK_PATH, f"{stack!r} is not a valid stack name: use lower-case letters, digits and '-', "
                             "starting and ending with a letter or digit (it becomes part of S3 bucket names, "
                             "IAM role names, Kubernetes labels and DNS names)")]
    return []


@dataclass(frozen=True)
class _Naming:
    """What every capability's names are derived from besides its own config."""

    cfg: StackConfig
    stack: str
    account: str  # the account id, or PLACEHOLDER_ACCOUNT
    job_manifests: Sequence[Sequence[dict[str, Any]]]

    @property
    def prefix(self) -> str:
        return stack_prefix(self.stack)

    @property
    def eks(self) -> bool:
        return self.cfg.platform == "eks"

    def role(self, logical: str, path: str) -> DerivedName:  # auto-named: the logical name plus Pulumi's suffix
        return DerivedName("iam", "role", "", f"{logical}-xxxxxxx", path)

    def network_policies(self, namespace: str, path: str) -> Iterator[DerivedName]:
        """The NetworkPolicies every namespace Jobs run in gets (infra/jobs.py, infra/tenancy.py)."""
        monitoring = self.cfg.monitoring
        scraper = monitoring.prometheus_namespace if monitoring.enabled else None
        for policy in namespace_network_policies(namespace, {}, metrics_ports=(1,), metrics_namespace=scraper,
                                                 egress=self.cfg.job_egress.rules(self.cfg.platform)):
            yield DerivedName("kubernetes", "NetworkPolicy", namespace, policy["metadata"]["name"], path)


def _cluster_names(n: _Naming) -> Iterator[DerivedName]:
    """The stack name in labels on every object; the EKS cluster, its log group and roles."""
    yield DerivedName("label", "label value", "", n.stack, STACK_PATH, unique=False)
    if n.eks:
        assert n.cfg.cluster is not None
        yield DerivedName("eks", "cluster", "", n.cfg.cluster.name, f"{CONFIG}cluster.name")
        yield DerivedName("logs", "log group", "", f"/aws/eks/{n.cfg.cluster.name}/cluster", f"{CONFIG}cluster.name")
        yield n.role(f"{n.prefix}-cluster-role", STACK_PATH)
        yield n.role(f"{n.prefix}-cluster-node-role", STACK_PATH)


def _storage_aws_names(n: _Naming) -> Iterator[DerivedName]:
    """The CSI drivers' roles, the S3 buckets (EKS) and the COS buckets."""
    storage = n.cfg.storage
    if n.eks:
        kept = storage.external_addons  # the cluster's own drivers: no role of the stack's
        if "aws-ebs-csi-driver" not in kept:
            yield n.role(f"{n.prefix}-storage-ebs-csi-role", STACK_PATH)
        if storage.efs is not None and "aws-efs-csi-driver" not in kept:
            yield n.role(f"{n.prefix}-storage-efs-csi-role", f"{CONFIG}storage.efs")
        if any(bucket.mount for bucket in storage.buckets) and "aws-mountpoint-s3-csi-driver" not in kept:
            yield n.role(f"{n.prefix}-storage-mountpoint-s3-csi-role", f"{CONFIG}storage.buckets")
        for index, bucket in enumerate(storage.buckets):
            physical = bucket.bucket_name or default_bucket_name(n.stack, bucket.name, n.account)
            where = "bucketName" if bucket.bucket_name else "name"
            yield DerivedName("s3", "bucket", "", physical, f"{CONFIG}storage.buckets[{index}].{where}")
    if storage.cos is not None:
        for index, cos_bucket in enumerate(storage.cos.buckets):
            physical = cos_bucket.bucket_name or default_bucket_name(n.stack, cos_bucket.name, None)
            where = "bucketName" if cos_bucket.bucket_name else "name"
            yield DerivedName("cos", "bucket", "", physical, f"{CONFIG}storage.cos.buckets[{index}].{where}")


def _node_names(n: _Naming) -> Iterator[DerivedName]:
    """EKS: the managed node groups, the autoscaler's role and the image registry."""
    if not n.eks:
        return
    for index, pool in enumerate(n.cfg.node_pools):
        if pool.instance_types:
            yield DerivedName("eks", "node group", "", f"{n.prefix}-nodepools-{pool.name}-ng-xxxxxxx",
                              f"{CONFIG}nodePools[{index}].name")
    if n.cfg.nodes.autoscaler.enabled and n.cfg.nodes.autoscaler.external is None:
        yield n.role(f"{n.prefix}-gpu-autoscaler-role", f"{CONFIG}nodes.autoscaler")
    if n.cfg.registry.enabled:
        yield DerivedName("ecr", "repository", "", f"{n.prefix}-{n.cfg.registry.repository}",
                          f"{CONFIG}registry.repository")


def _job_names(n: _Naming) -> Iterator[DerivedName]:
    """The Jobs' namespace, service accounts, NetworkPolicies and roles (the stack Jobs themselves come last)."""
    buckets = n.cfg.storage.buckets
    packs = n.eks and any(bucket.pack_into for bucket in buckets)
    if n.eks and buckets:
        yield n.role(f"{n.prefix}-jobs-role", f"{CONFIG}storage.buckets")
    if packs:
        yield n.role(f"{n.prefix}-pack-role", f"{CONFIG}storage.buckets")
    yield DerivedName("kubernetes", "Namespace", "", JOBS_NAMESPACE, STACK_PATH)
    yield DerivedName("kubernetes", "ServiceAccount", JOBS_NAMESPACE, JOBS_SERVICE_ACCOUNT, STACK_PATH)
    # what submit reads through a kubeconfig alone (workloads/submit/facts.py)
    yield DerivedName("kubernetes", "ConfigMap", JOBS_NAMESPACE, FACTS_CONFIG_MAP, STACK_PATH)
    if packs:
        yield DerivedName("kubernetes", "ServiceAccount", JOBS_NAMESPACE, PACK_SERVICE_ACCOUNT,
                          f"{CONFIG}storage.buckets")
    yield from n.network_policies(JOBS_NAMESPACE, STACK_PATH)


def _storage_object_names(n: _Naming) -> Iterator[DerivedName]:
    """StorageClasses, static PVs and their claims, the COS Secrets, shared volumes."""
    storage, ns = n.cfg.storage, JOBS_NAMESPACE
    if n.eks and storage.gp3 is not None:
        yield DerivedName("kubernetes", "StorageClass", "", storage.gp3.name, f"{CONFIG}storage.gp3.name")
    if n.eks and storage.efs is not None:
        yield DerivedName("kubernetes", "StorageClass", "", storage.efs.storage_class.name,
                          f"{CONFIG}storage.efs.storageClass.name")
    if storage.nfs is not None:
        yield DerivedName("kubernetes", "StorageClass", "", storage.nfs.storage_class_name,
                          f"{CONFIG}storage.nfs.storageClassName")
    for index, bucket in enumerate(storage.buckets if n.eks else []):
        if bucket.mount:
            claim = s3_claim_name(bucket.name)
            path = f"{CONFIG}storage.buckets[{index}].name"
            yield DerivedName("kubernetes", "PersistentVolume", "", static_volume_name(ns, claim), path)
            yield DerivedName("kubernetes", "PersistentVolumeClaim", ns, claim, path)
    if storage.cos is not None:
        yield from _cos_object_names(n)
    for index, volume in enumerate(storage.shared_volumes):
        yield DerivedName("kubernetes", "PersistentVolumeClaim", ns, volume.name,
                          f"{CONFIG}storage.sharedVolumes[{index}].name")
    if n.eks and storage.fsx_lustre is not None:
        claim, path = storage.fsx_lustre.claim_name, f"{CONFIG}storage.fsxLustre.claimName"
        yield DerivedName("kubernetes", "PersistentVolume", "", static_volume_name(ns, claim), path)
        yield DerivedName("kubernetes", "PersistentVolumeClaim", ns, claim, path)


def _cos_object_names(n: _Naming) -> Iterator[DerivedName]:
    cos, ns = n.cfg.storage.cos, JOBS_NAMESPACE
    assert cos is not None
    yield DerivedName("kubernetes", "Secret", ns, COS_JOB_SECRET, f"{CONFIG}storage.cos")
    if n.eks:
        return
    yield DerivedName("kubernetes", "Secret", ns, cos.secret_name, f"{CONFIG}storage.cos.secretName")
    yield DerivedName("kubernetes", "StorageClass", "", cos.storage_class_name, f"{CONFIG}storage.cos.storageClassName")
    for index, cos_bucket in enumerate(cos.buckets):
        if cos_bucket.mount:
            claim = cos_claim_name(cos_bucket.name)
            path = f"{CONFIG}storage.cos.buckets[{index}].name"
            if cos.driver == "csi-s3":
                yield DerivedName("kubernetes", "PersistentVolume", "", static_volume_name(ns, claim), path)
            yield DerivedName("kubernetes", "PersistentVolumeClaim", ns, claim, path)


def _monitoring_names(n: _Naming) -> Iterator[DerivedName]:
    monitoring = n.cfg.monitoring
    if monitoring.enabled:
        where = f"{CONFIG}monitoring.namespace"
        if monitoring.external is None:  # an adopted Prometheus's namespace is its own
            yield DerivedName("kubernetes", "Namespace", "", monitoring.namespace, where)
        for kind, name in monitoring.side_objects():
            yield DerivedName("kubernetes", kind, monitoring.prometheus_namespace, name, where)


def _burn_in_names(n: _Naming) -> Iterator[DerivedName]:
    cfg, health = n.cfg, n.cfg.gpu.health
    if not (health.runs(cfg.protected) and any(pool.gpu for pool in cfg.node_pools)):
        return
    where = f"{CONFIG}gpu.health.namespace"
    yield DerivedName("kubernetes", "Namespace", "", health.namespace, where)
    yield DerivedName("kubernetes", "ServiceAccount", health.namespace, BURN_IN_NAME, where)
    yield DerivedName("kubernetes", "ClusterRole", "", f"{n.stack}-{BURN_IN_NAME}", where)
    yield DerivedName("kubernetes", "ClusterRoleBinding", "", f"{n.stack}-{BURN_IN_NAME}", where)
    for index, pool in enumerate(cfg.node_pools):
        if pool.gpu:
            yield DerivedName("kubernetes", "DaemonSet", health.namespace, f"{BURN_IN_NAME}-{pool.name}",
                              f"{CONFIG}nodePools[{index}].name")


def _queue_names(n: _Naming) -> Iterator[DerivedName]:
    """Kueue's queues, teams and priority classes (its ResourceFlavors are named after the pools' GPU types, which
    only the instance-type facts know)."""
    kueue = n.cfg.kueue
    if not kueue.enabled:
        return
    yield DerivedName("kubernetes", "ClusterQueue", "", kueue.cluster_queue, f"{CONFIG}kueue.clusterQueue")
    yield DerivedName("kubernetes", "LocalQueue", JOBS_NAMESPACE, kueue.local_queue, f"{CONFIG}kueue.localQueue")
    if not kueue.viewer_roles_aggregated and any(team.binding_names for team in kueue.tenant_teams):
        yield DerivedName("kubernetes", "ClusterRole", "", f"{n.stack}-{TEAM_KUEUE_VIEWER}", f"{CONFIG}kueue.external")
    for index, team in enumerate(kueue.teams):
        where = f"{CONFIG}kueue.teams[{index}]"
        yield DerivedName("kubernetes", "ClusterQueue", "", team.name, f"{where}.name")
        yield DerivedName("kubernetes", "LocalQueue", team.namespace or JOBS_NAMESPACE, team.name, f"{where}.name")
        if team.namespace is not None:
            yield from _tenant_names(n, index, team)
    if kueue.topology.enabled and kueue.topology.provisioning:  # its Topologies are named after facts' depths
        for kind in ("ProvisioningRequestConfig", "AdmissionCheck"):
            yield DerivedName("kubernetes", kind, "", PROVISIONING_CHECK, f"{CONFIG}kueue.topology.provisioning")
    for index, priority in enumerate(kueue.priority_classes):
        yield DerivedName("kubernetes", "WorkloadPriorityClass", "", priority.name,
                          f"{CONFIG}kueue.priorityClasses[{index}].name")


def _tenant_names(n: _Naming, index: int, team: TeamConfig) -> Iterator[DerivedName]:
    """A tenant team: its own namespace and objects, (EKS) a role named after it."""
    where, team_ns = f"{CONFIG}kueue.teams[{index}]", team.namespace
    assert team_ns is not None
    yield DerivedName("kubernetes", "Namespace", "", team_ns, f"{where}.namespace")
    yield from n.network_policies(team_ns, f"{where}.namespace")
    yield DerivedName("kubernetes", "ResourceQuota", team_ns, TEAM_QUOTA_NAME, f"{where}.namespace")
    yield DerivedName("kubernetes", "LimitRange", team_ns, TEAM_LIMITS_NAME, f"{where}.namespace")
    yield DerivedName("kubernetes", "ServiceAccount", team_ns, JOBS_SERVICE_ACCOUNT, f"{where}.namespace")
    yield DerivedName("kubernetes", "ConfigMap", team_ns, FACTS_CONFIG_MAP, f"{where}.namespace")
    kueue_view = [TEAM_KUEUE_VIEW_BINDING] if team.binding_names and not n.cfg.kueue.viewer_roles_aggregated else []
    for binding in [*team.binding_names, *kueue_view]:
        yield DerivedName("kubernetes", "RoleBinding", team_ns, binding, f"{where}.members")
    if team.volume is not None and team.volume_name is not None:
        yield DerivedName("kubernetes", "PersistentVolume", "", team.volume_name, f"{where}.volume.claim")
        yield DerivedName("kubernetes", "PersistentVolumeClaim", team_ns, team.volume.claim, f"{where}.volume.claim")
    fsx = n.cfg.storage.fsx_lustre
    if n.eks and fsx is not None and fsx.team_directories and team.checkpoints:
        # Its FSx for Lustre directory (stackcheck.fsx_team_associations): a static PV and the claim in its namespace.
        path = f"{CONFIG}storage.fsxLustre.claimName"
        yield DerivedName("kubernetes", "PersistentVolume", "", static_volume_name(team_ns, fsx.claim_name), path)
        yield DerivedName("kubernetes", "PersistentVolumeClaim", team_ns, fsx.claim_name, path)
    if n.eks:
        yield DerivedName("iam", "role", "", f"{n.prefix}-team-{team.name}", f"{where}.name")


def _controller_names(n: _Naming) -> Iterator[DerivedName]:
    """The stack's ClusterTrainingRuntimes that config names (the staged ones; `torch-distributed-<gpu type>` are
    named after the pools' GPU types, which only the instance-type facts know)."""
    trainer = n.cfg.job_controllers.trainer
    if not trainer.enabled:
        return
    for index, runtime in enumerate(trainer.staged_runtimes):
        yield DerivedName("kubernetes", "ClusterTrainingRuntime", "", runtime.name,
                          f"{CONFIG}jobControllers.trainer.stagedRuntimes[{index}].name")


def _stack_job_names(n: _Naming) -> Iterator[DerivedName]:
    """Every object of every rendered stack Job (a Job, its headless Service and NetworkPolicy)."""
    for index, manifests in enumerate(n.job_manifests):
        for manifest in manifests:
            metadata = manifest.get("metadata") or {}
            yield DerivedName("kubernetes", str(manifest.get("kind")), str(metadata.get("namespace") or ""),
                              str(metadata.get("name")), f"{CONFIG}jobs[{index}].name")


# Per capability, in the order names are listed (a name two capabilities share is reported on the later one).
_CAPABILITIES: tuple[Callable[[_Naming], Iterator[DerivedName]], ...] = (
    _cluster_names, _storage_aws_names, _node_names, _job_names, _storage_object_names, _monitoring_names,
    _burn_in_names, _queue_names, _controller_names, _stack_job_names)


def derived_names(cfg: StackConfig, stack: str, account_id: str | None = None,
                  job_manifests: Sequence[Sequence[dict[str, Any]]] = ()) -> list[DerivedName]:
    """Every physical name the stack would create, capability by capability, each in config order.

    `job_manifests` are the rendered manifests of `cfg.jobs` (index-aligned); without them Jobs are not listed.
    """
    naming = _Naming(cfg, stack, account_id or PLACEHOLDER_ACCOUNT, job_manifests)
    return [name for capability in _CAPABILITIES for name in capability(naming)]


def _rule_violation(item: DerivedName) -> str | None:
    """Why `item` breaks its service's naming rules, or None."""
    name = item.name
    if item.service in ("s3", "cos"):
        if not 3 <= len(name) <= 63:
            return f"bucket name {name!r} is {len(name)} characters (S3 allows 3 to 63)"
        if not _S3_BUCKET.match(name) or ".." in name or name.startswith("xn--") or name.endswith("-s3alias"):
            return f"bucket name {name!r} is not valid (lower-case letters, digits, '.' and '-')"
        try:
            ipaddress.IPv4Address(name)
            return f"bucket name {name!r} looks like an IP address"
        except ValueError:
            return None
    if item.service == "iam":
        if len(name) > 64:
            suffix = " (with Pulumi's 8-character suffix)" if name.endswith("-xxxxxxx") else ""
            return f"IAM role name {name!r}{suffix} is {len(name)} characters (IAM allows 64)"
        return None if _IAM_NAME.match(name) else f"IAM role name {name!r} has characters IAM does not allow"
    if item.service == "eks":
        limit = 63 if item.kind == "node group" else 100
        if len(name) > limit or not re.match(r"^[0-9A-Za-z][A-Za-z0-9_-]*$", name):
            return (f"EKS {item.kind} name {name!r} is {len(name)} characters or has characters EKS rejects "
                    f"(letters, digits, '-', '_'; at most {limit})")
        return None
    if item.service == "ecr":
        return None if 2 <= len(name) <= 256 else f"ECR repository name {name!r} is {len(name)} characters (2-256)"
    if item.service == "logs":
        return None if len(name) <= 512 else f"log group name {name!r} is longer than 512"
    if item.service == "label":
        if not is_label_value(name):
            return f"{name!r} is not a Kubernetes label value (at most 63 letters, digits, '-', '_', '.')"
        return None
    if item.service == "kubernetes":
        if item.kind in _LABEL_NAMED_KINDS:
            if not is_dns_label(name):
                return f"{item.kind} name {name!r} is not a DNS-1123 label (at most 63)"
        elif not is_dns_subdomain(name):
            return f"{item.kind} name {name!r} is not a DNS-1123 subdomain (at most 253)"
    return None


def check_derived_names(names: Iterable[DerivedName], stack: str) -> list[tuple[str, str]]:
    """(path, why) for every derived name that breaks its service's rules, and for every name two resources share.

    A name that breaks a rule only because of the stack name is reported on `stack`.
    """
    problems: list[tuple[str, str]] = []
    seen: dict[tuple[str, str, str, str], list[DerivedName]] = defaultdict(list)
    for item in names:
        why = _rule_violation(item)
        if why is not None:
            blame_stack = item.path != STACK_PATH and stack and stack in item.name and _rule_violation(
                DerivedName(item.service, item.kind, item.namespace, item.name.replace(stack, "x"), item.path)
            ) is None
            if blame_stack:
                problems.append((STACK_PATH, f"{stack!r} is too long for {item.path}: {why}"))
            elif item.path == STACK_PATH:
                problems.append((STACK_PATH, f"{stack!r} cannot be used: {why}"))
            else:
                problems.append((item.path, why))
        if item.unique:
            group = "bucket" if item.service in ("s3", "cos") else item.kind
            seen[(item.service, group, item.namespace, item.name)].append(item)
    for (service, kind, namespace, name), items in seen.items():
        if len(items) > 1:
            where = f" in namespace {namespace}" if namespace else ""
            others = ", ".join(item.path for item in items[1:])
            what = f"{service.upper()} bucket" if kind == "bucket" else kind
            problems.append((items[0].path, f"{what} {name!r}{where} is also the name given by {others}: "
                                            "two resources cannot share one name"))
    unique: list[tuple[str, str]] = []
    for problem in problems:  # one line per problem, even when several names break the same rule
        if problem not in unique:
            unique.append(problem)
    about_stack = [why for path, why in unique if path == STACK_PATH]
    if len(about_stack) > 1:  # one stack name breaks many names: say it once, with the first example
        unique = [(path, why) for path, why in unique if path != STACK_PATH]
        unique.insert(0, (STACK_PATH, f"{about_stack[0]} (and {len(about_stack) - 1} more derived names); "
                                      "use a shorter stack name"))
    return unique
