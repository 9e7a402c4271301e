"""Stack config: the network (`ml-cluster:network`: a VPC created or adopted), the EKS cluster
(`ml-cluster:cluster`: created, or an existing one read) and, on onprem, the existing cluster (`ml-cluster:onprem`)."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from infra.config.base import PRINCIPAL_ARN, DnsLabel, StrictModel

# Kubernetes minor versions this project is tested against (kubernetes-validate schemas exist for them). Whether
# a minor is still supported on the day of a plan is the support calendar's (infra/config/support.py) to say.
SUPPORTED_KUBERNETES = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35", "1.36")

_AZ = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")


class NewVpcConfig(StrictModel):
    cidr: str = "10.0.0.0/16"
    """the VPC's IPv4 block (/20 or larger)"""
    availability_zones: list[str] = Field(min_length=2, max_length=4)
    """EKS needs two AZs; the VPC is split into 8 blocks, a private and a public one per AZ."""
    nat_gateways: Literal["single", "perAz"] = "single"
    """single: one NAT gateway for every zone (cheaper); perAz: one per zone (a zone outage leaves the others online)"""

    @field_validator("cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        network = ipaddress.IPv4Network(value, strict=True)
        if network.prefixlen > 20:
            raise ValueError(f"{value} is too small: use /20 or larger so every AZ gets a private and public /24+")
        return value

    @field_validator("availability_zones")
    @classmethod
    def _zones(cls, zones: list[str]) -> list[str]:
        for zone in zones:
            if not _AZ.match(zone):
                raise ValueError(f"{zone!r} is not an availability zone name like us-west-2a")
        if len(set(zones)) != len(zones):
            raise ValueError("availability zones must be distinct")
        return zones


class ExistingVpcConfig(StrictModel):
    vpc_id: str = Field(pattern=r"^vpc-[0-9a-f]{8,17}$")
    """the VPC to adopt"""
    private_subnet_ids: list[str] = Field(min_length=1)
    """subnets of the nodes, EFS mount targets and the control plane's interfaces"""
    public_subnet_ids: list[str] = []
    """subnets for internet-facing load balancers; empty: none"""

    @field_validator("private_subnet_ids", "public_subnet_ids")
    @classmethod
    def _subnets(cls, ids: list[str]) -> list[str]:
        for subnet_id in ids:
            if not re.match(r"^subnet-[0-9a-f]{8,17}$", subnet_id):
                raise ValueError(f"{subnet_id!r} is not a subnet id like subnet-0abc12345")
        if len(set(ids)) != len(ids):
            raise ValueError("subnet ids must be distinct")
        return ids


class NetworkConfig(StrictModel):
    """Either `create` a VPC or adopt an `existing` one: exactly one of the two."""

    create: NewVpcConfig | None = None
    """create a VPC with a private and a public subnet per availability zone"""
    existing: ExistingVpcConfig | None = None
    """adopt an existing VPC and its subnets (looked up, never modified)"""

    @model_validator(mode="after")
    def _exactly_one(self) -> NetworkConfig:
        if (self.create is None) == (self.existing is None):
            raise ValueError("set exactly one of network.create and network.existing")
        return self


class AccessEntryConfig(StrictModel):
    principal_arn: str = Field(pattern=PRINCIPAL_ARN)
    """the IAM role or user ARN (arn:aws:iam::<account>:role/<name>; not an STS assumed-role session ARN)"""
    policy: Literal["cluster-admin", "admin", "edit", "view"] = "cluster-admin"
    ("the EKS access policy: AmazonEKSClusterAdminPolicy, AmazonEKSAdminPolicy, AmazonEKSEditPolicy or "
     "AmazonEKSViewPolicy")
    namespaces: list[DnsLabel] = []
    """empty: the access applies cluster-wide"""


ClusterLogType = Literal["api", "audit", "authenticator", "controllerManager", "scheduler"]


class ClusterConfig(StrictModel):
    name: DnsLabel
    """the EKS cluster's name (also its CloudWatch log group /aws/eks/<name>/cluster)"""
    kubernetes_version: str
    "the control plane's Kubernetes minor, e.g. \"1.35\"; node groups follow it"
    upgrade_policy: Literal["standard", "extended"] = "standard"
    ("What EKS does at the end of the minor's standard support: upgrade the cluster (standard) or keep it on the "
     "minor at the extended-support rate (extended). EKS's own API default is extended.")
    endpoint_public_access: bool = True
    """the API endpoint is reachable from the internet (from publicAccessCidrs)"""
    endpoint_private_access: bool = True
    """the API endpoint is reachable from inside the VPC"""
    public_access_cidrs: list[str] = ["0.0.0.0/0"]
    """IPv4 blocks allowed to the public API endpoint"""
    log_types: list[ClusterLogType] = ["api", "audit", "authenticator"]
    """control plane logs sent to CloudWatch"""
    log_retention_days: int = Field(default=30, ge=1, le=3653)
    """how long CloudWatch keeps the control plane logs"""
    access_entries: list[AccessEntryConfig] = []
    """IAM roles and users given access to the cluster (EKS access entries)"""
    secrets_encryption: bool = True
    """envelope-encrypt Kubernetes Secrets with a KMS key"""
    kms_key_arn: str | None = Field(default=None, pattern=r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:key/.+$")
    """the KMS key for secretsEncryption; default: a key the stack creates (rotation on)"""
    existing: bool = False
    ("lay the stack onto the EKS cluster called `name` that already runs (terraform-aws-modules/eks, "
     "eksctl, CDK): the program reads it (aws.eks.get_cluster) and never creates, changes or deletes "
     "it, its VPC or its node groups; network.existing names its VPC and the subnets for the "
     "stack's pools and mount targets, kubernetesVersion must be the version it runs "
     "(docs/operations.md, \"Use an existing EKS cluster\")")

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        return _check_kubernetes_version(value)

    @field_validator("public_access_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        for cidr in cidrs:
            ipaddress.IPv4Network(cidr, strict=True)
        return cidrs

    @model_validator(mode="after")
    def _reachable(self) -> ClusterConfig:
        if not (self.endpoint_public_access or self.endpoint_private_access):
            raise ValueError("endpointPublicAccess and endpointPrivateAccess cannot both be false")
        owned = sorted(EXISTING_CLUSTER_OWNED & self.model_fields_set)
        if self.existing and owned:
            keys = ", ".join(to_camel(key) for key in owned)
            raise ValueError(f"existing: true: {keys} configure a cluster the stack creates; the existing cluster "
                             "keeps its own (remove them)")
        return self


# What only a cluster the stack creates takes: an existing cluster keeps its endpoint, logs and encryption.
EXISTING_CLUSTER_OWNED = frozenset({
    "upgrade_policy", "endpoint_public_access", "endpoint_private_access", "public_access_cidrs", "log_types",
    "log_retention_days", "secrets_encryption", "kms_key_arn"})


class OnpremConfig(StrictModel):
    """An existing Kubernetes cluster reached with the `ml-cluster:kubeconfig` secret."""

    cluster_name: DnsLabel
    ("the existing cluster's name, as the stack's outputs report it (the kubeconfig context decides which cluster is "
     "reached)")
    kubernetes_version: str
    "the existing cluster's Kubernetes minor, e.g. \"1.36\" (the manifests are validated against it)"
    context: str | None = None
    """kubeconfig context; default: current-context"""

    @field_validator("kubernetes_version")
    @classmethod
    def _version(cls, value: str) -> str:
        return _check_kubernetes_version(value)


def _check_kubernetes_version(value: str) -> str:
    if value not in SUPPORTED_KUBERNETES:
        raise ValueError(f"{value!r} is not a supported Kubernetes version ({', '.join(SUPPORTED_KUBERNETES)})")
    return value
