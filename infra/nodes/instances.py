"""EC2 instance-type facts (aws.ec2.get_instance_type) and the per-GPU "T-shirt" sizing derived from them.

No table of instance types lives in the program: every fact comes from the EC2 API (or, offline, from the
stacks/fixtures answers to the same data source). The sizing follows what a node really offers to pods:
allocatable = capacity - kube-reserved (the EKS AMI formula) - system-reserved - hard eviction threshold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi_aws as aws

GIB = 2**30
MIB = 2**20

# Managed node groups cap the kubelet's maxPods at 110 below 30 vCPUs and at 250 from 30 vCPUs on
# (EKS user guide, "Choosing an Amazon EC2 instance type"); the ENI limit can only lower it further.
_MNG_MAX_PODS_SMALL, _MNG_MAX_PODS_LARGE, _MNG_LARGE_VCPUS = 110, 250, 30
# EKS AMIs (nodeadm, Bottlerocket): kube-reserved memory = 11 MiB per pod + 255 MiB.
_KUBE_RESERVED_MIB_PER_POD, _KUBE_RESERVED_MIB_BASE = 11, 255
# kube-reserved CPU: 6% of the first core, 1% of the second, 0.5% of cores 3-4, 0.25% of the rest.
_KUBE_RESERVED_CPU_BANDS = ((1000, 0.06), (1000, 0.01), (2000, 0.005), (None, 0.0025))
# Hard eviction threshold memory.available<100Mi on EKS AMIs: memory the kubelet never hands to pods.
_EVICTION_HARD_MEMORY_MIB = 100
# Memory hypervisor and kernel keep: node capacity is below the EC2 memory size (Karpenter's default, 7.5%).
_VM_MEMORY_OVERHEAD = 0.075


class UnknownInstanceType(LookupError):
    """aws.ec2.get_instance_type has no answer for this type (typo, or not offered in the region)."""


@dataclass(frozen=True)
class InstanceShape:
    """What one EC2 instance type offers, as the EC2 API describes it."""

    instance_type: str
    vcpus: int
    memory_mib: int
    gpu_count: int = 0
    gpu_name: str | None = None  # "A10G", "H100", ...
    gpu_manufacturer: str | None = None
    gpu_memory_mib: int | None = None
    local_ssd_gb: int = 0  # total NVMe SSD instance store, decimal GB as EC2 reports it
    architectures: tuple[str, ...] = ("x86_64",)
    eni_max_pods: int | None = None  # ENIs x (IPv4 per ENI - 1) + 2, when the API reports the ENI limits
    efa_interfaces: int = 0  # EfaInfo.MaximumEfaInterfaces; 0: the type has no EFA
    network_cards: tuple[int, ...] = (0,)  # NetworkCardIndex of each network card

    @property
    def local_ssd_gib(self) -> int:
        return self.local_ssd_gb * 10**9 // GIB

    @property
    def max_pods(self) -> int:
        """The kubelet's maxPods on a managed node group node of this type."""
        cap = _MNG_MAX_PODS_LARGE if self.vcpus >= _MNG_LARGE_VCPUS else _MNG_MAX_PODS_SMALL
        return cap if self.eni_max_pods is None else min(cap, self.eni_max_pods)


def _field(result: Any, snake: str, camel: str) -> Any:
    if isinstance(result, Mapping):
        return result.get(camel, result.get(snake))
    return getattr(result, snake, None)


def shape_from_result(instance_type: str, result: Any) -> InstanceShape:
    """An InstanceShape from a get_instance_type result (typed result object, or its camelCase dict)."""
    vcpus, memory = (
        _field(result, "default_vcpus", "defaultVcpus"),
        _field(result, "memory_size", "memorySize"),
    )
    if not vcpus or not memory:
        raise UnknownInstanceType(instance_type)
    gpus = list(_field(result, "gpuses", "gpuses") or [])
    gpu_count = sum(int(_field(gpu, "count", "count") or 0) for gpu in gpus)
    first_gpu = gpus[0] if gpus else None
    # The data source does not report NvmeSupport; every SSD instance store of a Nitro type is NVMe, and HDD
    # stores (d3, h1) are not what kubelet and containerd should live on.
    ssd_gb = 0
    for disk in _field(result, "instance_disks", "instanceDisks") or []:
        if str(_field(disk, "type", "type")).lower() == "ssd":
            ssd_gb += int(_field(disk, "count", "count") or 0) * int(_field(disk, "size", "size") or 0)
    return InstanceShape(
        instance_type=instance_type,
        vcpus=int(vcpus),
        memory_mib=int(memory),
        gpu_count=gpu_count,
        gpu_name=str(_field(first_gpu, "name", "name")) if first_gpu is not None else None,
        gpu_manufacturer=str(_field(first_gpu, "manufacturer", "manufacturer")) if first_gpu is not None else None,
        gpu_memory_mib=int(_field(first_gpu, "memory_size", "memorySize") or 0) or None if first_gpu else None,
        local_ssd_gb=ssd_gb,
        architectures=tuple(_field(result, "supported_architectures", "supportedArchitectures") or ("x86_64",)),
        eni_max_pods=_eni_max_pods(result),
        efa_interfaces=int(_field(result, "efa_maximum_interfaces", "efaMaximumInterfaces") or 0)
        if _field(result, "efa_supported", "efaSupported") else 0,
        network_cards=tuple(sorted(int(_field(card, "index", "index") or 0)
                                   for card in _field(result, "network_cards", "networkCards") or [])) or (0,),
    )


def _eni_max_pods(result: Any) -> int | None:
    """The VPC CNI's pod limit; ENIs counted on the default network card, as nodeadm does."""
    ips = _field(result, "maximum_ipv4_addresses_per_interface", "maximumIpv4AddressesPerInterface")
    enis = _field(result, "maximum_network_interfaces", "maximumNetworkInterfaces")
    default_card = _field(result, "default_network_card_index", "defaultNetworkCardIndex") or 0
    for card in _field(result, "network_cards", "networkCards") or []:
        if int(_field(card, "index", "index") or 0) == int(default_card):
            enis = _field(card, "maximum_interfaces", "maximumInterfaces") or enis
    if not ips or not enis:
        return None
    return int(enis) * (int(ips) - 1) + 2


def lookup_instance_shape(instance_type: str) -> InstanceShape:
    """Ask EC2 (aws.ec2.get_instance_type in the provider's region) what an instance type offers."""
    try:
        result = aws.ec2.get_instance_type(instance_type=instance_type)
    except Exception as exc:  # the engine reports an unknown type as an invoke error of its own kind
        raise UnknownInstanceType(instance_type) from exc
    return shape_from_result(instance_type, result)


@dataclass(frozen=True)
class NodeAllocatable:
    """CPU and memory the scheduler can place pods into on one node."""

    cpu_millicores: int
    memory_bytes: int


def kube_reserved_cpu_millicores(vcpus: int) -> int:
    remaining, reserved = vcpus * 1000, 0.0
    for band, share in _KUBE_RESERVED_CPU_BANDS:
        taken = remaining if band is None else min(band, remaining)
        reserved += taken * share
        remaining -= taken
    return int(reserved)


def kube_reserved_memory_mib(max_pods: int) -> int:
    return _KUBE_RESERVED_MIB_PER_POD * max_pods + _KUBE_RESERVED_MIB_BASE


def node_allocatable(
    vcpus: int,
    memory_mib: int,
    max_pods: int,
    system_reserved_cpu_millicores: int,
    system_reserved_memory_bytes: int,
    ec2_memory: bool = True,
) -> NodeAllocatable:
    """Allocatable after kube-reserved, system-reserved and the hard eviction threshold.

    `ec2_memory`: memory_mib is the EC2 instance memory (the VM overhead is deducted); False for a declared
    node capacity (onprem nodes report their capacity directly).
    """
    capacity_mib = memory_mib * (1 - _VM_MEMORY_OVERHEAD) if ec2_memory else memory_mib
    cpu = vcpus * 1000 - kube_reserved_cpu_millicores(vcpus) - system_reserved_cpu_millicores
    memory = (
        int(capacity_mib * MIB)
        - (kube_reserved_memory_mib(max_pods) + _EVICTION_HARD_MEMORY_MIB) * MIB
        - system_reserved_memory_bytes
    )
    return NodeAllocatable(cpu_millicores=max(cpu, 0), memory_bytes=max(memory, 0))


def per_gpu_size(allocatable: NodeAllocatable, gpus: int) -> tuple[int, int]:
    """The "T-shirt" for one GPU: (millicores, bytes), rounded down to 100m and whole GiB to read well."""
    cpu = allocatable.cpu_millicores // gpus // 100 * 100
    memory = allocatable.memory_bytes // gpus // GIB * GIB
    return cpu, memory
