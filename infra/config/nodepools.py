"""Stack config: node pools (`ml-cluster:nodePools`) and GPU plumbing (`ml-cluster:gpu`); how every pool scales
and what each node holds back are `ml-cluster:nodes` (infra/config/nodes.py).

What the config alone can show is checked here; facts about instance types (GPUs, local NVMe, shape)
are checked by infra.nodes.poolplan against aws.ec2.get_instance_type before any resource is registered.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import AfterValidator, AwareDatetime, Field, model_validator

from infra.config.base import DnsLabel, Quantity, StrictModel
from infra.config.external import ExternalRelease
from workloads.jobspec.fields import Image, ImageTag
from workloads.k8snames import (
    DNS1123_LABEL_PATTERN,
    LABEL_VALUE_PATTERN,
    is_dns_subdomain,
    is_label_name,
    is_label_value,
)

_INSTANCE_TYPE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")


def _instance_type(value: str) -> str:
    if not _INSTANCE_TYPE.match(value):
        raise ValueError(f"{value!r} is not an EC2 instance type like g5.xlarge")
    if value.startswith("p6e-gb200."):
        # AWS runs P6e-GB200 UltraServers on EKS with the ARM64 NVIDIA AMI, the NVIDIA DRA driver for its
        # ComputeDomains and IMEX across the NVLink domain (EKS User Guide, "ML on EKS: P6e-GB200 UltraServers").
        raise ValueError(f"{value} (GB200 UltraServer) needs the ARM64 NVIDIA AMI, the NVIDIA DRA driver and IMEX "
                         "channels, which ml-cluster does not configure yet: use p6-b200.48xlarge or p6-b300.48xlarge")
    return value


def _label_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if (prefix and not is_dns_subdomain(prefix)) or not is_label_name(name):
        raise ValueError(f"{key!r} is not a Kubernetes label key ([prefix/]name, name at most 63 characters)")
    return key


def _labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        _label_key(key)
        if not is_label_value(value):
            raise ValueError(f"label {key}: {value!r} is not a Kubernetes label value (at most 63 characters)")
    return labels


def _node_name(value: str) -> str:
    if not is_dns_subdomain(value):
        raise ValueError(f"{value!r} is not a Kubernetes node name (DNS subdomain)")
    return value


InstanceType = Annotated[str, AfterValidator(_instance_type)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]
NodeName = Annotated[str, AfterValidator(_node_name)]


class TaintConfig(StrictModel):
    key: LabelKey
    """the taint key"""
    value: str = Field(default="", max_length=63, pattern=LABEL_VALUE_PATTERN)
    """the taint value (may be empty)"""
    effect: Literal["NO_SCHEDULE", "NO_EXECUTE", "PREFER_NO_SCHEDULE"] = "NO_SCHEDULE"
    """the EKS API's effect names (NO_SCHEDULE is Kubernetes' NoSchedule)"""


class LocalStorageConfig(StrictModel):
    """Local NVMe instance store. `auto` trusts aws.ec2.get_instance_type; the other two override it.

    raid0: put kubelet/containerd on a RAID0 of the instance store even where detection finds none (then `gib`
    is required); none: leave the instance store alone (no NodeConfig, no NVMe labels).
    """

    mode: Literal["auto", "raid0", "none"] = "auto"
    """auto: RAID0 when the instance type has instance store; raid0: always (gib then required); none: leave it alone"""
    gib: int | None = Field(default=None, ge=1)
    """total NVMe GiB per node; overrides detection"""

    @model_validator(mode="after")
    def _gib_only_with_storage(self) -> LocalStorageConfig:
        if self.mode == "none" and self.gib is not None:
            raise ValueError("localStorage.gib has no meaning with mode none")
        return self


class ExistingNodesConfig(StrictModel):
    """onprem: nodes that already exist, with their shape declared (there is no instance-type lookup)."""

    nodes: list[NodeName] = Field(min_length=1)
    """the Kubernetes node names of the pool"""
    vcpus: int = Field(ge=1)
    """vCPUs per node"""
    memory: Quantity
    """memory per node"""
    gpu_type: str | None = Field(default=None, pattern=DNS1123_LABEL_PATTERN, max_length=63)
    """the GPU type label value, e.g. a100 (with gpusPerNode)"""
    gpus_per_node: int = Field(default=0, ge=0)
    """GPUs per node (with gpuType); 0: a CPU pool"""
    gpu_memory_gib: int | None = Field(default=None, ge=1)
    """memory per GPU, GiB (the <prefix>/gpu-memory-gib label)"""
    nvme_gib: int = Field(default=0, ge=0)
    """NVMe-backed kubelet root dir (ephemeral storage), GiB"""
    # The kubelet's disk where it is not NVMe: what the nodes offer as ephemeral storage (Kueue's quota counts it).
    kubelet_disk_gib: int | None = Field(default=None, ge=1)
    """default: nvmeGib"""
    max_pods: int = Field(default=110, ge=1)
    """the kubelet's maxPods (it sizes the kubelet's memory reservation)"""

    @model_validator(mode="after")
    def _gpu_fields_together(self) -> ExistingNodesConfig:
        if (self.gpu_type is None) != (self.gpus_per_node == 0):
            raise ValueError("existing.gpuType and existing.gpusPerNode go together (both set, or neither)")
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError("existing.nodes must be distinct")
        return self


class NodeRepairConfig(StrictModel):
    """EKS node auto repair on a managed node group (infra/nodes/repair.py builds the API object).

    enabled: default on for GPU pools, off for the others. The two limits keep a fleet-wide fault (a bad driver or
    AMI that marks every node unhealthy) from replacing the whole pool: repair stops once more than maxUnhealthy
    nodes are unhealthy at once, and repairs at most maxParallel nodes at a time.
    """

    enabled: bool | None = None
    """default: on for GPU pools"""
    max_parallel: int = Field(default=1, ge=1, le=100)
    """nodes repaired at the same time (a count)"""
    max_unhealthy: int | None = Field(default=None, ge=1, le=1000)
    """repair stops above this many unhealthy nodes; default: a fifth of maxSize rounded up"""
    gpu_overrides: bool = True
    """The accelerated-hardware overrides (AcceleratedHardwareReady reasons -> Replace/Reboot); off: EKS's defaults."""


class CapacityReservationConfig(StrictModel):
    """Reserved capacity a pool launches into: an EC2 Capacity Block for ML (capacityType CAPACITY_BLOCK) or an
    On-Demand Capacity Reservation (capacityType ON_DEMAND). The reservation's zone and size are stated here, so
    the plan can check the pool against them before any resource exists; preflight compares them with EC2's
    DescribeCapacityReservations."""

    id: str = Field(pattern=r"^cr-[0-9a-f]{8,17}$")
    """the reservation's id (cr-...)"""
    availability_zone: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
    """the reservation's AZ"""
    instance_count: int = Field(ge=1)
    """instances reserved"""
    preference: Literal["targeted", "open"] = "targeted"
    """targeted: only this pool uses the reservation; open: any matching instance may (ODCR only)"""
    start_time: AwareDatetime | None = None
    """when the reservation starts (a Capacity Block's start; the idle-GPU alert waits for it)"""
    end_time: AwareDatetime | None = None
    """when the reservation ends (a Capacity Block's end; an alert fires before it)"""

    def output(self) -> dict[str, object]:
        """What the stack exports of it (stack output nodePools.<pool>.reservation; the cost estimate reads it)."""
        times = {key: moment.isoformat() for key, moment in (("startTime", self.start_time),
                                                              ("endTime", self.end_time)) if moment is not None}
        return {"id": self.id, "instanceCount": self.instance_count, **times}

    @model_validator(mode="after")
    def _starts_before_it_ends(self) -> CapacityReservationConfig:
        if self.start_time is not None and self.end_time is not None and self.start_time >= self.end_time:
            raise ValueError(f"capacityReservation {self.id}: startTime must be before endTime")
        return self


class NodePoolConfig(StrictModel):
    """One pool: an EKS managed node group (instanceTypes) or, on onprem, existing nodes (existing)."""

    name: DnsLabel = Field(max_length=40)
    "room for \"<prefix>-nodepools-<name>-...\" logical names"
    gpu: bool = False
    ("the pool's nodes have NVIDIA GPUs: the NVIDIA AMI, the nvidia.com/gpu NoSchedule taint and the GPU labels "
     "(checked against the instance type)")
    instance_types: list[InstanceType] = []
    """EKS: the managed node group's EC2 instance types (several give Spot more capacity pools)"""
    existing: ExistingNodesConfig | None = None
    """onprem: the pool's existing nodes and their shape"""
    capacity_type: Literal["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"] = "ON_DEMAND"
    """ON_DEMAND, SPOT, or CAPACITY_BLOCK (an EC2 Capacity Block for ML; needs capacityReservation)"""
    capacity_reservation: CapacityReservationConfig | None = None
    """reserved capacity the pool launches into (a Capacity Block or an On-Demand Capacity Reservation)"""
    min_size: int = Field(default=0, ge=0)
    """the fewest nodes; 0 lets the cluster-autoscaler scale the pool from zero"""
    desired_size: int | None = Field(default=None, ge=0)
    """default: minSize"""
    max_size: int = Field(default=1, ge=1, le=1000)
    """the most nodes the cluster-autoscaler may start"""
    ami_family: Literal["al2023", "bottlerocket"] = "al2023"
    ("al2023: AL2023_x86_64_NVIDIA (GPU) / AL2023_x86_64_STANDARD; bottlerocket: BOTTLEROCKET_x86_64_NVIDIA / "
     "BOTTLEROCKET_x86_64 (ARM_64 for Graviton types)")
    disk_size_gib: int = Field(default=100, ge=20, le=16384)
    """root (AL2023) / data (Bottlerocket) gp3"""
    # The EKS node group's releaseVersion: AL2023 releases are <kubernetes minor>.<patch>-<YYYYMMDD>, Bottlerocket
    # releases <bottlerocket version>-<commit>. Unset, EKS takes its newest release when the group is created or
    # its Kubernetes version changes (docs/versions.md).
    release_version: str | None = Field(default=None, pattern=r"^\d+\.\d+\.\d+-[0-9a-z]+$")
    ("pin the AMI release as `aws eks describe-nodegroup` reports it (AL2023: <minor>.<patch>-<YYYYMMDD>); unset: "
     "EKS's newest when the group is created or its Kubernetes version changes")
    labels: Labels = {}
    """node labels beside the stack's own (<prefix>/pool, gpu-type, disktype, ...)"""
    taints: list[TaintConfig] = []
    """node taints beside the GPU taint GPU pools get (EKS pools; existing nodes keep theirs)"""
    local_storage: LocalStorageConfig = LocalStorageConfig()
    """the instance store NVMe: detected, forced to a RAID0, or left alone"""
    max_unavailable: int = Field(default=1, ge=1, le=100)
    """nodes replaced at once when the node group is updated (a new AMI or launch template)"""
    availability_zones: list[str] = []
    """restrict to these AZs' private subnets"""
    efa: bool = False
    ("Elastic Fabric Adapter on every network card the type has, in one AZ and a cluster placement group; multi-node "
     "Jobs on the pool get its interfaces and the libfabric/NCCL settings (docs/architecture.md, EFA).")
    node_repair: NodeRepairConfig = NodeRepairConfig()
    """EKS node auto repair (managed node groups only; onprem nodes have none: docs/monitoring.md)"""

    @model_validator(mode="after")
    def _shape(self) -> NodePoolConfig:
        if bool(self.instance_types) == (self.existing is not None):
            raise ValueError(f"node pool {self.name}: set exactly one of instanceTypes (EKS) and existing (onprem)")
        if len(set(self.instance_types)) != len(self.instance_types):
            raise ValueError(f"node pool {self.name}: instanceTypes must be distinct")
        desired = self.min_size if self.desired_size is None else self.desired_size
        if not self.min_size <= desired <= self.max_size:
            raise ValueError(
                f"node pool {self.name}: sizes must satisfy minSize <= desiredSize <= maxSize "
                f"(got minSize={self.min_size}, desiredSize={desired}, maxSize={self.max_size})"
            )
        if self.existing is not None and self.gpu != (self.existing.gpus_per_node > 0):
            raise ValueError(
                f"node pool {self.name}: gpu={str(self.gpu).lower()} but existing.gpusPerNode="
                f"{self.existing.gpus_per_node}"
            )
        if self.efa and self.existing is not None:
            raise ValueError(f"node pool {self.name}: efa is for EKS pools (instanceTypes); existing nodes keep the "
                             "network they have")
        if self.efa and len(self.availability_zones) > 1:
            raise ValueError(f"node pool {self.name}: an EFA pool lives in one availability zone (one cluster "
                             f"placement group): set availabilityZones to one of {', '.join(self.availability_zones)}")
        if self.existing is not None and self.release_version is not None:
            raise ValueError(f"node pool {self.name}: releaseVersion is an EKS AMI release (managed node groups); "
                             "existing nodes run what their owners installed")
        if self.existing is not None and self.node_repair.enabled:
            raise ValueError(f"node pool {self.name}: nodeRepair is EKS node auto repair (managed node groups); "
                             "existing nodes have none")
        self._check_reservation()
        if any(taint.key == "nvidia.com/gpu" for taint in self.taints):
            raise ValueError(f"node pool {self.name}: the nvidia.com/gpu taint is added to GPU pools automatically")
        return self

    @property
    def initial_size(self) -> int:
        return self.min_size if self.desired_size is None else self.desired_size

    def _check_reservation(self) -> None:
        reservation = self.capacity_reservation
        if reservation is None:
            if self.capacity_type == "CAPACITY_BLOCK":
                raise ValueError(f"node pool {self.name}: capacityType CAPACITY_BLOCK needs capacityReservation "
                                 "(the block's id, availabilityZone and instanceCount)")
            return
        if self.capacity_type == "SPOT":
            raise ValueError(f"node pool {self.name}: a Spot pool cannot launch into capacityReservation "
                             f"{reservation.id}: use ON_DEMAND (a reservation) or CAPACITY_BLOCK")
        if self.capacity_type == "CAPACITY_BLOCK" and reservation.preference == "open":
            raise ValueError(f"node pool {self.name}: a Capacity Block is always targeted (preference: targeted)")
        if len(self.instance_types) != 1:
            raise ValueError(f"node pool {self.name}: a reservation holds one instance type; the pool lists "
                             f"{len(self.instance_types)}")
        if self.availability_zones and self.availability_zones != [reservation.availability_zone]:
            raise ValueError(f"node pool {self.name}: reservation {reservation.id} is in "
                             f"{reservation.availability_zone}; availabilityZones lists "
                             f"{', '.join(self.availability_zones)}")
        if self.max_size > reservation.instance_count:
            raise ValueError(f"node pool {self.name}: maxSize {self.max_size} is above the "
                             f"{reservation.instance_count} instances reservation {reservation.id} holds (the rest "
                             "would never launch)")

    def launch_zones(self, network_zones: Sequence[str]) -> list[str]:
        """The AZs of `network_zones` the pool's nodes may start in. A pool with a reservation: the reservation's.
        An EFA pool has one: its own, or else the network's first in name order, so that a zone added later never
        moves (replaces) the pool."""
        wanted = ([self.capacity_reservation.availability_zone] if self.capacity_reservation is not None
                  else self.availability_zones)
        zones = [zone for zone in network_zones if not wanted or zone in wanted]
        return sorted(zones)[:1] if self.efa else zones


class HelmChartConfig(StrictModel):
    enabled: bool = True
    """install the chart"""
    chart_version: str = Field(pattern=r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    namespace: DnsLabel = "kube-system"
    """the namespace the chart is installed in"""
    external: ExternalRelease | None = None
    """the release of this chart the cluster already runs (existing clusters): the stack installs none and uses it"""

    @model_validator(mode="after")
    def _external_is_on(self) -> HelmChartConfig:
        if self.external is not None and not self.enabled:
            raise ValueError("external: the cluster's own release is used only with enabled: true (enabled: false "
                             "turns the chart off)")
        return self


class DevicePluginConfig(HelmChartConfig):
    chart_version: str = Field(default="0.20.0", pattern=r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    """https://nvidia.github.io/k8s-device-plugin, chart nvidia-device-plugin"""


class DcgmExporterConfig(HelmChartConfig):
    # https://nvidia.github.io/dcgm-exporter/helm-charts, chart dcgm-exporter (4.7.0 was never published: see
    # docs/versions.md)
    enabled: bool = False
    """install the chart (off by default)"""
    chart_version: str = Field(default="4.8.2", pattern=r"^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    """the pinned chart version (docs/versions.md)"""
    service_monitor: bool = False
    """needs the Prometheus operator's ServiceMonitor CRD"""


class EfaDevicePluginConfig(HelmChartConfig):
    chart_version: str = Field(default="v0.5.30", pattern=r"^v?\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$")
    ("https://aws.github.io/eks-charts, chart aws-efa-k8s-device-plugin (its versions carry a v); installed when a "
     "pool has efa: true")


class NodeMonitoringAgentConfig(StrictModel):
    """The EKS node monitoring agent add-on (EKS stacks with a GPU pool): it sets the node conditions
    (AcceleratedHardwareReady, ...) that node auto repair acts on. Its version: storage.addonVersions
    (`eks-node-monitoring-agent`), else EKS's default for the cluster version, checked against a minimum."""

    enabled: bool = True
    """install the add-on on EKS stacks with a GPU pool"""


# NVIDIA's DCGM image (nv-hostengine, dcgmi and the diagnostic plugins for CUDA 12 and 13: NVIDIA/DCGM
# docker/Dockerfile.ubuntu22.04, tag <dcgm version>-<build>-ubuntu22.04). 4.5.x is the DCGM the pinned dcgm-exporter
# chart runs (its image 4.5.3-4.8.2); docs/versions.md.
# The burn-in's objects are named here, so the derived-name check knows them without importing the component: the
# ServiceAccount, `<stack>-gpu-burn-in` (ClusterRole and binding), `gpu-burn-in-<pool>` (a DaemonSet per GPU pool).
BURN_IN_NAME = "gpu-burn-in"
DCGM_IMAGE = "nvcr.io/nvidia/cloud-native/dcgm:4.5.2-1-ubuntu22.04"


class GpuHealthConfig(StrictModel):
    """The GPU burn-in (infra/nodes/burnin.py): every new GPU node runs DCGM's diagnostic, a GPU memory/compute
    check, an all-reduce across its GPUs and (EFA pools) an EFA check, and is labelled `<prefix>/gpu-health=passed`
    or tainted and cordoned. With the gate on, training Jobs and Kueue's GPU flavors require the label.

    Default: on for protected (prod) stacks, off otherwise; a small dev stack can leave it off."""

    enabled: bool | None = None
    """run the burn-in; default: the stack's `protected`"""
    gate: bool | None = None
    """Jobs and GPU flavors require <prefix>/gpu-health=passed; default: on when the burn-in runs"""
    image: Image | None = None
    """the training image (full reference): the checks run it"""
    image_tag: ImageTag | None = None
    """or a tag of the stack's own registry"""
    dcgm_image: Image = DCGM_IMAGE
    """NVIDIA's DCGM image (dcgmi diag)"""
    diag_level: Literal[1, 2] = 2
    """dcgmi diag -r: 1 software only (~1 min), 2 adds memory and PCIe (a few minutes)"""
    memory_fraction: float = Field(default=0.5, gt=0, le=0.9)
    """share of each GPU's memory tested"""
    check_minutes: int = Field(default=15, ge=2, le=120)
    """each check's deadline"""
    namespace: DnsLabel = "gpu-health"
    """the burn-in's namespace (Pod Security: privileged)"""

    def runs(self, protected: bool) -> bool:
        return protected if self.enabled is None else self.enabled

    def gated(self, protected: bool) -> bool:
        return self.runs(protected) if self.gate is None else self.gate

    @model_validator(mode="after")
    def _one_image(self) -> GpuHealthConfig:
        if self.image is not None and self.image_tag is not None:
            raise ValueError("set one of image (a full reference) and imageTag (a tag of the stack's registry)")
        if self.gate is True and self.enabled is False:
            raise ValueError("gate: true needs the burn-in (enabled): nothing else labels nodes gpu-health=passed")
        return self


class GpuConfig(StrictModel):
    device_plugin: DevicePluginConfig = DevicePluginConfig()
    """the NVIDIA device plugin chart: advertises nvidia.com/gpu on GPU nodes"""
    dcgm_exporter: DcgmExporterConfig = DcgmExporterConfig()
    """the DCGM exporter chart: per-GPU metrics (utilisation, memory, XID errors) for Prometheus"""
    efa_device_plugin: EfaDevicePluginConfig = EfaDevicePluginConfig()
    """the EFA device plugin chart, installed when a pool has efa: true"""
    node_monitoring_agent: NodeMonitoringAgentConfig = NodeMonitoringAgentConfig()
    """the EKS node monitoring agent add-on (node conditions node auto repair acts on)"""
    health: GpuHealthConfig = GpuHealthConfig()
    """the GPU burn-in and the gate: new GPU nodes checked and labelled before Jobs may use them"""
