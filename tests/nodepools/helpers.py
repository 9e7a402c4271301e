"""Shared helpers: stack configs built in memory and instance facts answered from the offline fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.config.schema import StackConfig, parse_stack_config
from infra.nodes.instances import InstanceShape, UnknownInstanceType, shape_from_result
from infra.plan.engine import STACKS_DIR

FIXTURES = json.loads((Path(STACKS_DIR) / "fixtures" / "instance_types.json").read_text())


def fixture_lookup(instance_type: str) -> InstanceShape:
    """What aws.ec2.get_instance_type answers offline, without the engine."""
    if instance_type not in FIXTURES:
        raise UnknownInstanceType(instance_type)
    return shape_from_result(instance_type, FIXTURES[instance_type])


def eks_config(pools: list[dict[str, Any]], gpu: dict[str, Any] | None = None) -> StackConfig:
    raw: dict[str, Any] = {
        "aws:region": "us-west-2",
        "ml-cluster:platform": "eks",
        "ml-cluster:network": {"create": {"availabilityZones": ["us-west-2a", "us-west-2b"]}},
        "ml-cluster:cluster": {"name": "ml-test", "kubernetesVersion": "1.33"},
        "ml-cluster:nodePools": pools,
    }
    if gpu is not None:
        raw["ml-cluster:gpu"] = gpu
    return parse_stack_config(raw)


def gpu_pool(name: str = "gpu", types: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "instanceTypes": types or ["g5.xlarge"], "gpu": True, "maxSize": 2, **extra}
