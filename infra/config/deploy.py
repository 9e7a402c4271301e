"""`ml-cluster:deploy`: where the stack's deploy and preview workflow jobs run, and whether that runner can reach
the cluster's API server.

The Kubernetes half of `pulumi up` talks to the API server from the runner. GitHub-hosted runners come from
GitHub's large, changing address ranges, so they reach an endpoint only when it is public to everyone, or when
the runner has static egress addresses (GitHub larger runners with static IPs, a runner behind a NAT) that the
endpoint allows (`egressCidrs`, added to the cluster's publicAccessCidrs). A self-hosted runner in the VPC (or a
peered network) reaches the private endpoint. Anything else is an unreachable cluster: `pulumi up` would apply
the whole AWS half (cluster, node groups: a quarter of an hour) and then fail every Kubernetes object, leaving a
half-applied stack. That is known from the config alone, so it is a config error, not a warning to miss.

scripts/deploy_runner.py turns `labels` into each workflow job's `runs-on`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import Field, field_validator, model_validator

from infra.config.base import StrictModel

EKS_MAX_PUBLIC_CIDRS = 40  # the EKS API's limit on publicAccessCidrs
ANYWHERE = "0.0.0.0/0"
MIN_EGRESS_PREFIX = 16  # a runner's static egress: NAT addresses or a larger runner's range (/28 to /32 in practice)
DEFAULT_LABELS = ("ubuntu-latest",)


class DeployConfig(StrictModel):
    runner: Literal["github-hosted", "self-hosted"] = "github-hosted"
    ("github-hosted: GitHub's runners (they reach a public endpoint only); self-hosted: a runner that reaches the "
     "private endpoint")
    labels: list[str] = Field(default_factory=list)
    """runs-on of the stack's deploy and preview jobs; GitHub-hosted default: ubuntu-latest."""
    egress_cidrs: list[str] = Field(default_factory=list)
    """The runner's public egress networks (static IPs); the cluster's endpoint allows them."""

    @field_validator("egress_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        for cidr in cidrs:
            network = ipaddress.IPv4Network(cidr, strict=True)
            # Each is added to the endpoint's publicAccessCidrs: 0.0.0.0/0 here would open a restricted endpoint
            # to the world without anyone writing that in cluster.publicAccessCidrs.
            if network.prefixlen < MIN_EGRESS_PREFIX:
                raise ValueError(f"{cidr} is {network.num_addresses} addresses, not a runner's static egress (a "
                                 f"/{MIN_EGRESS_PREFIX} or smaller); to open the endpoint to everyone, say so in "
                                 "cluster.publicAccessCidrs")
        return cidrs

    @field_validator("labels")
    @classmethod
    def _labels(cls, labels: list[str]) -> list[str]:
        for label in labels:
            if not label or label != label.strip() or any(c in label for c in "\"'$`{}\n"):
                raise ValueError(f"{label!r} is not a runner label")
        return labels

    @model_validator(mode="after")
    def _self_hosted_has_labels(self) -> DeployConfig:
        if self.runner == "self-hosted" and not self.labels:
            raise ValueError("runner self-hosted needs labels: the runs-on labels of a runner that reaches the "
                             "cluster (e.g. [self-hosted, linux, ml-prod-vpc])")
        return self

    def runs_on(self) -> list[str]:
        return list(self.labels) or list(DEFAULT_LABELS)


class ClusterEndpoint(Protocol):
    """What the reachability check reads of the cluster's config (`ml-cluster:cluster`)."""

    @property
    def endpoint_public_access(self) -> bool: ...
    @property
    def endpoint_private_access(self) -> bool: ...
    @property
    def public_access_cidrs(self) -> Sequence[str]: ...


def public_access_cidrs(cluster: ClusterEndpoint, deploy: DeployConfig) -> list[str]:
    """The endpoint's allowed networks: the cluster's own plus the deploy runner's egress (once each)."""
    cidrs = list(cluster.public_access_cidrs)
    if ANYWHERE in cidrs:
        return cidrs
    return cidrs + [cidr for cidr in deploy.egress_cidrs if cidr not in cidrs]


def reachability_problems(cluster: ClusterEndpoint, deploy: DeployConfig) -> list[tuple[str, str]]:
    """Why the deploy runner cannot reach the API server, or nothing when it can."""
    problems: list[tuple[str, str]] = []
    allowed = public_access_cidrs(cluster, deploy)
    if len(allowed) > EKS_MAX_PUBLIC_CIDRS:
        problems.append(("ml-cluster:deploy.egressCidrs", f"{len(allowed)} allowed networks with the cluster's "
                                                          f"publicAccessCidrs; EKS allows {EKS_MAX_PUBLIC_CIDRS}"))
    if deploy.egress_cidrs and not cluster.endpoint_public_access:
        problems.append(("ml-cluster:deploy.egressCidrs", "the endpoint is private (endpointPublicAccess: false): "
                                                          "egress CIDRs cannot reach it; use a self-hosted runner "
                                                          "in the VPC"))
    public_path = cluster.endpoint_public_access and (ANYWHERE in allowed or bool(deploy.egress_cidrs))
    private_path = deploy.runner == "self-hosted" and cluster.endpoint_private_access
    if deploy.runner == "self-hosted" and not (public_path or private_path):
        problems.append(("ml-cluster:deploy.runner", "a self-hosted runner reaches this endpoint only through the "
                                                     "VPC (set cluster.endpointPrivateAccess: true) or from "
                                                     "allowed egress networks (set deploy.egressCidrs)"))
    if deploy.runner == "github-hosted" and not public_path:
        where = ("the endpoint is private (cluster.endpointPublicAccess: false)" if not
                 cluster.endpoint_public_access else f"the endpoint allows only {', '.join(allowed)}")
        problems.append(("ml-cluster:deploy.runner", f"GitHub-hosted runners cannot reach the API server: {where}. "
                                                     "Use runner: self-hosted with the labels of a runner in the "
                                                     "VPC, or list the runner's static egress in "
                                                     "deploy.egressCidrs"))
    return problems
