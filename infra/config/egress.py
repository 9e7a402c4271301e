"""`ml-cluster:jobEgress`: where training pods may open connections.

`open` (the default) leaves egress unrestricted. `restricted` allows only cluster DNS, the pods of the same
namespace (a multi-node gang's rendezvous and collectives), the EKS Pod Identity agent, and HTTPS to the listed
CIDRs: the object store (S3's prefix-list ranges or a VPC endpoint's addresses, the COS endpoint), the registry.
A NetworkPolicy names addresses, not host names, so those ranges are the user's to give.
"""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator, model_validator

from infra.config.base import StrictModel
from workloads.jobspec import EgressRules


class JobEgressConfig(StrictModel):
    mode: Literal["open", "restricted"] = "open"
    ("open: no egress restriction; restricted: only DNS, the namespace's pods, the Pod Identity agent and allowCidrs "
     "on allowPorts")
    allow_cidrs: list[str] = Field(default_factory=list)
    """HTTPS (443) destinations, e.g. S3 ranges"""
    allow_ports: list[int] = Field(default_factory=lambda: [443])
    """TCP ports open to allowCidrs"""

    @field_validator("allow_cidrs")
    @classmethod
    def _cidrs(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                ipaddress.ip_network(value, strict=True)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not a CIDR block ({exc})") from None
        return values

    @field_validator("allow_ports")
    @classmethod
    def _ports(cls, values: list[int]) -> list[int]:
        bad = [port for port in values if not 1 <= port <= 65535]
        if bad:
            raise ValueError(f"ports {bad} are not 1-65535")
        return values

    @model_validator(mode="after")
    def _restricted_needs_destinations(self) -> JobEgressConfig:
        if self.mode == "restricted" and not self.allow_cidrs:
            raise ValueError("mode restricted needs allowCidrs (at least the object store's ranges), or the "
                             "Jobs can reach neither their data nor their checkpoints")
        return self

    def rules(self, platform: str) -> EgressRules | None:
        """The namespace's egress rules; None leaves egress open."""
        if self.mode == "open":
            return None
        return EgressRules(cidrs=tuple(self.allow_cidrs), ports=tuple(self.allow_ports),
                           pod_identity_agent=platform == "eks")
