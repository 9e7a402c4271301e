"""The facts that flow from one component to the next: who the stack is, its network, its cluster.

Components take these typed records instead of reaching into each other's resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from workloads.jobspec import defaults


@dataclass(frozen=True)
class StackContext:
    project: str  # "ml-cluster"
    stack: str  # "dev", "prod", ...
    prefix: str  # logical-name prefix, "<project>-<stack>" shortened, e.g. "mlc-dev"
    label_prefix: str  # Kubernetes label prefix, e.g. "ml-cluster.io"
    protected: bool  # stateful resources are protected and retained (prod)
    region: str | None  # AWS region; None on onprem
    tags: dict[str, str] = field(default_factory=dict)  # applied to every AWS resource that takes tags

    def name(self, capability: str, thing: str) -> str:
        """Pulumi logical name `<stack-prefix>-<capability>-<thing>`."""
        return f"{self.prefix}-{capability}-{thing}"


def stack_labels(stack: str, label_prefix: str) -> dict[str, str]:
    """The labels every Kubernetes object this stack creates carries: whose it is and which stack's."""
    return defaults.stack_labels(stack, label_prefix, managed_by="pulumi")


@dataclass(frozen=True)
class SubnetRef:
    id: pulumi.Input[str]
    availability_zone: str  # known at program time (created per AZ, or looked up with aws.ec2.get_subnet)


@dataclass(frozen=True)
class NetworkInfo:
    vpc_id: pulumi.Input[str]
    vpc_cidr: str | None
    private_subnets: tuple[SubnetRef, ...]  # node groups and EFS mount targets live here
    public_subnets: tuple[SubnetRef, ...]


@dataclass(frozen=True)
class ClusterInfo:
    name: pulumi.Input[str]
    kubernetes_version: str  # "1.33"
    provider: k8s.Provider  # every Kubernetes object of the stack is created through it
    is_eks: bool
    # EKS only (None on onprem):
    node_role_arn: pulumi.Input[str] | None = None  # IAM role the managed node groups' instances use
    node_security_group_id: pulumi.Input[str] | None = None  # attach to every node (launch templates)
    cluster_security_group_id: pulumi.Input[str] | None = None  # EKS-created; also attach to nodes
    eks_dependencies: tuple[pulumi.Resource, ...] = ()  # resources node groups / add-ons must wait for
