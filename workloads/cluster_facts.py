"""What a Job renderer needs to know about the cluster it targets, as plain data.

Built by infra (from the stack config, the node pools' instance shapes and the storage it created) and consumed by
workloads.jobspec. Plain frozen dataclasses: no Pulumi types, so workloads stays importable inside the cluster.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

# The kubelet's default hard eviction threshold nodefs.available<10% (kubernetes pkg/kubelet/eviction/
# defaults_linux.go, DefaultEvictionHard): the share of the kubelet's disk pods never get. Node pools put the
# kubelet's disk on the NVMe RAID0, so this is the share of the NVMe a pod's ephemeral storage cannot use.
EVICTION_HARD_NODEFS = 0.10
# The EFA device plugin's resource (aws/eks-charts stable/aws-efa-k8s-device-plugin) and the 2 MiB hugepages a pod
# using EFA asks for (libfabric's EFA provider registers its bounce buffers in hugepages; AWS's EKS nccl-tests
# examples request 5120Mi). EFA node pools preallocate enough pages for one such pod per node.
EFA_RESOURCE = "vpc.amazonaws.com/efa"
EFA_HUGEPAGES = "5120Mi"


@dataclass(frozen=True)
class PoolFacts:
    """One node pool as the scheduler will see it."""

    __pydantic_config__ = ConfigDict(extra="forbid")  # facts_from_dict refuses fields it does not know

    name: str
    gpu_type: str | None  # "h100", "a10g", ...; None for CPU pools
    gpus_per_node: int  # 0 for CPU pools
    nvme_gib: int  # total local NVMe instance store per node; 0 when none
    # Per-GPU defaults ("T-shirt sizes") after system reservations; None for CPU pools.
    cpu_per_gpu_millicores: int | None = None
    memory_per_gpu_bytes: int | None = None
    labels: dict[str, str] = field(default_factory=dict)  # node labels the pool's nodes carry
    efa_interfaces: int = 0  # EFA interfaces per node (EFA_RESOURCE); 0: the pool has no EFA
    # The goodput prediction's inputs (workloads/jobspec/goodput.py): the family's failure rate, Spot's reclaims and
    # restart time. None: not known (existing nodes, facts written before them).
    instance_type: str | None = None
    capacity_type: str | None = None  # ON_DEMAND, SPOT, CAPACITY_BLOCK

    def nvme_allocatable_gib(self) -> int:
        """What pods may use of the NVMe (whole GiB): the kubelet keeps nodefs.available free."""
        return int(self.nvme_gib * (1 - EVICTION_HARD_NODEFS))


@dataclass(frozen=True)
class TopologyFacts:
    """Kueue's topology-aware scheduling for one GPU type (its flavors name a Kueue Topology)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    levels: tuple[str, ...]  # the Topology's node labels, top of the network first, kubernetes.io/hostname last
    # Every pool of the type keeps all its nodes (minSize == maxSize): only then can a *required* level be promised,
    # since the autoscaler does not place new nodes by network layer.
    fixed_size: bool = False


@dataclass(frozen=True)
class TeamFacts:
    """A tenant team (ml-cluster:kueue.teams with a namespace): where its Jobs run and the claims they may mount."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    namespace: str
    volume_claims: tuple[str, ...] = ()  # PVCs in the team's namespace (its EFS directory)
    # The team's bucket prefixes, each `<logical bucket>/<key prefix>` (workloads.jobspec.teamdata): its Jobs read
    # under datasets and checkpoints and write under checkpoints; no other Job may name them. None: facts published
    # before the prefixes were (the team's own-prefix check is skipped; `up` publishes them again).
    datasets: tuple[str, ...] | None = None
    checkpoints: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FileSystemFacts:
    """A provisioned-throughput file system behind a claim (FSx for Lustre): what its writers share.

    Its baseline throughput is per-unit throughput x storage capacity, as AWS states it for FSx for Lustre
    (MB/s per TiB x TiB; MB = 10^6 bytes): every client writing at once shares it."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    kind: str  # "fsx-lustre"
    per_unit_mbps: int  # MB/s per TiB of storage (the throughput tier)
    capacity_gib: int

    @property
    def bytes_per_second(self) -> int:
        return self.per_unit_mbps * 10**6 * self.capacity_gib // 1024

    def describe(self) -> str:
        """The throughput and the formula behind it, for an error line."""
        return (f"{self.bytes_per_second} bytes/s ({self.per_unit_mbps} MB/s/TiB x {self.capacity_gib} GiB, "
                f"the {self.kind} file system's baseline)")


@dataclass(frozen=True)
class ClusterFacts:
    __pydantic_config__ = ConfigDict(extra="forbid")

    stack: str
    label_prefix: str  # e.g. "ml-cluster.io": labels are <prefix>/gpu-type, <prefix>/disktype, <prefix>/nvme-gib
    pools: tuple[PoolFacts, ...]
    namespace: str = "training"
    job_service_account: str = "training"  # bound to object-store read access (Pod Identity on EKS)
    object_store_endpoint: str | None = None  # S3-compatible endpoint (COS); None means AWS S3
    object_store_secret: str | None = None  # Secret with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (COS HMAC)
    # Physical names of the buckets in that store; None: every bucket a Job names is there (a cluster whose only
    # object store it is, onprem). An EKS stack with COS lists its COS buckets: the others are AWS S3, reached with
    # the Jobs' role, and a container that talks to them must not get the COS endpoint or keys.
    object_store_buckets: tuple[str, ...] | None = None
    region: str | None = None
    # PVCs in `namespace` that Jobs may mount (dataset and shared claims); None when unknown (no check).
    volume_claims: tuple[str, ...] | None = None
    # The stack's own image registry (e.g. <account>.dkr.ecr.<region>.amazonaws.com/mlc-dev-train): specs that give
    # an `imageTag` run <image_repository>:<tag>. None when the stack has none.
    image_repository: str | None = None
    # The stack's buckets (S3 and COS alike) by logical name -> physical bucket name: a spec's `bucket: datasets`
    # reads from there.
    buckets: dict[str, str] | None = None
    # Kueue: whether the stack runs it, the LocalQueue a Job goes through unless its spec names one, every LocalQueue
    # in `namespace` and the WorkloadPriorityClasses (None: unknown, not checked).
    kueue: bool = False
    local_queue: str | None = None
    local_queues: tuple[str, ...] | None = None
    workload_priority_classes: tuple[str, ...] | None = None
    # The GPU burn-in's gate (infra/nodes/burnin.py): GPU Jobs require the node label <prefix>/gpu-health=passed.
    gpu_health_gate: bool = False
    # Tenant teams by name: a spec with `team:` renders in its team's namespace, through its LocalQueue, mounting
    # only its claims. None: facts that predate teams (a spec with `team:` is refused, never run in `namespace`).
    teams: dict[str, TeamFacts] | None = None
    # Dataset packs (`submit pack`) on AWS S3: the service account whose role reads the stack's buckets and writes
    # the packInto ones, and those buckets' physical names. None: no such account (packs run as the Jobs' account).
    pack_service_account: str | None = None
    pack_buckets: tuple[str, ...] = ()
    # Claims (in `namespace` or a team's) on a file system of provisioned throughput, by claim name: a Job that
    # checkpoints to one gets its write rate from it (workloads.jobspec.checkpointing). None: no such claim.
    file_systems: dict[str, FileSystemFacts] | None = None
    # Kueue topology-aware scheduling by GPU type (None: no Topology; Jobs carry no podset topology annotation).
    topology: dict[str, TopologyFacts] | None = None
    # Kueue's waitForPodsReady.timeout in seconds: how long an admitted gang may wait for all its pods (`submit
    # status` counts down a gang waiting for capacity). None: no Kueue, or facts that predate it.
    gang_timeout_seconds: int | None = None

    def in_object_store(self, bucket: str) -> bool:
        """Whether a Job reaches physical bucket `bucket` through the S3-compatible store (else AWS S3)."""
        if self.object_store_endpoint is None:
            return False
        return self.object_store_buckets is None or bucket in self.object_store_buckets


# Fields added after facts were first published, left out while unset so the facts of a stack that does not use
# them stay as they were (facts_from_dict fills in the default).
_OMITTED_WHEN_UNSET = ("file_systems", "topology", "gang_timeout_seconds")


def facts_to_dict(facts: ClusterFacts) -> dict[str, Any]:
    """JSON-ready form (snake_case keys), e.g. a stack output that `workloads.submit --facts` reads back.
    Fields added later (`file_systems`, `topology`, `gang_timeout_seconds`) are left out when None (what facts
    without them read back as), so stacks without them publish the same facts as before they existed."""
    data = asdict(facts)
    for key in _OMITTED_WHEN_UNSET:
        if data.get(key) is None:
            data.pop(key, None)
    return data


def facts_from_dict(data: dict[str, Any]) -> ClusterFacts:
    """Inverse of facts_to_dict; raises a one-line ValueError naming the unknown, missing or mistyped field."""
    if not isinstance(data, dict):
        raise ValueError(f"cluster facts: expected an object, got {type(data).__name__}")
    try:
        return _FACTS.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "facts"
        raise ValueError(f"cluster facts: {where}: {first['msg']}") from None


# Facts arrive as JSON written by another tool (a stack output): every field's type is checked, not trusted.
_FACTS = TypeAdapter(ClusterFacts)


# The facts a stack publishes in the cluster (infra/jobfacts.py), one ConfigMap in the Jobs' namespace and in each
# team's: `python -m workloads.submit` reads it through the kubeconfig's context, so submitting needs no Pulumi
# state; anyone who may view the namespace may read it (the built-in view/edit roles include ConfigMaps).
FACTS_CONFIG_MAP = "ml-cluster-job-facts"
FACTS_CONFIG_KEY = "facts.json"


def facts_config_map(facts: ClusterFacts, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The ConfigMap that publishes `facts` in `namespace` (its data: FACTS_CONFIG_KEY -> the facts as JSON)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": FACTS_CONFIG_MAP, "namespace": namespace,
                         "labels": {"app.kubernetes.io/component": "job-facts", **(labels or {})}},
            "data": {FACTS_CONFIG_KEY: json.dumps(facts_to_dict(facts), sort_keys=True, indent=1)}}


def facts_namespaces(facts: ClusterFacts) -> list[str]:
    """Where the facts are published: the Jobs' namespace and every team's."""
    teams = sorted({team.namespace for team in (facts.teams or {}).values()} - {facts.namespace})
    return [facts.namespace, *teams]
