"""Stack config: Kueue, the job queueing system (`ml-cluster:kueue`).

Kueue admits a Job only when its whole gang fits the quota of its ClusterQueue, so a 2-node x 8-GPU Job never holds
8 GPUs while its second pod waits. The flavors and the shared queue's quotas come from the node pools
(infra.queueing); what is configured here is the release, the admission policy, priorities and the teams.
Rules that need the pools (known flavors, quotas that fit) are checked by infra.queueing.check_queueing.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, model_validator

from infra.config.base import PRINCIPAL_ARN, DnsLabel, Quantity, StrictModel, listed_twice
from infra.config.external import ExternalRelease

# Kueue fills in queue-name `default` for a Job without one when a LocalQueue named `default` exists in its namespace
# (kubernetes-sigs/kueue v0.19.2 pkg/controller/jobs/job/job_webhook.go:107, pkg/controller/constants/
# constants.go:27): stack Jobs held suspended without a queue label would then be admitted and started at once.
RESERVED_LOCAL_QUEUE = "default"
# Integrations this project can name (the chart's list at v0.19.2, charts/kueue/values.yaml:166-184).
Integration = Literal[
    "batch/job", "kubeflow.org/mpijob", "ray.io/rayjob", "ray.io/rayservice", "ray.io/raycluster",
    "jobset.x-k8s.io/jobset", "kubeflow.org/pytorchjob", "kubeflow.org/tfjob", "kubeflow.org/xgboostjob",
    "kubeflow.org/paddlejob", "kubeflow.org/jaxjob", "trainer.kubeflow.org/trainjob",
    "workload.codeflare.dev/appwrapper", "leaderworkerset.x-k8s.io/leaderworkerset",
]
Duration = str  # Go duration as Kueue's config reads it: 90s, 10m, 2h
# An adopted Kueue (kueue.external): every Kueue CRD serves v1beta2 from v0.15.0 (kubernetes-sigs/kueue v0.15.0
# charts/kueue/templates/crd/kueue.x-k8s.io_clusterqueues.yaml:836, served beside v1beta1 at :70), v1beta1 only
# before; the oldest whose CRDs the stack's objects are checked against is v0.13 (tests/queueing/kueue_0_13_crds).
KUEUE_V1BETA2_SINCE = (0, 15, 0)
KUEUE_EXTERNAL_OLDEST = (0, 13, 0)
# Kueue's chart labels its Workload, LocalQueue and pending-workloads viewer ClusterRoles aggregate-to-view/edit/admin
# from v0.18.0 (kubernetes-sigs/kueue #10482; v0.19.2 charts/kueue/templates/rbac/workload_viewer_role.yaml:28-30);
# v0.13.4, v0.14.8, v0.15.0 and v0.17.8 name the same roles without those labels (v0.15.0 the same file:21-26).
KUEUE_AGGREGATED_VIEW_SINCE = (0, 18, 0)


def version_tuple(version: str) -> tuple[int, int, int]:
    """(major, minor, patch) of a chart version like 0.13.4, v0.5.30 or 1.2.3-rc.1."""
    major, minor, patch = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    return int(major), int(minor), int(patch)


class WaitForPodsReadyConfig(StrictModel):
    """An admitted gang that does not get all its pods ready in `timeout` is evicted (its quota freed, its pods
    deleted) and requeued with exponential backoff; it never sits on GPUs while part of it waits for nodes."""

    timeout: Duration = Field(default="15m", pattern=r"^\d+[smh]$")
    """Long enough for a GPU node to scale up from zero and pull the training image."""
    recovery_timeout: Duration = Field(default="10m", pattern=r"^\d+[smh]$")
    """A running gang that loses a pod (spot reclaim) gets this long to replace it before it is requeued."""
    backoff_base_seconds: int = Field(default=60, ge=1)
    """the first requeue delay; it doubles on each further eviction"""
    backoff_max_seconds: int = Field(default=3600, ge=1)
    """the longest requeue delay"""
    backoff_limit_count: int | None = Field(default=None, ge=0)
    """None: requeue without limit"""
    block_admission: bool = False
    """True: admit one gang at a time per queue until its pods are ready (slower, never two half-started gangs)."""


# cluster-autoscaler's ProvisioningRequest classes that create capacity or check it (cluster-autoscaler 1.35.2
# FAQ.md:616-662): check-capacity only books nodes that already exist, so on pools that scale from zero it never
# provisions anything; best-effort-atomic-scale-up scales the node group (on AWS without atomicity: the AWS provider's
# AtomicIncreaseSize is not implemented, cloudprovider/aws/aws_cloud_provider.go:288-291, and the scale-up falls
# back to IncreaseSize, core/scaleup/orchestrator/executor.go:144-153).
ProvisioningClass = Literal["best-effort-atomic-scale-up.autoscaling.x-k8s.io", "check-capacity.autoscaling.x-k8s.io"]


class ProvisioningRetryConfig(StrictModel):
    """How often Kueue asks again after a ProvisioningRequest failed or its booking expired before admission
    (ProvisioningRequestConfig spec.retryStrategy; the CRD defaults 3, 60 s, 1800 s)."""

    backoff_limit_count: int = Field(default=3, ge=0)
    """retries before the workload is rejected"""
    backoff_base_seconds: int = Field(default=60, ge=1)
    """the first retry's delay (base^n seconds)"""
    backoff_max_seconds: int = Field(default=1800, ge=1)
    """the longest retry delay"""


class TopologyConfig(StrictModel):
    """Kueue's topology-aware scheduling on the EKS network topology labels (topology.k8s.aws/network-node-layer-*
    and kubernetes.io/hostname): a `Topology` per layer depth, named by the GPU flavors whose pools are all EFA pools
    of a type EC2 reports a topology for; Jobs on them carry a podset topology annotation (spec `topology`).

    Kueue places a TAS workload only on nodes that exist, are Ready and carry the flavor's labels (kueue v0.19.2
    pkg/cache/scheduler/tas_nodes_cache.go:57-66, pkg/util/tas/node.go:21-33): on a pool at size 0 it would never
    admit a gang, and an unadmitted gang has no pods to scale the pool up. So a TAS flavor whose pools can grow
    needs ProvisioningRequests (Kueue then reserves quota first, asks cluster-autoscaler for the nodes, and assigns
    the topology once they are Ready: pkg/scheduler/flavorassigner/tas_flavorassigner.go:104-108)."""

    enabled: bool = False
    """define the Topology, name it on the EFA GPU flavors and annotate Jobs that land there"""
    provisioning: bool = True
    ("a ProvisioningRequest admission check on the topology flavors (cluster-autoscaler started with "
     "--enable-provisioning-requests, the ProvisioningRequest CRD); false is allowed only where every topology pool "
     "keeps all its nodes (minSize == maxSize)")
    provisioning_class: ProvisioningClass = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    ("the ProvisioningRequest class: best-effort-atomic-scale-up creates nodes (not atomically on AWS); "
     "check-capacity only books nodes that exist")
    retry: ProvisioningRetryConfig = ProvisioningRetryConfig()
    """retries of a failed or expired ProvisioningRequest"""


class PreemptionConfig(StrictModel):
    """ClusterQueue preemption (same values as the ClusterQueue's spec.preemption)."""

    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = "Any"
    """whether a queue may preempt other queues' workloads to take back its lent quota"""
    within_cluster_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = "LowerPriority"
    """which workloads of its own queue a pending one may preempt"""
    borrow_within_cohort: Literal["Never", "LowerPriority"] = "Never"
    """whether a queue may preempt in other queues to borrow quota"""

    @model_validator(mode="after")
    def _consistent(self) -> PreemptionConfig:
        # The ClusterQueue CRD's CEL rule at v0.19.2 (kueue.x-k8s.io_clusterqueues.yaml, spec.preemption), which the
        # offline schema check cannot evaluate.
        if self.reclaim_within_cohort == "Never" and self.borrow_within_cohort != "Never":
            raise ValueError("borrowWithinCohort needs reclaimWithinCohort other than Never")
        return self


class PriorityClassConfig(StrictModel):
    """A WorkloadPriorityClass: a Job's queue priority (spec `workloadPriority`), independent of pod priority."""

    name: DnsLabel
    """the WorkloadPriorityClass's name (a Job spec's workloadPriority)"""
    value: int = Field(ge=-(2**31), le=2**31 - 1)
    """the priority: higher is admitted first and may preempt lower"""
    description: str = ""
    """free text kept on the WorkloadPriorityClass"""


class TeamQuotaConfig(StrictModel):
    """A team's guaranteed GPUs of one flavor (a GPU type); CPU, memory and disk follow per GPU of that type."""

    flavor: DnsLabel
    """the ResourceFlavor: a GPU type of the stack's pools (a10g, h100, ...)"""
    gpus: int = Field(ge=0)
    """GPUs of that flavor guaranteed to the team"""
    borrowing_limit: int | None = Field(default=None, ge=0)
    """GPUs it may borrow; None: no limit"""
    lending_limit: int | None = Field(default=None, ge=0)
    """GPUs it lends idle; None: all"""


class TeamDataConfig(StrictModel):
    """A prefix of one of the stack's S3 buckets (ml-cluster:storage.buckets, by logical name) that a team owns."""

    bucket: DnsLabel
    """one of the stack's S3 buckets by its logical name"""
    prefix: str = Field(pattern=r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*/$", max_length=512)
    """Non-empty and ending in '/': `team-a/` never matches `team-ab/...`, and no team owns a whole shared bucket."""

    @model_validator(mode="after")
    def _no_wildcard(self) -> TeamDataConfig:
        if "*" in self.prefix or any(part in (".", "..") for part in self.prefix.split("/")):
            raise ValueError(f"prefix {self.prefix!r}: no '*', '.' or '..' (it becomes an IAM resource ARN)")
        return self


# A Kubernetes group as an authenticator (OIDC, LDAP, an EKS access entry) reports it; never a built-in `system:`
# group (system:authenticated would give every user the team's access).
KUBERNETES_GROUP = r"^[A-Za-z0-9][A-Za-z0-9:._@/+=-]{0,127}$"
# Where the tenant teams' directories live on the stack's EFS: /teams/<team>.
TEAM_EFS_ROOT = "/teams"
# A tenant namespace's ResourceQuota and LimitRange.
PROVISIONING_CHECK = "gpu-provisioning"  # the ProvisioningRequestConfig and the AdmissionCheck naming it
TEAM_QUOTA_NAME = "team-quota"
TEAM_LIMITS_NAME = "team-defaults"
# The RoleBinding of a team's IAM principals' group to `view` (its Kubernetes groups get team-edit / team-view).
TEAM_PRINCIPALS_BINDING = "team-principals-view"
# Where Kueue's viewer roles are not in `view`/`edit` (KueueConfig.viewer_roles_aggregated): the stack's ClusterRole
# `<stack>-team-kueue-viewer` with their rules, bound in each team's namespace to all its groups.
TEAM_KUEUE_VIEWER = "team-kueue-viewer"
TEAM_KUEUE_VIEW_BINDING = "team-kueue-view"


class TeamMemberConfig(StrictModel):
    """People of a tenant team, with `edit` (submit, watch, delete Jobs) or `view` in the team's namespace only:
    an IAM role or user (`principalArn`, EKS: an access entry with a namespace-scoped access policy) or a Kubernetes
    group (`group`, any platform: a RoleBinding in the namespace; onprem: the group its authenticator reports)."""

    principal_arn: str | None = Field(default=None, pattern=PRINCIPAL_ARN)
    """an IAM role or user (EKS: an access entry scoped to the team's namespace)"""
    group: str | None = Field(default=None, pattern=KUBERNETES_GROUP)
    """a Kubernetes group (a RoleBinding in the team's namespace); never a system: group"""
    access: Literal["edit", "view"] = "edit"
    """edit: submit, watch and delete Jobs; view: read only"""

    @model_validator(mode="after")
    def _one_kind(self) -> TeamMemberConfig:
        if (self.principal_arn is None) == (self.group is None):
            raise ValueError("a team member is exactly one of principalArn (an IAM role or user) and group "
                             "(a Kubernetes group)")
        if self.group is not None and self.group.startswith("system:"):
            raise ValueError(f"group {self.group!r}: built-in system: groups are everyone or the cluster itself")
        return self


class TeamVolumeConfig(StrictModel):
    """The team's own directory on the stack's EFS (storage.efs): an access point rooted at /teams/<team>, created
    owned by uid:gid with `permissions`, every NFS request through it made as uid:gid whatever the pod's user; a
    static PersistentVolume on it and the claim `claim` in the team's namespace. Other teams' access points are
    rooted elsewhere: a team sees its own directory only."""

    uid: int = Field(ge=1, le=2**32 - 2)
    """POSIX owner and user of every request (not root)"""
    gid: int = Field(ge=1, le=2**32 - 2)
    """POSIX group of every request (not root)"""
    permissions: str = Field(default="0770", pattern=r"^0[0-7]{3}$")
    """the directory's permissions when the access point creates it (octal)"""
    claim: DnsLabel = "team-shared"
    """the PersistentVolumeClaim's name in the team's namespace"""
    size: Quantity = "1Ti"
    """EFS is elastic; the claim's size is nominal, and what the cost estimate prices as Standard storage."""


class TeamConfig(StrictModel):
    """A team: its own ClusterQueue (guaranteed quota, borrowing from the cohort) and LocalQueue `<name>`.

    With a `namespace` the team is a tenant: its LocalQueue lives in that namespace (and only that namespace may use
    its ClusterQueue), the namespace gets a ResourceQuota and LimitRange derived from the queue's quota, and its
    Jobs' service account is bound by Pod Identity to a role of the team's own that reads only `datasets` and
    reads/writes only `checkpoints`. Without one the team's LocalQueue is in the training namespace, as before."""

    name: DnsLabel = Field(max_length=40)
    """the team's name: its ClusterQueue and LocalQueue"""
    quotas: list[TeamQuotaConfig] = []
    """guaranteed GPUs per flavor (GPU type)"""
    fair_sharing_weight: int | None = Field(default=None, ge=0)
    """with fairSharing: the team's weight in the cohort's share"""
    namespace: DnsLabel | None = None
    """a namespace of the team's own: makes the team a tenant (quota, role, members)"""
    datasets: list[TeamDataConfig] = []
    """bucket prefixes the team's Jobs may read"""
    checkpoints: list[TeamDataConfig] = []
    """bucket prefixes the team's Jobs may read and write"""
    members: list[TeamMemberConfig] = []
    """people given edit or view access to the team's namespace"""
    volume: TeamVolumeConfig | None = None
    """the team's own directory on the stack's EFS, as a claim in its namespace"""

    def member_groups(self, access: str) -> list[str]:
        """The team's Kubernetes groups given `access` (edit or view), sorted."""
        return sorted(m.group for m in self.members if m.group is not None and m.access == access)

    @property
    def binding_names(self) -> list[str]:
        """The RoleBindings in the team's namespace, in the order they are created."""
        names = [f"team-{access}" for access in ("edit", "view") if self.member_groups(access)]
        if any(m.principal_arn is not None for m in self.members):
            names.append(TEAM_PRINCIPALS_BINDING)
        return names

    @property
    def volume_name(self) -> str | None:
        """The cluster-scoped PersistentVolume on the team's access point (its claim is `volume.claim`)."""
        return f"{self.namespace}-{self.volume.claim}" if self.volume is not None and self.namespace else None

    @model_validator(mode="after")
    def _flavors_once(self) -> TeamConfig:
        flavors = [quota.flavor for quota in self.quotas]
        twice = listed_twice(flavors)
        if twice:
            raise ValueError(f"team {self.name}: flavor(s) {', '.join(twice)} listed twice")
        if (self.datasets or self.checkpoints) and self.namespace is None:
            raise ValueError(f"team {self.name}: datasets and checkpoints need a namespace (the team's role is bound "
                             "to the service account there)")
        if (self.members or self.volume is not None) and self.namespace is None:
            raise ValueError(f"team {self.name}: members and volume need a namespace (their access and claim are "
                             "scoped to it)")
        seen = [member.principal_arn or f"group {member.group}" for member in self.members]
        twice = listed_twice(seen)
        if twice:
            raise ValueError(f"team {self.name}: member(s) {', '.join(twice)} listed twice")
        return self

    @property
    def data(self) -> list[TeamDataConfig]:
        return [*self.datasets, *self.checkpoints]


class KueueConfig(StrictModel):
    enabled: bool = False
    """install Kueue: Jobs are admitted as whole gangs within the GPU quota"""
    chart_version: str = Field(default="0.19.2", pattern=r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    """oci://registry.k8s.io/kueue/charts/kueue (see docs/versions.md)"""
    namespace: DnsLabel = "kueue-system"
    """the namespace Kueue's controller is installed in"""
    external: ExternalRelease | None = None
    ("the Kueue the cluster already runs (existing clusters): the stack installs none and creates its flavors and "
     "queues in the API version that version serves; waitForPodsReady, integrations and fairSharing then describe "
     "that Kueue's own Configuration, which the stack cannot set")
    integrations: list[Integration] = ["batch/job"]
    """the workload kinds Kueue manages (its Configuration's integrations.frameworks); batch/job is required"""
    wait_for_pods_ready: WaitForPodsReadyConfig = WaitForPodsReadyConfig()
    """evict and requeue an admitted gang whose pods do not all become ready in time"""
    topology: TopologyConfig = TopologyConfig()
    """topology-aware scheduling on the EKS network layers (EFA GPU pools)"""
    local_queue: DnsLabel = "training"
    """The queue every Job goes through unless its spec names another (a team's LocalQueue)."""
    cluster_queue: DnsLabel = "shared"
    """the shared ClusterQueue holding the stack's GPU quota"""
    cohort: DnsLabel | None = "gpus"
    """None: no borrowing between queues"""
    queueing_strategy: Literal["BestEffortFIFO", "StrictFIFO"] = "BestEffortFIFO"
    """BestEffortFIFO: a gang that does not fit lets smaller ones behind it go first; StrictFIFO: strict order"""
    preemption: PreemptionConfig = PreemptionConfig()
    """when a ClusterQueue may preempt workloads (the ClusterQueue's spec.preemption)"""
    fair_sharing: bool = False
    ("Fair sharing: borrowers are preempted towards each queue's weighted share of the cohort (teams' "
     "fairSharingWeight). Off: borrowing is first come, first served, and owners reclaim by preemption.")
    priority_classes: list[PriorityClassConfig] = []
    """WorkloadPriorityClasses a Job spec names in workloadPriority"""
    teams: list[TeamConfig] = []
    """teams with a ClusterQueue and LocalQueue of their own; with a namespace, tenants"""

    @property
    def viewer_roles_aggregated(self) -> bool:
        """Whether the Kueue the stack runs (its own, or the adopted one) folds its Workload, LocalQueue and
        pending-workloads viewer roles into `view` and `edit`: from 0.18.0. Before, the teams' members get the
        stack's own role for them (infra.tenancy.kueue_viewer_role)."""
        version = self.external.version if self.external is not None else self.chart_version
        return version_tuple(version) >= KUEUE_AGGREGATED_VIEW_SINCE

    @model_validator(mode="after")
    def _names(self) -> KueueConfig:
        if self.external is not None:
            if not self.enabled:
                raise ValueError("external: Kueue is used only with enabled: true (enabled: false turns it off)")
            if version_tuple(self.external.version) < KUEUE_EXTERNAL_OLDEST:
                raise ValueError(f"external.version {self.external.version}: older than Kueue "
                                 f"{'.'.join(map(str, KUEUE_EXTERNAL_OLDEST))}, the oldest whose CRDs the stack's "
                                 "objects are checked against: upgrade it, or let the stack install its own")
        if "batch/job" not in self.integrations:
            raise ValueError("integrations must include batch/job: the stack's training Jobs are batch/v1 Jobs")
        if len(set(self.integrations)) != len(self.integrations):
            raise ValueError("integrations must be distinct")
        local_queues = [self.local_queue, *(team.name for team in self.teams)]
        if RESERVED_LOCAL_QUEUE in local_queues:
            raise ValueError(f"no LocalQueue may be named {RESERVED_LOCAL_QUEUE!r}: Kueue would put every Job without "
                             "a queue label into it, starting held (suspended) stack Jobs before their data exists")
        twice = listed_twice(local_queues)
        if twice:
            raise ValueError(f"LocalQueue names must be unique (localQueue and team names): {', '.join(twice)}")
        cluster_queues = [self.cluster_queue, *(team.name for team in self.teams)]
        twice = listed_twice(cluster_queues)
        if twice:
            raise ValueError(f"ClusterQueue names must be unique (clusterQueue and team names): {', '.join(twice)}")
        classes = [priority.name for priority in self.priority_classes]
        twice = listed_twice(classes)
        if twice:
            raise ValueError(f"priority class names must be unique: {', '.join(twice)}")
        weighted = [team.name for team in self.teams if team.fair_sharing_weight is not None]
        if weighted and not self.fair_sharing:
            raise ValueError(f"fairSharingWeight ({', '.join(weighted)}) has no effect without fairSharing: true")
        namespaces = [team.namespace for team in self.teams if team.namespace is not None]
        twice = listed_twice(namespaces)
        if twice:
            raise ValueError(f"team namespaces must be unique: {', '.join(twice)}")
        owned = [(team.name, data.bucket, data.prefix) for team in self.teams for data in team.data]
        for name, bucket, prefix in owned:
            for other, other_bucket, other_prefix in owned:
                if other != name and bucket == other_bucket and other_prefix.startswith(prefix):
                    raise ValueError(f"teams {name} and {other} overlap in bucket {bucket}: {prefix!r} contains "
                                     f"{other_prefix!r}; a team's prefixes must be its own")
        uids = [(team.name, team.volume.uid) for team in self.teams if team.volume is not None]
        for name, uid in uids:
            others = [other for other, other_uid in uids if other_uid == uid and other != name]
            if others:
                raise ValueError(f"teams {name} and {others[0]} share volume uid {uid}: give each team its own")
        if self.cohort is None and any(quota.borrowing_limit is not None or quota.lending_limit is not None
                                       for team in self.teams for quota in team.quotas):
            raise ValueError("borrowingLimit and lendingLimit need a cohort (cohort is null)")
        return self

    @property
    def tenant_teams(self) -> list[TeamConfig]:
        """The teams with a namespace of their own."""
        return [team for team in self.teams if team.namespace is not None]

    @property
    def local_queues(self) -> tuple[str, ...]:
        return (self.local_queue, *(team.name for team in self.teams))
