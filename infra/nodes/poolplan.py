"""Resolve the configured node pools against instance-type facts: the checked, complete plan of every pool.

Runs before any resource is registered. Each pool's instance types are looked up once; the rules that need
those facts (GPU pools need GPUs, one GPU shape and one local-storage size per pool) are enforced here, with
errors that name the pool and the types. The result is plain data that NodePools, GpuPlumbing and the Jobs
renderer share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from infra.config.nodepools import NodePoolConfig
from infra.config.nodes import SizingConfig
from infra.config.schema import ConfigError, StackConfig
from infra.nodes.instances import (
    GIB,
    MIB,
    InstanceShape,
    NodeAllocatable,
    UnknownInstanceType,
    lookup_instance_shape,
    node_allocatable,
    per_gpu_size,
)
from infra.nodes.scaling.template import ACCELERATOR_LABEL, ASG_TAG_KEY_MAX, accelerator_label_value, template_label_key
from workloads.cluster_facts import EVICTION_HARD_NODEFS, PoolFacts
from workloads.quantity import quantity_bytes, quantity_millicores

GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"  # what the device plugin chart's node affinity accepts
# 2 MiB pages an EFA node preallocates at boot (its user data): EFA_HUGEPAGES (5120Mi) for the one gang pod a node
# runs, plus 8 pages of headroom. The kubelet reports them as hugepages-2Mi and takes them out of allocatable memory.
EFA_NODE_HUGEPAGES = 2568
EFA_LABEL = "efa"  # <prefix>/efa=true on EFA pools: the EFA device plugin's nodeSelector
# <prefix>/capacity on GPU pools: `reserved` on a pool with a capacityReservation, `unreserved` on the other pools of a
# GPU type that has one, so Kueue's reserved and unreserved flavors of that type select disjoint nodes (EKS's own
# eks.amazonaws.com/capacityType says ON_DEMAND for an On-Demand Capacity Reservation's nodes too).
CAPACITY_LABEL = "capacity"
RESERVED, UNRESERVED = "reserved", "unreserved"

ShapeLookup = Callable[[str], InstanceShape]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str  # EKS spelling: NO_SCHEDULE, NO_EXECUTE, PREFER_NO_SCHEDULE

    @property
    def kubernetes_effect(self) -> str:
        return {
            "NO_SCHEDULE": "NoSchedule",
            "NO_EXECUTE": "NoExecute",
            "PREFER_NO_SCHEDULE": "PreferNoSchedule",
        }[self.effect]


@dataclass(frozen=True)
class PoolPlan:
    """One pool, resolved: what its nodes are, carry and offer."""

    config: NodePoolConfig
    gpu_type: str | None
    gpus_per_node: int
    gpu_memory_gib: int | None
    nvme_gib: int  # NVMe set up as RAID0 for kubelet/containerd; 0 when the pool has none (or it is turned off)
    ami_type: str | None  # EKS AMI type; None for existing (onprem) nodes
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ephemeral_storage_bytes: int = 0  # what pods can use of the kubelet's disk (allocatable estimate)
    cpu_per_gpu_millicores: int | None = None
    memory_per_gpu_bytes: int | None = None
    allocatable_cpu_millicores: int = 0  # per node, after kubelet and system reservations
    allocatable_memory_bytes: int = 0
    efa_interfaces: int = 0  # EFA interfaces per node (one per network card); 0 without EFA
    network_cards: tuple[int, ...] = (0,)  # the type's network card indexes (the launch template's interfaces)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def is_gpu(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def is_bottlerocket(self) -> bool:
        return bool(self.ami_type and self.ami_type.startswith("BOTTLEROCKET"))

    @property
    def needs_device_plugin_daemonset(self) -> bool:
        # Bottlerocket's NVIDIA variants run the device plugin on the host; a DaemonSet would register twice.
        return self.is_gpu and not self.is_bottlerocket

    def facts(self) -> PoolFacts:
        return PoolFacts(
            name=self.name,
            gpu_type=self.gpu_type,
            gpus_per_node=self.gpus_per_node,
            nvme_gib=self.nvme_gib,
            cpu_per_gpu_millicores=self.cpu_per_gpu_millicores,
            memory_per_gpu_bytes=self.memory_per_gpu_bytes,
            labels=dict(self.labels),
            efa_interfaces=self.efa_interfaces,
            instance_type=self.config.instance_types[0] if self.config.instance_types else None,
            capacity_type=None if self.config.existing is not None else self.config.capacity_type,
        )


def gpu_type_label(gpu_name: str) -> str:
    """ "A10G" -> "a10g", "L40S" -> "l40s": a label value that names the GPU model."""
    return "".join(ch for ch in gpu_name.lower().replace(" ", "-") if ch.isalnum() or ch in "-.")


def ami_type(family: str, gpu: bool, architecture: str) -> str:
    arch = "ARM_64" if architecture == "arm64" else "x86_64"
    if family == "bottlerocket":
        return f"BOTTLEROCKET_{arch}_NVIDIA" if gpu else f"BOTTLEROCKET_{arch}"
    return f"AL2023_{arch}_NVIDIA" if gpu else f"AL2023_{arch}_STANDARD"


def _describe_storage(shape: InstanceShape) -> str:
    return (
        f"{shape.instance_type} ({shape.local_ssd_gb} GB NVMe)"
        if shape.local_ssd_gb
        else f"{shape.instance_type} (no instance store)"
    )


def _describe_gpus(shape: InstanceShape) -> str:
    if not shape.gpu_count:
        return f"{shape.instance_type} (no GPU)"
    return f"{shape.instance_type} ({shape.gpu_count}x {shape.gpu_manufacturer} {shape.gpu_name})"


def _check_instance_pool(path: str, pool: NodePoolConfig, shapes: Sequence[InstanceShape]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    gpu_shapes = {(s.gpu_count, s.gpu_name, s.gpu_memory_mib) for s in shapes}
    if pool.gpu:
        without = [s.instance_type for s in shapes if s.gpu_count == 0]
        if without:
            problems.append(
                (
                    f"{path}.instanceTypes",
                    f"pool {pool.name} is a GPU pool but {', '.join(without)} has no GPU",
                )
            )
        not_nvidia = [s.instance_type for s in shapes if s.gpu_count and s.gpu_manufacturer != "NVIDIA"]
        if not_nvidia:
            problems.append(
                (
                    f"{path}.instanceTypes",
                    f"pool {pool.name}: {', '.join(not_nvidia)} has no NVIDIA "
                    "GPU (the NVIDIA AMIs and device plugin need one)",
                )
            )
        if not without and len(gpu_shapes) > 1:
            problems.append(
                (
                    f"{path}.instanceTypes",
                    f"pool {pool.name} mixes GPU shapes: "
                    f"{', '.join(_describe_gpus(s) for s in shapes)}; the autoscaler and the GPU labels "
                    "need one per pool: split it",
                )
            )
    else:
        with_gpu = [_describe_gpus(s) for s in shapes if s.gpu_count]
        if with_gpu:
            problems.append(
                (
                    f"{path}.gpu",
                    f"pool {pool.name} has gpu: false but {', '.join(with_gpu)}: "
                    "set gpu: true (NVIDIA AMI, taint, labels)",
                )
            )
    if pool.local_storage.mode != "none" and len({s.local_ssd_gb for s in shapes}) > 1:
        problems.append(
            (
                f"{path}.instanceTypes",
                f"pool {pool.name} mixes local storage: "
                f"{', '.join(_describe_storage(s) for s in shapes)}; split the pool, or set "
                "localStorage.mode: none",
            )
        )
    architectures = {s.architectures[0] for s in shapes}
    if len(architectures) > 1:
        problems.append(
            (
                f"{path}.instanceTypes",
                f"pool {pool.name} mixes CPU architectures: {', '.join(sorted(architectures))}",
            )
        )
    if pool.efa:
        problems += _efa_problems(path, pool, shapes)
    if pool.local_storage.mode == "raid0" and pool.ami_family == "bottlerocket" and not shapes[0].local_ssd_gb:
        # Bottlerocket's essential bootstrap command `apiclient ephemeral-storage init` fails without instance
        # store disks, and an essential bootstrap command that fails stops the boot.
        problems.append(
            (
                f"{path}.localStorage.mode",
                f"pool {pool.name}: mode raid0 on Bottlerocket but {shapes[0].instance_type} has no instance store "
                "(the node would not boot): use a type with NVMe instance store, or mode auto/none",
            )
        )
    elif pool.local_storage.mode == "raid0" and pool.local_storage.gib is None and not shapes[0].local_ssd_gb:
        problems.append(
            (
                f"{path}.localStorage.gib",
                f"pool {pool.name}: mode raid0 but "
                f"{shapes[0].instance_type} reports no instance store: give its size in gib",
            )
        )
    return problems


def _efa_problems(path: str, pool: NodePoolConfig, shapes: Sequence[InstanceShape]) -> list[tuple[str, str]]:
    without = [s.instance_type for s in shapes if not s.efa_interfaces]
    if without:
        return [(f"{path}.efa", f"pool {pool.name} has efa: true but {', '.join(without)} has no EFA "
                                "(aws ec2 describe-instance-types --filters Name=network-info.efa-supported,"
                                "Values=true)")]
    layouts = {(s.efa_interfaces, s.network_cards) for s in shapes}
    if len(layouts) > 1:
        described = ", ".join(f"{s.instance_type} ({s.efa_interfaces} EFA on {len(s.network_cards)} network cards)"
                              for s in shapes)
        return [(f"{path}.instanceTypes", f"pool {pool.name} mixes EFA layouts: {described}; one launch template "
                                          "holds one layout: split the pool")]
    shape = shapes[0]
    if shape.efa_interfaces > len(shape.network_cards):
        return [(f"{path}.instanceTypes", f"pool {pool.name}: {shape.instance_type} reports {shape.efa_interfaces} "
                                          f"EFA interfaces on {len(shape.network_cards)} network cards; one "
                                          "interface per card is all a launch template can attach")]
    return []


def _base_labels(
    pool: NodePoolConfig,
    label_prefix: str,
    gpu_type: str | None,
    gpus: int,
    gpu_memory_gib: int | None,
    nvme_gib: int,
    gpu_present: bool,
) -> dict[str, str]:
    labels = {f"{label_prefix}/pool": pool.name}
    if gpu_type is not None:
        labels[f"{label_prefix}/gpu-type"] = gpu_type
        labels[f"{label_prefix}/gpu-count"] = str(gpus)
        if gpu_memory_gib:
            labels[f"{label_prefix}/gpu-memory-gib"] = str(gpu_memory_gib)
        if gpu_present:
            labels[GPU_PRESENT_LABEL] = "true"
    if nvme_gib:
        labels[f"{label_prefix}/disktype"] = "nvme"
        labels[f"{label_prefix}/nvme-gib"] = str(nvme_gib)
    return {**labels, **pool.labels}


def _taints(pool: NodePoolConfig, gpu: bool) -> tuple[Taint, ...]:
    gpu_taint = (Taint(GPU_TAINT_KEY, "true", "NO_SCHEDULE"),) if gpu else ()
    return gpu_taint + tuple(Taint(t.key, t.value, t.effect) for t in pool.taints)


def plan_instance_pool(
    pool: NodePoolConfig, shapes: Sequence[InstanceShape], sizing: SizingConfig, label_prefix: str
) -> PoolPlan:
    """The plan of an EKS pool whose types passed _check_instance_pool. The smallest type sizes the pool."""
    smallest = min(shapes, key=lambda s: (s.vcpus, s.memory_mib))
    gpu_shape = shapes[0]
    gpus = gpu_shape.gpu_count if pool.gpu else 0
    gpu_type = gpu_type_label(gpu_shape.gpu_name) if pool.gpu and gpu_shape.gpu_name else None
    gpu_memory_gib = (gpu_shape.gpu_memory_mib or 0) // 1024 or None if pool.gpu else None
    mode = pool.local_storage.mode
    nvme_gib = 0 if mode == "none" else (pool.local_storage.gib or shapes[0].local_ssd_gib)
    ami = ami_type(pool.ami_family, pool.gpu, smallest.architectures[0])
    gpu_present = pool.gpu and pool.ami_family != "bottlerocket"
    disk_gib = nvme_gib or pool.disk_size_gib
    efa = min(shapes[0].efa_interfaces, len(shapes[0].network_cards)) if pool.efa else 0
    plan = PoolPlan(
        config=pool,
        gpu_type=gpu_type,
        gpus_per_node=gpus,
        gpu_memory_gib=gpu_memory_gib,
        nvme_gib=nvme_gib,
        ami_type=ami,
        labels={
            **({ACCELERATOR_LABEL: accelerator_label_value(gpu_type)} if gpu_type is not None else {}),
            **_base_labels(pool, label_prefix, gpu_type, gpus, gpu_memory_gib, nvme_gib, gpu_present),
            **({f"{label_prefix}/{EFA_LABEL}": "true"} if efa else {}),
        },
        taints=_taints(pool, pool.gpu),
        ephemeral_storage_bytes=int(disk_gib * GIB * (1 - EVICTION_HARD_NODEFS)) // GIB * GIB,
        efa_interfaces=efa,
        network_cards=shapes[0].network_cards,
    )
    allocatable = node_allocatable(
        smallest.vcpus,
        smallest.memory_mib,
        smallest.max_pods,
        quantity_millicores(sizing.system_reserved_cpu),
        # preallocated hugepages are not allocatable memory
        quantity_bytes(sizing.system_reserved_memory) + (EFA_NODE_HUGEPAGES * 2 * MIB if efa else 0),
    )
    return _sized(plan, allocatable, gpus)


def plan_existing_pool(pool: NodePoolConfig, sizing: SizingConfig, label_prefix: str) -> PoolPlan:
    existing = pool.existing
    assert existing is not None
    gpus = existing.gpus_per_node
    plan = PoolPlan(
        config=pool,
        gpu_type=existing.gpu_type,
        gpus_per_node=gpus,
        gpu_memory_gib=existing.gpu_memory_gib,
        nvme_gib=existing.nvme_gib,
        ami_type=None,
        labels=_base_labels(
            pool,
            label_prefix,
            existing.gpu_type,
            gpus,
            existing.gpu_memory_gib,
            existing.nvme_gib,
            gpu_present=gpus > 0,
        ),
        taints=(),  # existing nodes keep the taints their owners gave them
        ephemeral_storage_bytes=int((existing.nvme_gib or existing.kubelet_disk_gib or 0) * GIB
                                    * (1 - EVICTION_HARD_NODEFS)) // GIB * GIB,
    )
    allocatable = node_allocatable(
        existing.vcpus,
        quantity_bytes(existing.memory) // 2**20,
        existing.max_pods,
        quantity_millicores(sizing.system_reserved_cpu),
        quantity_bytes(sizing.system_reserved_memory),
        ec2_memory=False,
    )
    return _sized(plan, allocatable, gpus)


def _sized(plan: PoolPlan, allocatable: NodeAllocatable, gpus: int) -> PoolPlan:
    """The plan with what a node offers pods and, for GPU pools, the per-GPU "T-shirt" size."""
    plan = replace(plan, allocatable_cpu_millicores=allocatable.cpu_millicores,
                   allocatable_memory_bytes=allocatable.memory_bytes)
    if not gpus:
        return plan
    cpu, memory = per_gpu_size(allocatable, gpus)
    return replace(plan, cpu_per_gpu_millicores=cpu, memory_per_gpu_bytes=memory)


def plan_node_pools(cfg: StackConfig, lookup: ShapeLookup = lookup_instance_shape) -> tuple[PoolPlan, ...]:
    """Look up every pool's instance types and check the pools; raise ConfigError naming each problem."""
    plans, problems = plan_sound_pools(cfg, lookup)
    if problems:
        raise ConfigError(problems)
    return plans


def plan_sound_pools(cfg: StackConfig, lookup: ShapeLookup = lookup_instance_shape,
                     ) -> tuple[tuple[PoolPlan, ...], list[tuple[str, str]]]:
    """(the plans of the pools without a problem, every pool's problems): the rest of the stack is still checked
    against the sound pools, so one bad pool does not hide a Job's or a name's problem."""
    problems: list[tuple[str, str]] = []
    plans: list[PoolPlan] = []
    cache: dict[str, InstanceShape] = {}
    for index, pool in enumerate(cfg.node_pools):
        path = f"nodePools.{index}"
        if cfg.platform == "eks" and pool.existing is not None:
            problems.append(
                (
                    f"{path}.existing",
                    f"pool {pool.name}: existing nodes belong to platform onprem; EKS pools name instanceTypes",
                )
            )
            continue
        if cfg.platform == "onprem" and pool.instance_types:
            problems.append(
                (
                    f"{path}.instanceTypes",
                    f"pool {pool.name}: platform onprem creates no node groups; "
                    "describe the existing nodes under existing",
                )
            )
            continue
        if pool.existing is not None:
            plans.append(plan_existing_pool(pool, cfg.nodes.sizing, cfg.label_prefix))
            continue
        shapes: list[InstanceShape] = []
        for type_index, instance_type in enumerate(pool.instance_types):
            if instance_type not in cache:
                try:
                    cache[instance_type] = lookup(instance_type)
                except UnknownInstanceType:
                    region = f" in {cfg.region}" if cfg.region else ""
                    problems.append(
                        (
                            f"{path}.instanceTypes.{type_index}",
                            f"pool {pool.name}: unknown instance "
                            f"type {instance_type} (aws.ec2.get_instance_type has no answer{region})",
                        )
                    )
                    continue
            shapes.append(cache[instance_type])
        if len(shapes) != len(pool.instance_types):
            continue
        pool_problems = _check_instance_pool(path, pool, shapes)
        problems.extend(pool_problems)
        if not pool_problems:
            plan = plan_instance_pool(pool, shapes, cfg.nodes.sizing, cfg.label_prefix)
            too_long = [key for key in plan.labels if len(template_label_key(key)) > ASG_TAG_KEY_MAX]
            if too_long:
                problems.append(
                    (
                        f"{path}.labels",
                        f"pool {pool.name}: label key(s) {', '.join(too_long)} too long "
                        f"for an autoscaler node-template tag (ASG tag keys hold {ASG_TAG_KEY_MAX} characters)",
                    )
                )
            plans.append(plan)
    return _label_capacity(plans, cfg.label_prefix), problems


def _label_capacity(plans: Sequence[PoolPlan], label_prefix: str) -> tuple[PoolPlan, ...]:
    """<prefix>/capacity on the GPU pools of every GPU type that has a reserved pool (others keep their labels)."""
    key = f"{label_prefix}/{CAPACITY_LABEL}"
    reserved_types = {plan.gpu_type for plan in plans if plan.is_gpu and plan.config.capacity_reservation is not None}
    return tuple(
        replace(plan, labels={**plan.labels,
                              key: RESERVED if plan.config.capacity_reservation is not None else UNRESERVED})
        if plan.is_gpu and plan.gpu_type in reserved_types else plan
        for plan in plans)


def pool_facts(plans: Sequence[PoolPlan]) -> tuple[PoolFacts, ...]:
    """What the Jobs renderer needs to know about every pool."""
    return tuple(plan.facts() for plan in plans)
