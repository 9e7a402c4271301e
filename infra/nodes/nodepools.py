"""Node pools: EKS managed node groups with launch templates (IMDSv2, NVMe RAID0 user data), labels, taints
and the cluster-autoscaler node-template tags that let a pool scale up from zero (built by
infra/nodes/scaling/autoscaler.py; tagged here, on the node group's Auto Scaling group).

The builders are pure (plan in, dicts/strings out); the NodePools component only turns them into resources.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from email import encoders
from email.mime.application import MIMEApplication
from email.mime.multipart import MIMEMultipart
from email.mime.text import MIMEText
from typing import Any

import pulumi
import pulumi_aws as aws
import yaml

from infra.context import ClusterInfo, NetworkInfo, StackContext
from infra.nodes.poolplan import EFA_NODE_HUGEPAGES, PoolPlan
from infra.nodes.repair import node_repair_config
from infra.nodes.scaling.autoscaler import node_template_tags, tag_slug

NODECONFIG_API_VERSION = "node.eks.aws/v1alpha1"
NODECONFIG_CONTENT_TYPE = "application/node.eks.aws"
# A fixed boundary keeps the user data, and so the launch template, identical from one run to the next.
MIME_BOUNDARY = "==ML-CLUSTER-NODECONFIG=="
# Bottlerocket: RAID0 the instance store and bind-mount what kubelet and containerd write onto it (what
# Karpenter generates for instanceStorePolicy RAID0).
BOTTLEROCKET_EPHEMERAL_DIRS = ("/var/lib/containerd", "/var/lib/kubelet", "/var/log/pods")
IMDS_HOP_LIMIT = 2  # pods reach IMDS through one extra hop (the container network namespace)


def nodeconfig_raid0() -> dict[str, Any]:
    """The nodeadm NodeConfig that puts kubelet and containerd on a RAID0 of all NVMe instance-store disks.

    Managed node groups merge it with the NodeConfig they generate (endpoint, CA), so it holds only this.
    """
    return {
        "apiVersion": NODECONFIG_API_VERSION,
        "kind": "NodeConfig",
        "spec": {"instance": {"localStorage": {"strategy": "RAID0"}}},
    }


# RLIM_INFINITY as an OCI runtime spec writes it (an unsigned 64-bit count).
RLIMIT_UNLIMITED = 2**64 - 1
# The AL2023 AMI's containerd base runtime spec sets RLIMIT_NOFILE alone (amazon-eks-ami v20260724
# nodeadm/internal/containerd/base-runtime-spec.json:159-165), so a container's locked-memory limit is whatever the
# runtime inherits, finite by default; libfabric on EFA registers memory and fails with "Cannot allocate memory"
# under a finite limit. A NodeConfig's containerd.baseRuntimeSpec replaces the rlimits list (nodeadm/doc/
# examples.md:198-219), so the AMI's NOFILE pair is restated beside MEMLOCK.
AL2023_NOFILE = (65536, 1048576)


def nodeconfig_efa_memlock() -> dict[str, Any]:
    """The nodeadm NodeConfig that gives every container on an EFA node an unlimited locked-memory limit."""
    soft, hard = AL2023_NOFILE
    rlimits = [{"type": "RLIMIT_NOFILE", "soft": soft, "hard": hard},
               {"type": "RLIMIT_MEMLOCK", "soft": RLIMIT_UNLIMITED, "hard": RLIMIT_UNLIMITED}]
    return {"apiVersion": NODECONFIG_API_VERSION, "kind": "NodeConfig",
            "spec": {"containerd": {"baseRuntimeSpec": {"process": {"rlimits": rlimits}}}}}


# Bottlerocket takes "unlimited" for a resource limit and writes RLIMIT_MEMLOCK 18446744073709551615 into its OCI
# defaults (bottlerocket@91632ff5 sources/api/schnauzer/src/helpers.rs:3035-3047).
BOTTLEROCKET_EFA_MEMLOCK = ('[settings.oci-defaults.resource-limits.max-locked-memory]\n'
                            'soft-limit = "unlimited"\nhard-limit = "unlimited"\n')


# Parallel image pull. AL2023: nodeadm's FastImagePull feature gate turns on the SOCI snapshotter in
# parallel_pull_unpack mode (amazon-eks-ami v20260724 nodeadm/api/v1alpha1/nodeconfig_types.go:158-170,
# nodeadm/doc/examples.md:152-173; its settings: nodeadm/internal/containerd/snapshotter/soci-snapshotter.config.toml;
# ignored below 4 vCPUs or 7 GiB, nodeadm/internal/containerd/config.go:167-188). The kubelet already pulls images in
# parallel there (serializeImagePulls false, nodeadm/internal/kubelet/config.go:124).
def nodeconfig_fast_image_pull() -> dict[str, Any]:
    """The nodeadm NodeConfig that pulls and unpacks image layers in parallel (SOCI parallel pull)."""
    return {"apiVersion": NODECONFIG_API_VERSION, "kind": "NodeConfig",
            "spec": {"featureGates": {"FastImagePull": True}}}


# Bottlerocket: containerd's snapshotter `soci` (bottlerocket-os/bottlerocket-settings-sdk@985f108a
# bottlerocket-settings-models/settings-extensions/container-runtime/src/lib.rs:9-24, :40-46) in the
# parallel-pull-unpack mode (settings-extensions/container-runtime-plugins, Bottlerocket 1.44 docs "container-runtime-
# plugins"), with the per-image concurrency nodeadm uses on AL2023.
BOTTLEROCKET_PARALLEL_PULL = ('[settings.container-runtime]\nsnapshotter = "soci"\n'
                              '[settings.container-runtime-plugins.soci-snapshotter]\n'
                              'pull-mode = "parallel-pull-unpack"\n'
                              '[settings.container-runtime-plugins.soci-snapshotter.parallel-pull-unpack]\n'
                              'max-concurrent-downloads-per-image = 20\nmax-concurrent-unpacks-per-image = 12\n'
                              'concurrent-download-chunk-size = "16mb"\ndiscard-unpacked-layers = true\n')


def mime_user_data(nodeconfigs: list[dict[str, Any]], scripts: list[str] | None = None) -> str:
    """MIME multi-part user data with one application/node.eks.aws part per NodeConfig (for nodeadm) and one
    text/x-shellscript part per script (cloud-init runs them after nodeadm's config phase, before the kubelet
    starts, so what they set is in the node's capacity from its first heartbeat)."""
    message = MIMEMultipart("mixed", boundary=MIME_BOUNDARY)
    for nodeconfig in nodeconfigs:
        text = "---\n" + yaml.safe_dump(nodeconfig, sort_keys=False)
        part = MIMEApplication(text, "node.eks.aws", _encoder=encoders.encode_7or8bit)
        message.attach(part)
    for script in scripts or []:
        message.attach(MIMEText(script, "x-shellscript"))
    return message.as_string()


def hugepages_script(pages: int) -> str:
    return f"#!/bin/bash\n# 2 MiB hugepages for EFA (libfabric)\nsysctl -w vm.nr_hugepages={pages}\n"


def bottlerocket_user_data() -> str:
    """Bottlerocket settings (TOML) that move kubelet, containerd and pod logs onto the NVMe RAID0."""
    dirs = ", ".join(f'"{d}"' for d in BOTTLEROCKET_EPHEMERAL_DIRS)
    return (
        "[settings.bootstrap-commands.000-mount-instance-storage]\n"
        "commands = [\n"
        '  ["apiclient", "ephemeral-storage", "init"],\n'
        f'  ["apiclient", "ephemeral-storage", "bind", "--dirs", {dirs}],\n'
        "]\n"
        "essential = true\n"
        'mode = "always"\n'
    )


def user_data(plan: PoolPlan, scripts: Sequence[str] = (), parallel_pull: bool = False) -> str | None:
    """The launch template's user data (plain text) for a pool; None when the defaults do. `scripts`: more boot
    scripts for an AL2023 pool (e.g. the FSx for Lustre client's LNet over EFA), after the hugepages one.
    `parallel_pull`: a GPU pool pulls images in parallel (nodes.imagePull.parallel)."""
    pages = EFA_NODE_HUGEPAGES if plan.efa_interfaces else 0
    fast_pull = parallel_pull and plan.is_gpu
    if not plan.nvme_gib and not pages and not scripts and not fast_pull:
        return None
    if plan.is_bottlerocket:
        settings = bottlerocket_user_data() if plan.nvme_gib else ""
        if pages:
            settings += f'[settings.kernel.sysctl]\n"vm.nr_hugepages" = "{pages}"\n' + BOTTLEROCKET_EFA_MEMLOCK
        return settings + (BOTTLEROCKET_PARALLEL_PULL if fast_pull else "")
    nodeconfigs = ([nodeconfig_raid0()] if plan.nvme_gib else []) + ([nodeconfig_efa_memlock()] if pages else [])
    nodeconfigs += [nodeconfig_fast_image_pull()] if fast_pull else []
    return mime_user_data(nodeconfigs, ([hugepages_script(pages)] if pages else []) + list(scripts))


def root_device_name(plan: PoolPlan) -> str:
    # Bottlerocket boots from /dev/xvda and keeps images and pods on its data volume /dev/xvdb.
    return "/dev/xvdb" if plan.is_bottlerocket else "/dev/xvda"


def metadata_options() -> dict[str, Any]:
    """IMDSv2 only (session tokens required); hop limit 2 so pods that need IMDS still reach it."""
    return {
        "http_endpoint": "enabled",
        "http_tokens": "required",
        "http_put_response_hop_limit": IMDS_HOP_LIMIT,
        "instance_metadata_tags": "disabled",
    }


def block_device_mappings(plan: PoolPlan) -> list[dict[str, Any]]:
    return [
        {
            "device_name": root_device_name(plan),
            "ebs": {
                "volume_size": plan.config.disk_size_gib,
                "volume_type": "gp3",
                "encrypted": "true",
                "delete_on_termination": "true",
            },
        }
    ]


def node_group_taints(plan: PoolPlan) -> list[dict[str, str]]:
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in plan.taints]


def pool_subnet_ids(plan: PoolPlan, network: NetworkInfo) -> list[pulumi.Input[str]]:
    network_zones = sorted({ref.availability_zone for ref in network.private_subnets})
    zones = plan.config.launch_zones(network_zones)
    subnets = [ref for ref in network.private_subnets if ref.availability_zone in zones]
    if not subnets:
        raise ValueError(
            f"node pool {plan.name}: no private subnet in availabilityZones "
            f"{', '.join(plan.config.availability_zones)} (the network has {', '.join(network_zones)})"
        )
    # EFA traffic stays inside one subnet's placement group: an EFA pool gets exactly one subnet.
    return [ref.id for ref in (subnets[:1] if plan.efa_interfaces else subnets)]


def reservation_options(plan: PoolPlan) -> dict[str, Any]:
    """The launch template's reserved-capacity settings: a Capacity Block is a `capacity-block` market targeting the
    block (EC2 User Guide, "Launch instances into Capacity Blocks"; the node group's capacityType is CAPACITY_BLOCK);
    an On-Demand Capacity Reservation is targeted by id, or open to any matching instance."""
    reservation = plan.config.capacity_reservation
    if reservation is None:
        return {}
    if reservation.preference == "open":
        spec = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(capacity_reservation_preference="open")
    else:
        spec = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
            capacity_reservation_target=aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs(
                capacity_reservation_id=reservation.id))
    options: dict[str, Any] = {"capacity_reservation_specification": spec}
    if plan.config.capacity_type == "CAPACITY_BLOCK":
        options["instance_market_options"] = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(
            market_type="capacity-block")
    return options


def efa_network_interfaces(plan: PoolPlan) -> list[dict[str, Any]]:
    """AWS's recommended layout for EFA on a type with several network cards (EC2 User Guide, "Maximize network
    bandwidth on Amazon EC2 instances with multiple network cards", efa-acc-inst-types): the primary interface
    (card 0, device 0) is an ENA interface; if card 0 carries EFA, an `efa-only` interface at card 0, device 1;
    each further EFA card an `efa-only` interface at device 0 (no IP address used). The EFA cards are the first
    `efa_interfaces` cards, except where the type has more cards than EFA interfaces: p6-b300.48xlarge (17 cards,
    16 EFA interfaces) keeps card 0 for ENA alone. Security groups go on the interfaces (a launch template with
    interfaces takes none of its own)."""
    cards, count = plan.network_cards, plan.efa_interfaces
    efa_cards = cards[1:count + 1] if len(cards) > count else cards[:count]
    primary = {"network_card_index": cards[0], "device_index": 0, "interface_type": "interface",
               "delete_on_termination": "true"}
    return [primary] + [{"network_card_index": card, "device_index": 1 if card == cards[0] else 0,
                         "interface_type": "efa-only", "delete_on_termination": "true"} for card in efa_cards]


def _asg_name(resources: Any) -> str | None:
    """The ASG of a managed node group: resources[0].autoscalingGroups[0].name (unknown in a preview)."""
    if not resources:
        return None
    first = resources[0]
    groups = first.get("autoscaling_groups") if isinstance(first, dict) else getattr(first, "autoscaling_groups", None)
    if not groups:
        return None
    group = groups[0]
    return group.get("name") if isinstance(group, dict) else getattr(group, "name", None)


def _repair_args(plan: PoolPlan) -> aws.eks.NodeGroupNodeRepairConfigArgs:
    config = dict(node_repair_config(plan))
    overrides = [aws.eks.NodeGroupNodeRepairConfigNodeRepairConfigOverrideArgs(**override)
                 for override in config.pop("node_repair_config_overrides", [])]
    return aws.eks.NodeGroupNodeRepairConfigArgs(**config, node_repair_config_overrides=overrides or None)


@dataclass(frozen=True)
class NodePoolsArgs:
    ctx: StackContext
    cluster: ClusterInfo
    network: NetworkInfo
    pools: tuple[PoolPlan, ...]  # EKS pools (plans with instance types)
    gpu_node_labels: dict[str, str] = field(default_factory=dict)  # modelled on GPU pools' templates (the gate)
    boot_scripts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # pool -> more AL2023 boot scripts
    parallel_pull: bool = False  # GPU pools pull images in parallel (nodes.imagePull.parallel)


class NodePools(pulumi.ComponentResource):
    """One launch template, one managed node group and its autoscaler tags per pool."""

    node_groups: dict[str, aws.eks.NodeGroup]
    asg_names: dict[str, pulumi.Output[str | None]]

    def __init__(self, name: str, args: NodePoolsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:NodePools", name, None, opts)
        ctx, cluster = args.ctx, args.cluster
        if not cluster.is_eks or cluster.node_role_arn is None:
            raise ValueError("NodePools needs an EKS cluster (node role, security groups)")
        security_groups = [sg for sg in (cluster.node_security_group_id, cluster.cluster_security_group_id) if sg]
        self.node_groups, self.asg_names = {}, {}
        for plan in args.pools:
            subnet_ids = pool_subnet_ids(plan, args.network)
            child = pulumi.ResourceOptions(parent=self)
            text = user_data(plan, args.boot_scripts.get(plan.name, ()), args.parallel_pull)
            placement, interfaces = None, None
            if plan.efa_interfaces:
                # A cluster placement group keeps the pool's nodes on one network spine (lowest EFA latency).
                group_name = f"{ctx.prefix}-{plan.name}"
                aws.ec2.PlacementGroup(ctx.name("nodepools", f"{plan.name}-pg"), name=group_name, strategy="cluster",
                                       tags=ctx.tags, opts=child)
                placement = aws.ec2.LaunchTemplatePlacementArgs(group_name=group_name)
                interfaces = [aws.ec2.LaunchTemplateNetworkInterfaceArgs(**interface, security_groups=security_groups)
                              for interface in efa_network_interfaces(plan)]
            template = aws.ec2.LaunchTemplate(
                ctx.name("nodepools", f"{plan.name}-lt"),
                description=f"{ctx.stack} node pool {plan.name}",
                metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(**metadata_options()),
                block_device_mappings=[
                    aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                        device_name=mapping["device_name"],
                        ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(**mapping["ebs"]),
                    )
                    for mapping in block_device_mappings(plan)
                ],
                vpc_security_group_ids=None if interfaces else security_groups,
                network_interfaces=interfaces,
                placement=placement,
                **reservation_options(plan),
                user_data=base64.b64encode(text.encode()).decode() if text else None,
                update_default_version=True,
                tag_specifications=[
                    aws.ec2.LaunchTemplateTagSpecificationArgs(
                        resource_type=kind, tags={**ctx.tags, "Name": f"{ctx.prefix}-{plan.name}"}
                    )
                    for kind in ("instance", "volume")
                ],
                tags=ctx.tags,
                opts=child,
            )
            group = aws.eks.NodeGroup(
                ctx.name("nodepools", f"{plan.name}-ng"),
                cluster_name=cluster.name,
                # The control plane's minor: an upgrade moves the cluster first (the group waits on its name).
                version=cluster.kubernetes_version,
                node_role_arn=cluster.node_role_arn,
                subnet_ids=subnet_ids,
                instance_types=list(plan.config.instance_types),
                capacity_type=plan.config.capacity_type,
                ami_type=plan.ami_type,
                release_version=plan.config.release_version,
                scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                    min_size=plan.config.min_size,
                    desired_size=plan.config.initial_size,
                    max_size=plan.config.max_size,
                ),
                update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=plan.config.max_unavailable),
                node_repair_config=_repair_args(plan),
                labels=plan.labels,
                taints=[aws.eks.NodeGroupTaintArgs(**taint) for taint in node_group_taints(plan)],
                launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                    id=template.id, version=template.latest_version.apply(str)
                ),
                tags={**ctx.tags, f"{ctx.label_prefix}/pool": plan.name},
                # cluster-autoscaler owns the desired size after creation.
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=list(cluster.eks_dependencies),
                    ignore_changes=["scalingConfig.desiredSize"],
                ),
            )
            asg_name = group.resources.apply(_asg_name)
            for key, value in node_template_tags(plan, args.gpu_node_labels).items():
                aws.autoscaling.Tag(
                    ctx.name("nodepools", f"{plan.name}-cas-{tag_slug(key)}"),
                    autoscaling_group_name=asg_name,
                    tag={"key": key, "value": value, "propagate_at_launch": False},
                    opts=child,
                )
            self.node_groups[plan.name] = group
            self.asg_names[plan.name] = asg_name
        self.register_outputs(
            {
                "nodeGroups": {name: group.arn for name, group in self.node_groups.items()},
                "autoscalingGroups": self.asg_names,
            }
        )
