"""EFS: encrypted file system, a security group admitting NFS from the nodes only, one mount target per AZ."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.config.storage import EfsConfig
from infra.context import NetworkInfo, StackContext, SubnetRef
from infra.iam import policy_document
from infra.storage.firewall import PortRule, file_system_security_group

NFS_PORT = 2049


def mount_target_subnets(subnets: Sequence[SubnetRef]) -> dict[str, SubnetRef]:
    """One subnet per availability zone, the first in the given order, AZs sorted.

    EFS allows one mount target per AZ (a second one fails with MountTargetConflict), and VPCs often have
    several private subnets per AZ; any subnet of the AZ reaches the mount target, so the first one is picked.
    """
    chosen: dict[str, SubnetRef] = {}
    for subnet in subnets:
        chosen.setdefault(subnet.availability_zone, subnet)
    return dict(sorted(chosen.items()))


def lifecycle_policies(config: EfsConfig) -> list[aws.efs.FileSystemLifecyclePolicyArgsDict]:
    policies: list[aws.efs.FileSystemLifecyclePolicyArgsDict] = []
    if config.transition_to_ia is not None:
        policies.append({"transition_to_ia": config.transition_to_ia})
        if config.transition_to_primary_on_access:
            policies.append({"transition_to_primary_storage_class": "AFTER_1_ACCESS"})
    return policies


def tls_only_policy() -> str:
    """The file-system policy AWS offers as "enforce in-transit encryption": NFS clients that reach a mount target
    may mount, write and act as root (as without a policy), but never without TLS. The EFS CSI driver mounts with
    TLS (efs-utils) by default, so Pods are unaffected; a plain `mount -t nfs4` is refused."""
    return policy_document(
        {"Sid": "ClientsThroughMountTargets", "Effect": "Allow", "Principal": {"AWS": "*"},
         "Action": ["elasticfilesystem:ClientMount", "elasticfilesystem:ClientWrite",
                    "elasticfilesystem:ClientRootAccess"],
         "Condition": {"Bool": {"elasticfilesystem:AccessedViaMountTarget": "true"}}},
        {"Sid": "DenyWithoutTls", "Effect": "Deny", "Principal": {"AWS": "*"}, "Action": "*",
         "Condition": {"Bool": {"aws:SecureTransport": "false"}}},
    )


@dataclass(frozen=True)
class SharedFileSystemArgs:
    config: EfsConfig
    network: NetworkInfo
    node_security_group_id: pulumi.Input[str]


class SharedFileSystem(pulumi.ComponentResource):
    """Attributes: file_system_id, file_system_arn, security_group_id, mount_targets (by AZ)."""

    def __init__(self, ctx: StackContext, args: SharedFileSystemArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:SharedFileSystem", ctx.name("storage", "efs"), None, opts)
        config = args.config
        child = pulumi.ResourceOptions(parent=self)
        stateful = pulumi.ResourceOptions(parent=self, protect=ctx.protected, retain_on_delete=ctx.protected)

        file_system = aws.efs.FileSystem(
            ctx.name("storage", "efs-fs"),
            encrypted=True,
            kms_key_id=config.kms_key_arn,
            throughput_mode=config.throughput_mode,
            provisioned_throughput_in_mibps=config.provisioned_throughput_mibps,
            performance_mode=config.performance_mode,
            lifecycle_policies=lifecycle_policies(config),
            tags={**ctx.tags, "Name": ctx.name("storage", "efs")},
            opts=stateful,
        )
        aws.efs.BackupPolicy(
            ctx.name("storage", "efs-backup"),
            file_system_id=file_system.id,
            backup_policy={"status": "ENABLED" if config.backup else "DISABLED"},
            opts=child,
        )
        aws.efs.FileSystemPolicy(
            ctx.name("storage", "efs-tls-only"),
            file_system_id=file_system.id,
            policy=tls_only_policy(),
            opts=child,
        )
        security_group = file_system_security_group(
            ctx, "efs-sg", args.network.vpc_id, "EFS mount targets: NFS from the cluster nodes only",
            {"nodes": args.node_security_group_id},
            [PortRule("efs-nfs-from-nodes", "ingress", "nodes", NFS_PORT, NFS_PORT,
                      "NFS from the node security group")],
            self,
        )
        self.mount_targets = {
            zone: aws.efs.MountTarget(
                ctx.name("storage", f"efs-mt-{zone}"),
                file_system_id=file_system.id,
                subnet_id=subnet.id,
                security_groups=[security_group.id],
                opts=child,
            )
            for zone, subnet in mount_target_subnets(args.network.private_subnets).items()
        }
        self.file_system_id: pulumi.Output[str] = file_system.id
        self.file_system_arn: pulumi.Output[str] = file_system.arn
        self.security_group_id: pulumi.Output[str] = security_group.id
        self.register_outputs(
            {
                "fileSystemId": file_system.id,
                "securityGroupId": security_group.id,
                "mountTargetZones": sorted(self.mount_targets),
            }
        )
