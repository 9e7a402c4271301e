"""The EKS add-ons a stack installs, in one place: infra/storage/drivers.py and infra/nodes/gpu.py create what
these functions name, preflight looks for the same names on an existing cluster (an add-on already there makes
CreateAddon fail), and the add-on-minimum check looks up the defaults of the same ones."""

from __future__ import annotations

from infra.config.nodepools import GpuConfig
from infra.config.schema import StackConfig
from infra.config.storage import NODE_MONITORING_AGENT, StorageConfig

POD_IDENTITY_AGENT = "eks-pod-identity-agent"
EBS_CSI_DRIVER = "aws-ebs-csi-driver"
EFS_CSI_DRIVER = "aws-efs-csi-driver"
FSX_CSI_DRIVER = "aws-fsx-csi-driver"
MOUNTPOINT_S3_CSI_DRIVER = "aws-mountpoint-s3-csi-driver"


def storage_addons(storage: StorageConfig) -> tuple[str, ...]:
    """The storage drivers' add-ons, in the order EksStorageDrivers creates them: the Pod Identity agent (the
    drivers' roles reach them through it), EBS, EFS with a file system, FSx with a Lustre file system, and
    Mountpoint for S3."""
    names = [POD_IDENTITY_AGENT, EBS_CSI_DRIVER]
    if storage.efs is not None:
        names.append(EFS_CSI_DRIVER)
    if storage.fsx_lustre is not None:
        names.append(FSX_CSI_DRIVER)
    return (*names, MOUNTPOINT_S3_CSI_DRIVER)


def gpu_addons(gpu: GpuConfig, has_gpu_pools: bool) -> tuple[str, ...]:
    """The GPU plumbing's add-ons: the node monitoring agent (its conditions drive node repair) when a pool has
    GPUs and gpu.nodeMonitoringAgent is on."""
    return (NODE_MONITORING_AGENT,) if gpu.node_monitoring_agent.enabled and has_gpu_pools else ()


def wanted_addons(cfg: StackConfig) -> list[str]:
    """Every EKS add-on the stack needs, sorted (none off EKS): those it installs and those it adopts."""
    if cfg.platform != "eks":
        return []
    return sorted({*storage_addons(cfg.storage), *gpu_addons(cfg.gpu, any(pool.gpu for pool in cfg.node_pools))})


def stack_addons(cfg: StackConfig) -> list[str]:
    """Every EKS add-on the stack installs, sorted: the ones it needs but an existing cluster's own
    (storage.externalAddons)."""
    return [name for name in wanted_addons(cfg) if name not in cfg.storage.external_addons]


def unused_external_addons(cfg: StackConfig) -> list[str]:
    """storage.externalAddons the stack would not install anyway (a typo, or a driver of storage it does not use)."""
    return sorted(set(cfg.storage.external_addons) - set(wanted_addons(cfg)))
