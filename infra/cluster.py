"""Cluster: an EKS cluster with its IAM, access entries, KMS envelope encryption and logs, or an existing cluster
reached by kubeconfig (onprem). Either way the result is a ClusterInfo with the Kubernetes provider."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config import ClusterConfig, OnpremConfig
from infra.context import ClusterInfo, NetworkInfo, StackContext
from infra.existing_cluster import FoundCluster, found_from_get_cluster
from infra.iam import service_trust_policy

ACCESS_POLICIES = {
    "cluster-admin": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSClusterAdminPolicy",
    "admin": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSAdminPolicy",
    "edit": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSEditPolicy",
    "view": "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy",
}
CLUSTER_POLICIES = ("arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",)
NODE_POLICIES = (
    "arn:aws:iam::aws:policy/AmazonEKSWorkerNodePolicy",
    "arn:aws:iam::aws:policy/AmazonEC2ContainerRegistryReadOnly",
    "arn:aws:iam::aws:policy/AmazonEKS_CNI_Policy",
    "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore",
)


def eks_kubeconfig(cluster_name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (no long-lived credentials in it)."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": cluster_name, "preferences": {},
        "clusters": [{"name": cluster_name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": cluster_name}}],
        "users": [{"name": cluster_name, "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1", "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", cluster_name, "--region", region,
                     "--output", "json"]}}}],
    })


@dataclass(frozen=True)
class EksClusterArgs:
    ctx: StackContext
    config: ClusterConfig
    network: NetworkInfo
    # The endpoint's allowed networks: the cluster's own plus the deploy runner's egress (infra.config.deploy).
    public_access_cidrs: tuple[str, ...] = ()


class _EksClusterComponent(pulumi.ComponentResource):
    """What the stack takes from its EKS cluster, whether it owns the cluster (EksCluster) or reads it
    (ExistingEksCluster)."""

    info: ClusterInfo
    kubeconfig: pulumi.Output[str]
    endpoint: pulumi.Output[str]


class EksCluster(_EksClusterComponent):
    def __init__(self, name: str, args: EksClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:EksCluster", name, None, opts)
        ctx, cfg, child = args.ctx, args.config, pulumi.ResourceOptions(parent=self)
        assert ctx.region is not None

        cluster_role = aws.iam.Role(ctx.name("cluster", "role"), assume_role_policy=service_trust_policy(
            "eks.amazonaws.com"), tags=ctx.tags, opts=child)
        attachments = [aws.iam.RolePolicyAttachment(ctx.name("cluster", policy.rsplit("/", 1)[1]),
                                                    role=cluster_role.name, policy_arn=policy, opts=child)
                       for policy in CLUSTER_POLICIES]
        node_role, node_attachments = _node_role(ctx, child)

        encryption = None
        if cfg.secrets_encryption:
            key_arn: pulumi.Input[str]
            if cfg.kms_key_arn:
                key_arn = cfg.kms_key_arn
            else:
                key = aws.kms.Key(ctx.name("cluster", "secrets-key"),
                                  description=f"EKS secrets envelope encryption for {cfg.name}",
                                  enable_key_rotation=True, deletion_window_in_days=30 if ctx.protected else 7,
                                  tags=ctx.tags, opts=pulumi.ResourceOptions(parent=self, protect=ctx.protected))
                aws.kms.Alias(ctx.name("cluster", "secrets-key"), name=f"alias/{cfg.name}-eks-secrets",
                              target_key_id=key.key_id, opts=child)
                key_arn = key.arn
            encryption = aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=key_arn), resources=["secrets"])

        # Created before the cluster so that retention is ours, not "never expire".
        log_group = aws.cloudwatch.LogGroup(ctx.name("cluster", "logs"), name=f"/aws/eks/{cfg.name}/cluster",
                                            retention_in_days=cfg.log_retention_days, tags=ctx.tags, opts=child)

        subnet_ids = [ref.id for ref in (*args.network.private_subnets, *args.network.public_subnets)]
        cluster = aws.eks.Cluster(
            ctx.name("cluster", "eks"),
            name=cfg.name,
            version=cfg.kubernetes_version,
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=cfg.upgrade_policy.upper()),
            role_arn=cluster_role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=subnet_ids,
                endpoint_private_access=cfg.endpoint_private_access,
                endpoint_public_access=cfg.endpoint_public_access,
                public_access_cidrs=(list(args.public_access_cidrs or cfg.public_access_cidrs)
                                     if cfg.endpoint_public_access else None),
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API", bootstrap_cluster_creator_admin_permissions=True),
            enabled_cluster_log_types=list(cfg.log_types),
            encryption_config=encryption,
            tags=ctx.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*attachments, log_group]),
        )
        cluster_sg_id = cluster.vpc_config.cluster_security_group_id

        node_sg = _node_security_group(ctx, cfg.name, args.network.vpc_id, cluster_sg_id, child)
        aws.vpc.SecurityGroupIngressRule(ctx.name("cluster", "cluster-from-node"), security_group_id=cluster_sg_id,
                                         referenced_security_group_id=node_sg.id, ip_protocol="-1",
                                         description="nodes to control plane", opts=child)
        _node_egress_rules(ctx, node_sg, child)
        _access_entries(ctx, cfg, cluster.name, self)

        region = ctx.region
        self.kubeconfig = pulumi.Output.secret(pulumi.Output.all(
            cluster.name, cluster.endpoint, cluster.certificate_authority.data).apply(
            lambda parts: eks_kubeconfig(parts[0], parts[1], parts[2], region)))
        self.endpoint = cluster.endpoint
        provider = k8s.Provider(ctx.name("cluster", "k8s"), kubeconfig=self.kubeconfig,
                                opts=pulumi.ResourceOptions(parent=self))
        self.info = ClusterInfo(
            name=cluster.name, kubernetes_version=cfg.kubernetes_version, provider=provider, is_eks=True,
            node_role_arn=node_role.arn, node_security_group_id=node_sg.id, cluster_security_group_id=cluster_sg_id,
            eks_dependencies=(cluster, *node_attachments))
        self.register_outputs({"name": cluster.name, "endpoint": cluster.endpoint})


def _node_role(ctx: StackContext, child: pulumi.ResourceOptions) -> tuple[aws.iam.Role, list[pulumi.Resource]]:
    """The IAM role the managed node groups' instances use, with the AWS policies nodes need."""
    node_role = aws.iam.Role(ctx.name("cluster", "node-role"), assume_role_policy=service_trust_policy(
        "ec2.amazonaws.com"), tags=ctx.tags, opts=child)
    node_attachments = [aws.iam.RolePolicyAttachment(ctx.name("cluster", f"node-{policy.rsplit('/', 1)[1]}"),
                                                     role=node_role.name, policy_arn=policy, opts=child)
                        for policy in NODE_POLICIES]
    return node_role, list(node_attachments)


def _node_security_group(ctx: StackContext, cluster_name: pulumi.Input[str], vpc_id: pulumi.Input[str],
                         cluster_sg_id: pulumi.Input[str], child: pulumi.ResourceOptions) -> aws.ec2.SecurityGroup:
    """The nodes' security group: open to itself (pods, NCCL, EFA) and to the control plane's group."""
    node_sg = aws.ec2.SecurityGroup(ctx.name("cluster", "node-sg"), vpc_id=vpc_id,
                                    description=pulumi.Output.concat("Nodes of EKS cluster ", cluster_name),
                                    tags={**ctx.tags, "Name": ctx.name("cluster", "node-sg")}, opts=child)
    aws.vpc.SecurityGroupIngressRule(ctx.name("cluster", "node-from-node"), security_group_id=node_sg.id,
                                     referenced_security_group_id=node_sg.id, ip_protocol="-1",
                                     description="node to node (pods, NCCL, EFA)", opts=child)
    aws.vpc.SecurityGroupIngressRule(ctx.name("cluster", "node-from-cluster"), security_group_id=node_sg.id,
                                     referenced_security_group_id=cluster_sg_id, ip_protocol="-1",
                                     description="control plane to nodes", opts=child)
    return node_sg


def _node_egress_rules(ctx: StackContext, node_sg: aws.ec2.SecurityGroup, child: pulumi.ResourceOptions) -> None:
    aws.vpc.SecurityGroupEgressRule(ctx.name("cluster", "node-egress"), security_group_id=node_sg.id,
                                    cidr_ipv4="0.0.0.0/0", ip_protocol="-1", description="all egress", opts=child)
    # EFA's SRD traffic is matched by security-group rules only, never by CIDRs: without egress to the group
    # itself NCCL over EFA fails with "unresponsive receiver" (EC2 User Guide, "Prepare an EFA-enabled
    # security group": all traffic to and from the group itself).
    aws.vpc.SecurityGroupEgressRule(ctx.name("cluster", "node-to-node"), security_group_id=node_sg.id,
                                    referenced_security_group_id=node_sg.id, ip_protocol="-1",
                                    description="node to node (EFA)", opts=child)


def _access_entries(ctx: StackContext, cfg: ClusterConfig, cluster_name: pulumi.Input[str],
                    parent: pulumi.Resource) -> None:
    """The configured people and roles, each an access entry with its access policy (cluster or namespaces)."""
    child = pulumi.ResourceOptions(parent=parent)
    for index, entry in enumerate(cfg.access_entries):
        access = aws.eks.AccessEntry(ctx.name("cluster", f"access-{index}"), cluster_name=cluster_name,
                                     principal_arn=entry.principal_arn, type="STANDARD", tags=ctx.tags,
                                     opts=child)
        scope = (aws.eks.AccessPolicyAssociationAccessScopeArgs(type="namespace", namespaces=entry.namespaces)
                 if entry.namespaces else aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"))
        aws.eks.AccessPolicyAssociation(ctx.name("cluster", f"access-{index}"), cluster_name=cluster_name,
                                        principal_arn=entry.principal_arn,
                                        policy_arn=ACCESS_POLICIES[entry.policy], access_scope=scope,
                                        opts=pulumi.ResourceOptions(parent=parent, depends_on=[access]))


@dataclass(frozen=True)
class ExistingClusterArgs:
    ctx: StackContext
    config: OnpremConfig
    kubeconfig: pulumi.Input[str]  # a secret


class ExistingCluster(pulumi.ComponentResource):
    """An existing (non-EKS) cluster: only a Kubernetes provider, nothing in AWS."""

    info: ClusterInfo
    kubeconfig: pulumi.Output[str]

    def __init__(self, name: str, args: ExistingClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:ExistingCluster", name, None, opts)
        self.kubeconfig = pulumi.Output.secret(args.kubeconfig)
        provider = k8s.Provider(args.ctx.name("cluster", "k8s"), kubeconfig=self.kubeconfig,
                                context=args.config.context, opts=pulumi.ResourceOptions(parent=self))
        self.info = ClusterInfo(name=args.config.cluster_name, kubernetes_version=args.config.kubernetes_version,
                                provider=provider, is_eks=False)
        self.register_outputs({"name": args.config.cluster_name})


def find_cluster(name: str) -> FoundCluster:
    """Read an existing EKS cluster (DescribeCluster through aws.eks.get_cluster), each field checked by type
    (ClusterAnswerError names the cluster and the field)."""
    return found_from_get_cluster(_wire(aws.eks.get_cluster(name=name)), asked=name)


def _wire(found: Any) -> dict[str, Any]:
    """The data source's typed result back in its wire shape (a stacks/fixtures/clusters.json entry), for the
    checks in infra/existing_cluster.py: a block the provider left out is missing there, not an AttributeError."""
    vpc, network = found.vpc_config, (found.kubernetes_network_configs or [None])[0]
    return {
        "name": found.name, "arn": found.arn, "version": found.version, "status": found.status,
        "endpoint": found.endpoint, "platformVersion": found.platform_version, "roleArn": found.role_arn,
        "tags": found.tags, "createdAt": found.created_at,
        "certificateAuthorities": [{"data": ca.data} for ca in found.certificate_authorities or []],
        "accessConfigs": [{"authenticationMode": access.authentication_mode} for access in found.access_configs or []],
        "vpcConfig": None if vpc is None else {
            "vpcId": vpc.vpc_id, "subnetIds": vpc.subnet_ids, "securityGroupIds": vpc.security_group_ids,
            "clusterSecurityGroupId": vpc.cluster_security_group_id,
            "endpointPublicAccess": vpc.endpoint_public_access, "endpointPrivateAccess": vpc.endpoint_private_access,
            "publicAccessCidrs": vpc.public_access_cidrs},
        "kubernetesNetworkConfigs": [] if network is None else [{"serviceIpv4Cidr": network.service_ipv4_cidr}],
    }


@dataclass(frozen=True)
class ExistingEksClusterArgs:
    ctx: StackContext
    config: ClusterConfig
    network: NetworkInfo
    found: FoundCluster


class ExistingEksCluster(_EksClusterComponent):
    """An EKS cluster the stack reads and never owns: the stack adds its nodes' role and security group, its access
    entries and a Kubernetes provider; the cluster, its VPC, its security groups and node groups are left alone."""

    def __init__(self, name: str, args: ExistingEksClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:ExistingEksCluster", name, None, opts)
        ctx, found, child = args.ctx, args.found, pulumi.ResourceOptions(parent=self)
        assert ctx.region is not None
        node_role, node_attachments = _node_role(ctx, child)
        # The nodes join the cluster's own security group too (the launch templates attach both), which already
        # lets its members reach the control plane: no rule is added to a group the stack does not own.
        node_sg = _node_security_group(ctx, found.name, args.network.vpc_id, found.cluster_security_group_id, child)
        _node_egress_rules(ctx, node_sg, child)
        _access_entries(ctx, args.config, found.name, self)
        self.kubeconfig = pulumi.Output.secret(eks_kubeconfig(found.name, found.endpoint,
                                                              found.certificate_authority, ctx.region))
        self.endpoint = pulumi.Output.from_input(found.endpoint)
        provider = k8s.Provider(ctx.name("cluster", "k8s"), kubeconfig=self.kubeconfig, opts=child)
        self.info = ClusterInfo(
            name=found.name, kubernetes_version=found.version, provider=provider, is_eks=True,
            node_role_arn=node_role.arn, node_security_group_id=node_sg.id,
            cluster_security_group_id=found.cluster_security_group_id, eks_dependencies=tuple(node_attachments))
        self.register_outputs({"name": found.name, "endpoint": found.endpoint})
