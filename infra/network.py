"""Network: create a VPC (private + public subnets per AZ, NAT) or adopt an existing VPC and its subnets."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.config import ConfigError, NetworkConfig
from infra.config.cluster import ExistingVpcConfig, NewVpcConfig
from infra.context import NetworkInfo, StackContext, SubnetRef


@dataclass(frozen=True)
class SubnetPlan:
    availability_zone: str
    private_cidr: str
    public_cidr: str


def plan_subnets(vpc: NewVpcConfig) -> list[SubnetPlan]:
    """Carve the VPC into one private and one public subnet per AZ: 8 equal blocks, privates first."""
    blocks = list(ipaddress.IPv4Network(vpc.cidr).subnets(prefixlen_diff=3))
    half = len(blocks) // 2
    return [SubnetPlan(zone, str(blocks[i]), str(blocks[half + i])) for i, zone in enumerate(vpc.availability_zones)]


def lookup_existing_subnets(existing: ExistingVpcConfig) -> tuple[tuple[SubnetRef, ...], tuple[SubnetRef, ...]]:
    """Each adopted subnet's AZ, from aws.ec2.get_subnet; a subnet outside the VPC is a config error."""
    problems: list[tuple[str, str]] = []

    def refs(ids: list[str], field: str) -> tuple[SubnetRef, ...]:
        found = []
        for index, subnet_id in enumerate(ids):
            subnet = aws.ec2.get_subnet(id=subnet_id)
            if subnet.vpc_id != existing.vpc_id:
                problems.append((f"network.existing.{field}.{index}",
                                 f"{subnet_id} is in {subnet.vpc_id}, not in {existing.vpc_id}"))
            found.append(SubnetRef(id=subnet_id, availability_zone=subnet.availability_zone))
        return tuple(found)

    private = refs(existing.private_subnet_ids, "privateSubnetIds")
    public = refs(existing.public_subnet_ids, "publicSubnetIds")
    if len({ref.availability_zone for ref in private}) < 2:
        problems.append(("network.existing.privateSubnetIds", "EKS needs private subnets in at least two AZs"))
    if problems:
        raise ConfigError(problems)
    return private, public


@dataclass(frozen=True)
class NetworkArgs:
    ctx: StackContext
    config: NetworkConfig
    cluster_name: str
    # For an adopted VPC: the subnets with their AZs, looked up before any resource is registered.
    existing_subnets: tuple[tuple[SubnetRef, ...], tuple[SubnetRef, ...]] | None = None


class Network(pulumi.ComponentResource):
    info: NetworkInfo

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:Network", name, None, opts)
        if args.config.create is not None:
            self.info = self._create(args, args.config.create)
        else:
            assert args.config.existing is not None and args.existing_subnets is not None
            private, public = args.existing_subnets
            self.info = NetworkInfo(vpc_id=args.config.existing.vpc_id, vpc_cidr=None,
                                    private_subnets=private, public_subnets=public)
        self.register_outputs({"vpcId": self.info.vpc_id,
                               "privateSubnetIds": [ref.id for ref in self.info.private_subnets]})

    def _create(self, args: NetworkArgs, vpc_config: NewVpcConfig) -> NetworkInfo:
        ctx, child = args.ctx, pulumi.ResourceOptions(parent=self)
        cluster_tag = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}
        vpc = aws.ec2.Vpc(ctx.name("network", "vpc"), cidr_block=vpc_config.cidr, enable_dns_hostnames=True,
                          enable_dns_support=True, tags={**ctx.tags, "Name": ctx.name("network", "vpc")}, opts=child)
        gateway = aws.ec2.InternetGateway(ctx.name("network", "igw"), vpc_id=vpc.id, tags=ctx.tags, opts=child)
        public_routes = aws.ec2.RouteTable(
            ctx.name("network", "public-rt"), vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=gateway.id)],
            tags={**ctx.tags, "Name": ctx.name("network", "public")}, opts=child)

        private: list[SubnetRef] = []
        public: list[SubnetRef] = []
        nat_ids: list[pulumi.Output[str]] = []
        for plan in plan_subnets(vpc_config):
            zone = plan.availability_zone
            public_subnet = aws.ec2.Subnet(
                ctx.name("network", f"public-{zone}"), vpc_id=vpc.id, cidr_block=plan.public_cidr,
                availability_zone=zone, map_public_ip_on_launch=True,
                tags={**ctx.tags, **cluster_tag, "Name": ctx.name("network", f"public-{zone}"),
                      "kubernetes.io/role/elb": "1"}, opts=child)
            aws.ec2.RouteTableAssociation(ctx.name("network", f"public-{zone}"), subnet_id=public_subnet.id,
                                          route_table_id=public_routes.id, opts=child)
            public.append(SubnetRef(id=public_subnet.id, availability_zone=zone))
            if vpc_config.nat_gateways == "perAz" or not nat_ids:
                eip = aws.ec2.Eip(ctx.name("network", f"nat-{zone}"), domain="vpc", tags=ctx.tags, opts=child)
                nat = aws.ec2.NatGateway(ctx.name("network", f"nat-{zone}"), allocation_id=eip.id,
                                         subnet_id=public_subnet.id, tags=ctx.tags,
                                         opts=pulumi.ResourceOptions(parent=self, depends_on=[gateway]))
                nat_ids.append(nat.id)
            private_subnet = aws.ec2.Subnet(
                ctx.name("network", f"private-{zone}"), vpc_id=vpc.id, cidr_block=plan.private_cidr,
                availability_zone=zone,
                tags={**ctx.tags, **cluster_tag, "Name": ctx.name("network", f"private-{zone}"),
                      "kubernetes.io/role/internal-elb": "1"}, opts=child)
            private_routes = aws.ec2.RouteTable(
                ctx.name("network", f"private-rt-{zone}"), vpc_id=vpc.id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat_ids[-1])],
                tags={**ctx.tags, "Name": ctx.name("network", f"private-{zone}")}, opts=child)
            aws.ec2.RouteTableAssociation(ctx.name("network", f"private-{zone}"), subnet_id=private_subnet.id,
                                          route_table_id=private_routes.id, opts=child)
            private.append(SubnetRef(id=private_subnet.id, availability_zone=zone))
        return NetworkInfo(vpc_id=vpc.id, vpc_cidr=vpc_config.cidr, private_subnets=tuple(private),
                           public_subnets=tuple(public))
