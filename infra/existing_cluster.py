"""An existing EKS cluster a stack lays itself onto: what DescribeCluster says of it, and why it may not fit the stack
file. Pure: the program reads the cluster through aws.eks.get_cluster (infra/cluster.py find_cluster), preflight
through boto3's describe_cluster; both check it here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.config import ClusterConfig


@dataclass(frozen=True)
class FoundCluster:
    """What aws.eks.get_cluster says of an existing EKS cluster (looked up once, in the facts phase)."""

    name: str
    version: str
    vpc_id: str
    endpoint: str
    certificate_authority: str
    cluster_security_group_id: str
    authentication_mode: str
    status: str


# Access entries (the stack's people, its teams, and the node role of managed node groups, which EKS adds itself)
# need one of these (EKS User Guide, "Grant IAM users access to Kubernetes with EKS access entries").
ACCESS_ENTRY_MODES = ("API", "API_AND_CONFIG_MAP")


def found_from_describe(cluster: Mapping[str, Any]) -> FoundCluster:
    """From boto3's describe_cluster()["cluster"] (the EKS API's field names)."""
    vpc = cluster.get("resourcesVpcConfig") or {}
    access = cluster.get("accessConfig") or {}
    return FoundCluster(name=str(cluster.get("name")), version=str(cluster.get("version")),
                        vpc_id=str(vpc.get("vpcId")), endpoint=str(cluster.get("endpoint")),
                        certificate_authority=str((cluster.get("certificateAuthority") or {}).get("data")),
                        cluster_security_group_id=str(vpc.get("clusterSecurityGroupId")),
                        authentication_mode=str(access.get("authenticationMode") or "CONFIG_MAP"),
                        status=str(cluster.get("status")))


def existing_cluster_problems(found: FoundCluster, cfg: ClusterConfig, vpc_id: str) -> list[tuple[str, str]]:
    """Why the stack cannot be laid onto the cluster it read: each a `path: why` with the fix."""
    problems = []
    if found.status != "ACTIVE":
        problems.append(("cluster.name", f"cluster {found.name} is {found.status}, not ACTIVE: wait for it"))
    if found.version != cfg.kubernetes_version:
        problems.append(("cluster.kubernetesVersion", f"{cfg.kubernetes_version}, but cluster {found.name} runs "
                                                      f"{found.version}: set kubernetesVersion: \"{found.version}\""))
    if found.vpc_id != vpc_id:
        problems.append(("network.existing.vpcId", f"{vpc_id}, but cluster {found.name} is in {found.vpc_id}: "
                                                   f"set vpcId: {found.vpc_id} and that VPC's subnets"))
    if found.authentication_mode not in ACCESS_ENTRY_MODES:
        problems.append(("cluster.name", f"cluster {found.name} authenticates with {found.authentication_mode} "
                                         "only; the stack's node groups and people need access entries: aws eks "
                                         f"update-cluster-config --name {found.name} --access-config "
                                         "authenticationMode=API_AND_CONFIG_MAP"))
    return problems
