"""FSx for Lustre: a PERSISTENT_2 file system in the GPU pools' AZ, its security group (Lustre from the nodes and
from itself), and one data repository association per linked bucket.

Lustre's ports, per AWS's "File system access control with Amazon VPC" (FSx for Lustre User Guide,
limit-access-security-groups.html): TCP 988 and TCP 1018-1023, inbound from the clients' security group and from
the file system's own security group (its servers talk to each other), and the same outbound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.config.fsx import FsxDataRepositoryAssociationConfig, FsxLustreConfig
from infra.context import NetworkInfo, StackContext, SubnetRef
from infra.storage.firewall import SELF, PortRule, file_system_security_group

LUSTRE_PORTS = ((988, 988), (1018, 1023))
LUSTRE_VERSION = "2.15"  # PERSISTENT_2 with a metadata configuration needs 2.15


def subnet_in_zone(subnets: tuple[SubnetRef, ...], zone: str) -> SubnetRef:
    """The first private subnet of `zone` (any subnet of the zone reaches the file system's interfaces)."""
    for subnet in subnets:
        if subnet.availability_zone == zone:
            return subnet
    raise ValueError(f"storage.fsxLustre.availabilityZone: no private subnet in {zone}")


def repository_path(bucket_name: str, prefix: str) -> str:
    return f"s3://{bucket_name}/{prefix}"


def s3_policies(auto_import: Sequence[str], auto_export: Sequence[str]) -> aws.fsx.DataRepositoryAssociationS3Args:
    """A data repository association's S3 side: which bucket events import, which file-system events export (none
    listed: no policy)."""
    return aws.fsx.DataRepositoryAssociationS3Args(
        auto_import_policy=aws.fsx.DataRepositoryAssociationS3AutoImportPolicyArgs(events=list(auto_import))
        if auto_import else None,
        auto_export_policy=aws.fsx.DataRepositoryAssociationS3AutoExportPolicyArgs(events=list(auto_export))
        if auto_export else None)


def lustre_rules(peers: tuple[str, ...], efa: bool = False) -> list[PortRule]:
    """Lustre's ports from and to each peer (ingress then egress, per port range). An EFA-enabled file system's
    group allows every protocol and port from and to itself and the clients' group ("EFA-enabled security groups",
    FSx for Lustre User Guide; creation fails with "Insufficient security group permissions to create an EFA-enabled
    file system" otherwise): EFA's SRD traffic is matched by security-group rules only."""
    rules = []
    for peer in peers:
        for low, high in LUSTRE_PORTS:
            ports = f"{low}" if low == high else f"{low}-{high}"
            rules += [PortRule(f"fsx-lustre-{ports}-from-{peer}", "ingress", peer, low, high,
                               f"Lustre {ports} from the {peer} security group"),
                      PortRule(f"fsx-lustre-{ports}-to-{peer}", "egress", peer, low, high,
                               f"Lustre {ports} to the {peer} security group")]
        if efa:
            rules += [PortRule(f"fsx-efa-all-from-{peer}", "ingress", peer, 0, 0,
                               f"EFA: all traffic from the {peer} security group", protocol="-1"),
                      PortRule(f"fsx-efa-all-to-{peer}", "egress", peer, 0, 0,
                               f"EFA: all traffic to the {peer} security group", protocol="-1")]
    return rules


# The Lustre client's LNet over EFA on a node, after the EKS User Guide's "Optimize Amazon FSx for Lustre performance
# on nodes (EFA)" (awsdocs/amazon-eks-user-guide latest/ug/storage/fsx-csi-tuning-efa.adoc): the EFA LND (kefalnd)
# bound to the primary interface, the TCP network kept (the mount NID stays <dns>@tcp), EFA networks with 32 peer
# credits (on a 32-card p5: every 4th device, one per PCI bus; otherwise the first, and the last when there are
# more), discovery on, and a UDSP rule preferring EFA. The guide installs AWS's Lustre client packages for Ubuntu;
# on AL2023 the script takes the distribution's lustre-client and, where the EFA LND is missing, leaves the node on
# TCP (the mount still works, at TCP speed) rather than failing the boot.
LUSTRE_EFA_SCRIPT = """#!/bin/bash
# FSx for Lustre over EFA: LNet on the EFA interfaces ({interfaces} EFA devices on this pool's instance type)
exec 1> >(logger -s -t fsx-lustre-efa) 2>&1
command -v lnetctl >/dev/null || dnf install -y lustre-client || {{ echo "no Lustre client: FSx over TCP"; exit 0; }}
eth_intf="$(/sbin/ip -br -4 a sh | grep "$(hostname -i)/" | awk '{{print $1}}')"
modprobe lnet && modprobe kefalnd ipif_name="$eth_intf" && modprobe ksocklnd || {{
  echo "no EFA LND (kefalnd) for this kernel: FSx over TCP"; exit 0; }}
lnetctl lnet configure
lnetctl net del --net tcp 2>/dev/null
lnetctl net add --net tcp --if "$eth_intf"
for intf in $(ls -1 /sys/class/infiniband | {selection}); do
  lnetctl net add --net efa --if "$intf" --peer-credits 32
done
lnetctl set discovery 1
lnetctl udsp add --src efa --priority 0
modprobe lustre
echo "LNet EFA interfaces: $(lnetctl net show | grep -c '@efa')"
"""


def lustre_efa_client_script(efa_interfaces: int) -> str:
    """The node's boot script (a text/x-shellscript user-data part) for a pool with `efa_interfaces` EFA devices."""
    selection = "awk 'NR % 4 == 1'" if efa_interfaces >= 32 else "sed -n '1p;$p' | uniq"
    return LUSTRE_EFA_SCRIPT.format(interfaces=efa_interfaces, selection=selection)


@dataclass(frozen=True)
class LustreFileSystemArgs:
    config: FsxLustreConfig
    network: NetworkInfo
    node_security_group_id: pulumi.Input[str]
    bucket_names: Mapping[str, pulumi.Input[str]]  # logical bucket key -> physical name (the stack's S3 buckets)
    # The tenant teams' directories (storage.fsxLustre.teamDirectories): /teams/<team> <-> its checkpoints prefix.
    team_associations: tuple[FsxDataRepositoryAssociationConfig, ...] = ()


class LustreFileSystem(pulumi.ComponentResource):
    """Attributes: file_system_id, dns_name, mount_name, security_group_id, associations (by file system path)."""

    def __init__(self, ctx: StackContext, args: LustreFileSystemArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:LustreFileSystem", ctx.name("storage", "fsx"), None, opts)
        config = args.config
        stateful = pulumi.ResourceOptions(parent=self, protect=ctx.protected, retain_on_delete=ctx.protected)
        subnet = subnet_in_zone(args.network.private_subnets, config.availability_zone)

        security_group = file_system_security_group(
            ctx, "fsx-sg", args.network.vpc_id,
            "FSx for Lustre: Lustre (TCP 988, 1018-1023) from the cluster nodes and itself",
            {"nodes": args.node_security_group_id}, lustre_rules(("nodes", SELF), efa=config.efa), self,
        )
        if config.efa:
            self._node_efa_rules(ctx, args.node_security_group_id, security_group.id)

        file_system = aws.fsx.LustreFileSystem(
            ctx.name("storage", "fsx-fs"),
            deployment_type=config.deployment_type,
            storage_type="SSD",
            storage_capacity=config.storage_capacity,
            per_unit_storage_throughput=config.per_unit_storage_throughput,
            metadata_configuration={"mode": config.metadata_configuration.mode},
            file_system_type_version=LUSTRE_VERSION,
            efa_enabled=True if config.efa else None,  # pulumi-aws 7.51.1 fsx.LustreFileSystem efa_enabled
            subnet_ids=subnet.id,  # one subnet: PERSISTENT_2 lives in one AZ
            security_group_ids=[security_group.id],
            kms_key_id=config.kms_key_arn,
            data_compression_type=config.data_compression,
            automatic_backup_retention_days=config.automatic_backup_retention_days,
            copy_tags_to_backups=True,
            # protected stacks keep a final backup when the file system is ever deleted; dev tears down clean
            skip_final_backup=not ctx.protected,
            tags={**ctx.tags, "Name": ctx.name("storage", "fsx")},
            opts=pulumi.ResourceOptions.merge(stateful, pulumi.ResourceOptions(depends_on=[security_group])),
        )
        self.associations = {
            dra.file_system_path: self._association(ctx, file_system, dra, args.bucket_names[dra.bucket])
            for dra in (*config.data_repository_associations, *args.team_associations)
        }
        self.file_system_id: pulumi.Output[str] = file_system.id
        self.file_system_arn: pulumi.Output[str] = file_system.arn
        self.dns_name: pulumi.Output[str] = file_system.dns_name
        self.mount_name: pulumi.Output[str] = file_system.mount_name
        self.security_group_id: pulumi.Output[str] = security_group.id
        self.register_outputs({"fileSystemId": file_system.id, "securityGroupId": security_group.id,
                               "associations": sorted(self.associations)})

    def _node_efa_rules(self, ctx: StackContext, node_group_id: pulumi.Input[str],
                        file_system_group_id: pulumi.Input[str]) -> None:
        """The node group's side of EFA: every protocol from and to the file system's group (the node group's
        general egress is by CIDR, which SRD traffic does not match)."""
        child = pulumi.ResourceOptions(parent=self)
        aws.vpc.SecurityGroupIngressRule(
            ctx.name("storage", "fsx-efa-nodes-from-fsx"), security_group_id=node_group_id,
            referenced_security_group_id=file_system_group_id, ip_protocol="-1",
            description="EFA: all traffic from the FSx for Lustre security group", opts=child)
        aws.vpc.SecurityGroupEgressRule(
            ctx.name("storage", "fsx-efa-nodes-to-fsx"), security_group_id=node_group_id,
            referenced_security_group_id=file_system_group_id, ip_protocol="-1",
            description="EFA: all traffic to the FSx for Lustre security group", opts=child)

    def _association(self, ctx: StackContext, file_system: aws.fsx.LustreFileSystem,
                     dra: FsxDataRepositoryAssociationConfig,
                     bucket_name: pulumi.Input[str]) -> aws.fsx.DataRepositoryAssociation:
        """Deleting an association never deletes the files (deleteDataInFilesystem false): exported data stays in
        S3 and the file system's copy stays until the file system goes."""
        return aws.fsx.DataRepositoryAssociation(
            ctx.name("storage", f"fsx-dra-{dra.file_system_path.strip('/').replace('/', '-')}"),
            file_system_id=file_system.id,
            file_system_path=dra.file_system_path,
            data_repository_path=pulumi.Output.from_input(bucket_name).apply(
                lambda name: repository_path(name, dra.prefix)),
            batch_import_meta_data_on_create=dra.import_metadata_on_create,
            imported_file_chunk_size=dra.imported_file_chunk_size_mib,
            delete_data_in_filesystem=False,
            s3=s3_policies(dra.auto_import, dra.auto_export),
            tags=ctx.tags,
            opts=pulumi.ResourceOptions(parent=self, protect=ctx.protected),
        )
