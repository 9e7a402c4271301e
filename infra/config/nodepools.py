"""Stack config: node pools (`ml-cluster:nodePools`) and GPU plumbing (`ml-cluster:gpu`).

STUB by the lead; owned and completed by the node-pools work (issue 3).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from infra.config.base import DnsLabel, StrictModel


class NodePoolConfig(StrictModel):
    name: DnsLabel
    instance_types: list[str] = Field(min_length=1)
    capacity_type: Literal["ON_DEMAND", "SPOT"] = "ON_DEMAND"
    min_size: int = Field(default=0, ge=0)
    desired_size: int = Field(default=0, ge=0)
    max_size: int = Field(default=1, ge=1)
    gpu: bool = False


class GpuConfig(StrictModel):
    pass
