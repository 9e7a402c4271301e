"""Teams as tenants: each team with a namespace (ml-cluster:kueue.teams[].namespace) shares the GPUs, not the data.

Per tenant team: its namespace (Pod Security restricted, the training namespace's NetworkPolicies: ingress denied,
egress as configured), a ResourceQuota equal to the most its Kueue ClusterQueue can ever have admitted (so Kueue's
admissions always fit and nothing that bypasses Kueue gets more), a LimitRange giving containers without requests
defaults (a ResourceQuota on requests refuses pods without them), a service account, and on EKS an IAM role bound to
it by Pod Identity whose policy names only the team's own bucket prefixes: read its datasets, read and write its
checkpoints. The LocalQueue is made with the other queues (infra.queueing), in the team's namespace.

Everything but the component is a pure function of the config, so tests check the manifests and policies (and run
the policies against moto with IAM enforced) without a Pulumi engine.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.cluster import ACCESS_POLICIES
from infra.config.queueing import (
    TEAM_EFS_ROOT,
    TEAM_KUEUE_VIEW_BINDING,
    TEAM_KUEUE_VIEWER,
    TEAM_LIMITS_NAME,
    TEAM_PRINCIPALS_BINDING,
    TEAM_QUOTA_NAME,
    KueueConfig,
    TeamConfig,
    TeamDataConfig,
    TeamVolumeConfig,
)
from infra.context import ClusterInfo, StackContext, stack_labels
from infra.iam import pod_identity_trust_policy, policy_document
from infra.jobs import namespace_manifest, service_account_manifest
from infra.nodes.poolplan import PoolPlan
from infra.policy.aws_rules import TEAM_ROLE_TAG  # tags each team role: the policy pack finds team roles by it
from infra.quota import Amounts, team_ceiling
from workloads.cluster_facts import TeamFacts
from workloads.jobspec import EgressRules, namespace_network_policies

Manifest = dict[str, Any]

# Defaults for a container that names no requests or limits (sidecars, debug pods); rendered Jobs set their own.
DEFAULT_REQUESTS = {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "1Gi"}
DEFAULT_LIMITS = {"memory": "1Gi", "ephemeral-storage": "1Gi"}


def team_label(label_prefix: str) -> str:
    return f"{label_prefix}/team"


def team_namespace_manifest(team: TeamConfig, stack: str, label_prefix: str) -> Manifest:
    assert team.namespace is not None
    manifest = namespace_manifest(team.namespace, stack, label_prefix)
    manifest["metadata"]["labels"][team_label(label_prefix)] = team.name
    return manifest


def _labels(team: TeamConfig, stack: str, label_prefix: str) -> dict[str, str]:
    return {**stack_labels(stack, label_prefix), team_label(label_prefix): team.name}


def resource_quota_manifest(team: TeamConfig, ceiling: Amounts, stack: str, label_prefix: str) -> Manifest:
    """requests.* (and limits.memory, which covers memory-backed emptyDirs) up to the team queue's ceiling."""
    assert team.namespace is not None
    quantities = ceiling.quantities()
    hard = {f"requests.{name}": value for name, value in quantities.items()}
    hard["limits.nvidia.com/gpu"] = quantities["nvidia.com/gpu"]
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": TEAM_QUOTA_NAME, "namespace": team.namespace,
                         "labels": _labels(team, stack, label_prefix)},
            "spec": {"hard": hard}}


def limit_range_manifest(team: TeamConfig, stack: str, label_prefix: str) -> Manifest:
    assert team.namespace is not None
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": TEAM_LIMITS_NAME, "namespace": team.namespace,
                         "labels": _labels(team, stack, label_prefix)},
            "spec": {"limits": [{"type": "Container", "defaultRequest": dict(DEFAULT_REQUESTS),
                                 "default": dict(DEFAULT_LIMITS)}]}}


def team_group(team: str, label_prefix: str) -> str:
    """The Kubernetes group a team's IAM principals are in (their access entries name it): bound to `view` in the
    team's namespace for what EKS access policies do not cover (Kueue's Workloads and LocalQueues)."""
    return f"{label_prefix}:team-{team}"


def role_binding_manifest(team: TeamConfig, name: str, cluster_role: str, groups: Sequence[str], stack: str,
                          label_prefix: str) -> Manifest:
    """`groups` get the ClusterRole `cluster_role` (edit or view, or kueue_viewer_role) in the team's namespace
    only. Both built-in roles aggregate Kueue's workload, LocalQueue and pending-workloads viewer roles from Kueue
    0.18.0 on (kueue v0.19.2 charts/kueue/templates/rbac/workload_viewer_role.yaml:28-30), so members see their runs'
    queue state; before (an adopted older Kueue) the team also gets kueue_viewer_role (member_bindings)."""
    assert team.namespace is not None
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": team.namespace, "labels": _labels(team, stack, label_prefix)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                         for group in groups]}


def member_bindings(team: TeamConfig, stack: str, label_prefix: str, kueue_viewer: bool = False) -> list[Manifest]:
    """RoleBindings of the team's Kubernetes groups (by access), and of its IAM principals' group to `view`; with
    `kueue_viewer` (a Kueue whose viewer roles `view` and `edit` do not aggregate), of all of them to the stack's
    kueue_viewer_role as well."""
    bindings = []
    for access in ("edit", "view"):
        groups = team.member_groups(access)
        if groups:
            bindings.append(role_binding_manifest(team, f"team-{access}", access, groups, stack, label_prefix))
    if any(m.principal_arn is not None for m in team.members):
        bindings.append(role_binding_manifest(team, TEAM_PRINCIPALS_BINDING, "view",
                                              [team_group(team.name, label_prefix)], stack, label_prefix))
    if kueue_viewer and bindings:
        every = [subject["name"] for binding in bindings for subject in binding["subjects"]]
        bindings.append(role_binding_manifest(team, TEAM_KUEUE_VIEW_BINDING, kueue_viewer_role_name(stack),
                                              list(dict.fromkeys(every)), stack, label_prefix))
    return bindings


def kueue_viewer_role_name(stack: str) -> str:
    return f"{stack}-{TEAM_KUEUE_VIEWER}"


def kueue_viewer_role(stack: str, label_prefix: str) -> Manifest:
    """What `view` holds of Kueue from its 0.18 chart on, for a Kueue before it: the rules of its Workload,
    LocalQueue and pending-workloads viewer roles (kueue v0.19.2 charts/kueue/templates/rbac/workload_viewer_role.yaml,
    localqueue_viewer_role.yaml, pending_workloads_lq_viewer_role.yaml; the same rules at v0.13.4), without their
    aggregation labels: it reaches only the teams' namespaces, through their RoleBindings."""
    reads = ["get", "list", "watch"]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": kueue_viewer_role_name(stack), "labels": stack_labels(stack, label_prefix)},
            "rules": [{"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads", "localqueues"], "verbs": reads},
                      {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads/status", "localqueues/status"],
                       "verbs": ["get"]},
                      {"apiGroups": ["visibility.kueue.x-k8s.io"], "resources": ["localqueues/pendingworkloads"],
                       "verbs": reads}]}


@dataclass(frozen=True)
class TeamAccessEntry:
    """One IAM principal's EKS access entry: its teams' group, and per access policy the namespaces it applies in
    (a principal in two teams gets one entry; EKS refuses a second entry for the same principal)."""

    principal_arn: str
    kubernetes_groups: tuple[str, ...]
    policies: tuple[tuple[str, tuple[str, ...]], ...]  # (access policy ARN, namespaces), sorted


def team_access_entries(cfg: KueueConfig, label_prefix: str) -> list[TeamAccessEntry]:
    groups: dict[str, set[str]] = {}
    scopes: dict[str, dict[str, set[str]]] = {}
    for team in cfg.tenant_teams:
        assert team.namespace is not None
        for member in team.members:
            if member.principal_arn is None:
                continue
            groups.setdefault(member.principal_arn, set()).add(team_group(team.name, label_prefix))
            scopes.setdefault(member.principal_arn, {}).setdefault(ACCESS_POLICIES[member.access], set()).add(
                team.namespace)
    return [TeamAccessEntry(principal, tuple(sorted(groups[principal])),
                            tuple((policy, tuple(sorted(namespaces)))
                                  for policy, namespaces in sorted(scopes[principal].items())))
            for principal in sorted(scopes)]


def access_entry_key(principal_arn: str) -> str:
    """A short stable key for a principal's resource names (its ARN can be 2048 characters)."""
    return hashlib.sha256(principal_arn.encode()).hexdigest()[:10]


def team_root_directory(team: str) -> str:
    return f"{TEAM_EFS_ROOT}/{team}"


def team_volume_manifests(team: TeamConfig, volume: TeamVolumeConfig, volume_handle: Any, stack: str,
                          label_prefix: str) -> tuple[Manifest, Manifest]:
    """A static PV on the team's access point and the claim bound to it in the team's namespace.

    The handle is `<file system>::<access point>`: the EFS CSI driver mounts through the access point, with TLS,
    from the handle alone (aws-efs-csi-driver pkg/driver/node.go, NodePublishVolume and parseVolumeId). One handle
    per access point: two PVs sharing a handle are one volume to the kubelet. The PV is retained: deleting the
    claim never deletes the team's data."""
    assert team.namespace is not None
    labels = {**_labels(team, stack, label_prefix), "app.kubernetes.io/component": "storage"}
    volume_name = team.volume_name
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": volume_name, "labels": labels},
          "spec": {"capacity": {"storage": volume.size}, "accessModes": ["ReadWriteMany"],
                   "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "", "volumeMode": "Filesystem",
                   "claimRef": {"namespace": team.namespace, "name": volume.claim},
                   "csi": {"driver": "efs.csi.aws.com", "volumeHandle": volume_handle}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": volume.claim, "namespace": team.namespace, "labels": labels},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume_name,
                    "resources": {"requests": {"storage": volume.size}}}}
    return pv, pvc


def team_manifests(cfg: KueueConfig, plans: Sequence[PoolPlan], stack: str, label_prefix: str,
                   service_account: str, egress: EgressRules | None = None, metrics_namespace: str | None = None,
                   metrics_ports: tuple[int, ...] = ()) -> dict[str, list[Manifest]]:
    """Team name -> its Kubernetes objects (namespace first; the LocalQueue comes from infra.queueing)."""
    result: dict[str, list[Manifest]] = {}
    for team in cfg.tenant_teams:
        assert team.namespace is not None
        namespace = team_namespace_manifest(team, stack, label_prefix)
        labels = _labels(team, stack, label_prefix)
        account = service_account_manifest(service_account, team.namespace, stack, label_prefix)
        account["metadata"]["labels"][team_label(label_prefix)] = team.name
        result[team.name] = [
            namespace,
            *namespace_network_policies(team.namespace, labels, metrics_namespace=metrics_namespace,
                                        metrics_ports=metrics_ports, egress=egress),
            resource_quota_manifest(team, team_ceiling(cfg, team.name, plans, label_prefix), stack, label_prefix),
            limit_range_manifest(team, stack, label_prefix),
            account,
            *member_bindings(team, stack, label_prefix, kueue_viewer=not cfg.viewer_roles_aggregated),
        ]
    return result


def team_facts(cfg: KueueConfig, more_claims: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, TeamFacts]:
    """What a Job renderer needs of the tenant teams (ClusterFacts.teams): namespace, claims (its EFS directory's,
    and `more_claims` of the team, e.g. its FSx for Lustre directory's) and bucket prefixes (what its Jobs may name)."""
    more = more_claims or {}
    return {team.name: TeamFacts(namespace=team.namespace,
                                 volume_claims=((team.volume.claim,) if team.volume is not None else ())
                                 + more.get(team.name, ()),
                                 datasets=tuple(f"{d.bucket}/{d.prefix}" for d in team.datasets),
                                 checkpoints=tuple(f"{d.bucket}/{d.prefix}" for d in team.checkpoints))
            for team in cfg.tenant_teams if team.namespace is not None}


def _object_arns(bucket_names: Mapping[str, str], data: Sequence[TeamDataConfig], partition: str) -> list[str]:
    return sorted({f"arn:{partition}:s3:::{bucket_names[d.bucket]}/{d.prefix}*" for d in data})


def team_access_policy(team: TeamConfig, bucket_names: Mapping[str, str], partition: str = "aws") -> str:
    """The team role's policy. `bucket_names`: logical -> physical bucket name (the stack's, before they exist).

    List only under the team's prefixes, read its datasets and checkpoints, write (and clean up multipart uploads
    of) its checkpoints. Every resource names a bucket and a prefix: no wildcard bucket, no whole bucket."""
    data = team.data
    statements: list[dict[str, Any]] = []
    by_bucket: dict[str, list[str]] = {}
    for d in data:
        by_bucket.setdefault(bucket_names[d.bucket], []).append(d.prefix)
    for index, (bucket, prefixes) in enumerate(sorted(by_bucket.items())):
        statements.append({
            "Sid": f"ListTeamPrefixes{index}", "Effect": "Allow", "Action": ["s3:ListBucket"],
            "Resource": [f"arn:{partition}:s3:::{bucket}"],
            "Condition": {"StringLike": {"s3:prefix": sorted({f"{p}*" for p in prefixes})}}})
    if by_bucket:
        statements.append({"Sid": "BucketLocation", "Effect": "Allow", "Action": ["s3:GetBucketLocation"],
                           "Resource": sorted(f"arn:{partition}:s3:::{bucket}" for bucket in by_bucket)})
        statements.append({"Sid": "ReadTeamData", "Effect": "Allow", "Action": ["s3:GetObject"],
                           "Resource": _object_arns(bucket_names, data, partition)})
    if team.checkpoints:
        statements.append({
            "Sid": "WriteTeamCheckpoints", "Effect": "Allow",
            "Action": ["s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts", "s3:DeleteObject"],
            "Resource": _object_arns(bucket_names, team.checkpoints, partition)})
    return policy_document(*statements)


# --- the component -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamsArgs:
    ctx: StackContext
    cluster: ClusterInfo
    manifests: Mapping[str, Sequence[Manifest]]  # team_manifests(...)
    cluster_roles: Sequence[Manifest] = ()  # kueue_viewer_role, where Kueue's viewer roles are not in view/edit
    policies: Mapping[str, str] = field(default_factory=dict)  # team -> team_access_policy (EKS only)
    access_entries: Sequence[TeamAccessEntry] = ()  # team_access_entries(...) (EKS only)
    volumes: Mapping[str, tuple[TeamConfig, TeamVolumeConfig]] = field(default_factory=dict)  # EKS with EFS
    file_system_id: pulumi.Input[str] | None = None  # the stack's EFS (infra.storage)
    # What a team volume needs first (the EFS CSI add-on, mount targets), and what `destroy` keeps until it is gone.
    storage_needs: Sequence[pulumi.Resource] = ()
    # team -> its FSx for Lustre directory's PV and claim (infra.storage.Storage.fsx_team_volume) and what they need
    # first (the association that makes the directory)
    fsx_volumes: Mapping[str, tuple[Manifest, Manifest, Sequence[pulumi.Resource]]] = field(default_factory=dict)


class Teams(pulumi.ComponentResource):
    """The tenant teams' namespaces, quotas, service accounts and (EKS) Pod Identity roles."""

    def __init__(self, name: str, args: TeamsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:Teams", name, None, opts)
        ctx, cluster = args.ctx, args.cluster
        self.namespaces: dict[str, pulumi.Resource] = {}
        self.role_arns: dict[str, pulumi.Output[str]] = {}
        self.access_points: dict[str, pulumi.Output[str]] = {}
        # team -> what its Jobs need besides the namespace: the service account and its Pod Identity association
        self.accounts: dict[str, list[pulumi.Resource]] = {}
        in_cluster = pulumi.ResourceOptions(parent=self, provider=cluster.provider)
        for cluster_role in args.cluster_roles:
            k8s.rbac.v1.ClusterRole(ctx.name("team", cluster_role["metadata"]["name"].removeprefix(f"{ctx.stack}-")),
                                    metadata=cluster_role["metadata"], rules=cluster_role["rules"],
                                    opts=in_cluster.merge(pulumi.ResourceOptions(
                                        depends_on=list(cluster.eks_dependencies))))
        for team, manifests in args.manifests.items():
            namespace, *objects = manifests
            ns = k8s.core.v1.Namespace(
                ctx.name("team", f"{team}-ns"), metadata=namespace["metadata"],
                opts=in_cluster.merge(pulumi.ResourceOptions(depends_on=list(cluster.eks_dependencies))))
            self.namespaces[team] = ns
            after_ns = in_cluster.merge(pulumi.ResourceOptions(depends_on=[ns]))
            account: pulumi.Resource | None = None
            account_name = ""
            for manifest in objects:
                kind, object_name = manifest["kind"], manifest["metadata"]["name"]
                resource_name = ctx.name("team", f"{team}-{kind.lower()}-{object_name}")
                if kind == "NetworkPolicy":
                    k8s.networking.v1.NetworkPolicy(resource_name, metadata=manifest["metadata"],
                                                    spec=manifest["spec"], opts=after_ns)
                elif kind == "ResourceQuota":
                    k8s.core.v1.ResourceQuota(resource_name, metadata=manifest["metadata"], spec=manifest["spec"],
                                              opts=after_ns)
                elif kind == "LimitRange":
                    k8s.core.v1.LimitRange(resource_name, metadata=manifest["metadata"], spec=manifest["spec"],
                                           opts=after_ns)
                elif kind == "ServiceAccount":
                    account = k8s.core.v1.ServiceAccount(resource_name, metadata=manifest["metadata"], opts=after_ns)
                    account_name = object_name
                elif kind == "RoleBinding":
                    k8s.rbac.v1.RoleBinding(resource_name, metadata=manifest["metadata"],
                                            role_ref=manifest["roleRef"], subjects=manifest["subjects"], opts=after_ns)
                else:
                    raise AssertionError(f"unexpected team object {kind}")
            self.accounts[team] = [account] if account is not None else []
            policy = args.policies.get(team)
            if cluster.is_eks and policy is not None and account is not None:
                child = pulumi.ResourceOptions(parent=self)
                # A physical name known before the role exists (at most 8 + 6 + 40 of IAM's 64 characters): the
                # policy pack ties the RolePolicy to the team's role by it.
                role = aws.iam.Role(ctx.name("team", f"{team}-role"), name=f"{ctx.prefix}-team-{team}",
                                    assume_role_policy=pod_identity_trust_policy(),
                                    description=f"Jobs of team {team} in {ctx.stack}: its own bucket prefixes only",
                                    tags={**ctx.tags, TEAM_ROLE_TAG: team}, opts=child)
                aws.iam.RolePolicy(ctx.name("team", f"{team}-bucket-access"), role=role.name, policy=policy,
                                   opts=child)
                association = aws.eks.PodIdentityAssociation(
                    ctx.name("team", f"{team}-pod-identity"), cluster_name=cluster.name,
                    namespace=namespace["metadata"]["name"], service_account=account_name,
                    role_arn=role.arn, tags={**ctx.tags, TEAM_ROLE_TAG: team},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[account]))
                self.role_arns[team] = role.arn
                self.accounts[team].append(association)
            if team in args.volumes and args.file_system_id is not None:
                self.accounts[team].append(self._volume(ctx, cluster, *args.volumes[team], args.file_system_id,
                                                        [ns, *args.storage_needs]))
            if team in args.fsx_volumes:
                pv, pvc, needs = args.fsx_volumes[team]
                self.accounts[team].append(self._static_volume(ctx, cluster, f"{team}-fsx", pv, pvc,
                                                               [ns, *args.storage_needs, *needs]))
        if cluster.is_eks:
            for entry in args.access_entries:
                self._access_entry(ctx, cluster, entry)
        self.register_outputs({"namespaces": {team: m[0]["metadata"]["name"] for team, m in args.manifests.items()},
                               "roleArns": self.role_arns, "accessPoints": self.access_points})

    def _volume(self, ctx: StackContext, cluster: ClusterInfo, team: TeamConfig, volume: TeamVolumeConfig,
                file_system_id: pulumi.Input[str], needs: list[pulumi.Resource]) -> pulumi.Resource:
        """The team's access point on the stack's EFS, a PV on it and the claim in its namespace; returns the claim."""
        access_point = aws.efs.AccessPoint(
            ctx.name("team", f"{team.name}-efs-ap"), file_system_id=file_system_id,
            posix_user=aws.efs.AccessPointPosixUserArgs(uid=volume.uid, gid=volume.gid),
            root_directory=aws.efs.AccessPointRootDirectoryArgs(
                path=team_root_directory(team.name),
                creation_info=aws.efs.AccessPointRootDirectoryCreationInfoArgs(
                    owner_uid=volume.uid, owner_gid=volume.gid, permissions=volume.permissions)),
            tags={**ctx.tags, TEAM_ROLE_TAG: team.name, "Name": ctx.name("team", f"{team.name}-efs-ap")},
            opts=pulumi.ResourceOptions(parent=self))
        self.access_points[team.name] = access_point.id
        handle = pulumi.Output.all(file_system_id, access_point.id).apply(lambda ids: f"{ids[0]}::{ids[1]}")
        pv, pvc = team_volume_manifests(team, volume, handle, ctx.stack, ctx.label_prefix)
        in_cluster = pulumi.ResourceOptions(parent=self, provider=cluster.provider)
        volume_resource = k8s.core.v1.PersistentVolume(
            ctx.name("team", f"{team.name}-pv"), metadata=pv["metadata"], spec=pv["spec"],
            opts=in_cluster.merge(pulumi.ResourceOptions(depends_on=needs, delete_before_replace=True)))
        return k8s.core.v1.PersistentVolumeClaim(
            ctx.name("team", f"{team.name}-pvc"), metadata=pvc["metadata"], spec=pvc["spec"],
            opts=in_cluster.merge(pulumi.ResourceOptions(depends_on=[*needs, volume_resource],
                                                         protect=ctx.protected)))

    def _static_volume(self, ctx: StackContext, cluster: ClusterInfo, key: str, pv: Manifest, pvc: Manifest,
                       needs: list[pulumi.Resource]) -> pulumi.Resource:
        """A pre-bound PV and its claim in the team's namespace (protected in protected stacks); returns the claim."""
        in_cluster = pulumi.ResourceOptions(parent=self, provider=cluster.provider)
        volume = k8s.core.v1.PersistentVolume(
            ctx.name("team", f"{key}-pv"), metadata=pv["metadata"], spec=pv["spec"],
            opts=in_cluster.merge(pulumi.ResourceOptions(depends_on=needs, protect=ctx.protected)))
        return k8s.core.v1.PersistentVolumeClaim(
            ctx.name("team", f"{key}-pvc"), metadata=pvc["metadata"], spec=pvc["spec"],
            opts=in_cluster.merge(pulumi.ResourceOptions(depends_on=[*needs, volume], protect=ctx.protected)))

    def _access_entry(self, ctx: StackContext, cluster: ClusterInfo, entry: TeamAccessEntry) -> None:
        """An EKS access entry for a team member, with each access policy scoped to its teams' namespaces."""
        key = access_entry_key(entry.principal_arn)
        access = aws.eks.AccessEntry(ctx.name("team", f"access-{key}"), cluster_name=cluster.name,
                                     principal_arn=entry.principal_arn, type="STANDARD",
                                     kubernetes_groups=list(entry.kubernetes_groups), tags=ctx.tags,
                                     opts=pulumi.ResourceOptions(parent=self,
                                                                 depends_on=list(cluster.eks_dependencies)))
        for policy_arn, namespaces in entry.policies:
            aws.eks.AccessPolicyAssociation(
                ctx.name("team", f"access-{key}-{policy_arn.rsplit('/', 1)[1]}"), cluster_name=cluster.name,
                principal_arn=entry.principal_arn, policy_arn=policy_arn,
                access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="namespace",
                                                                            namespaces=list(namespaces)),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[access]))
