"""The end of a Capacity Block: a stack Job that may run on a block must write its last checkpoint in the 10 minutes
between EKS's drain (40 min before the end) and EC2's shutdown (30 min before it); one that needs longer is one
config error line, before anything is created."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from infra.config import ConfigError
from infra.nodes.blockend import LAST_CHECKPOINT_WINDOW_S, block_end_problems
from infra.nodes.poolplan import plan_node_pools, pool_facts
from infra.plan.engine import STACKS_DIR
from tests.jobs.facts import dev_facts
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool
from workloads.jobspec import parse_spec, render_job

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
BLOCK = {"id": "cr-0123456789abcdef0", "availabilityZone": "us-west-2a", "instanceCount": 2}


def pools() -> Any:
    return plan_node_pools(eks_config([
        gpu_pool("a10g-block", ["g5.12xlarge"], capacityType="CAPACITY_BLOCK", capacityReservation=BLOCK),
        gpu_pool("a10g-od", ["g5.12xlarge"]), gpu_pool("l4", ["g6.xlarge"]),
    ]), fixture_lookup)


def job(**fields: Any) -> list[dict[str, Any]]:
    facts = replace(dev_facts(), pools=pool_facts(pools()))
    return render_job(parse_spec({"image": IMAGE, "name": "run", "gpus": 1, **fields}), facts)


def test_the_window_is_the_time_between_eks_drain_and_ec2_shutdown() -> None:
    assert LAST_CHECKPOINT_WINDOW_S == 600


@pytest.mark.parametrize(("fields", "lands"), [
    ({"gpuType": "a10g", "terminationGracePeriodSeconds": 600}, False),  # fits exactly
    ({"gpuType": "a10g", "terminationGracePeriodSeconds": 601}, True),
    # 60 s + 2 writes (a local file and its S3 mirror) of 40 GiB at 100 MiB/s: 879 s
    ({"gpuType": "a10g", "checkpoint": {"bucket": "checkpoints", "prefix": "run/", "size": "40Gi",
                                        "writeRate": "100Mi"}}, True),
    ({"gpuType": "l4", "terminationGracePeriodSeconds": 1800}, False),  # never on the a10g block
])
def test_a_job_on_a_block_must_checkpoint_within_the_window(fields: dict[str, Any], lands: bool) -> None:
    manifests = job(**fields)
    problems = block_end_problems(pools(), [manifests])
    assert bool(problems) == lands, problems
    if lands:
        [(path, why)] = problems
        grace = manifests[0]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert path == "ml-cluster:jobs[0]" and why.startswith("may run on Capacity Block pool a10g-block, ")
        assert f"a last checkpoint gets 600 s, this Job takes up to {grace} s" in why


def test_the_plan_refuses_such_a_job_before_anything_is_registered(plan_config: Any) -> None:
    values = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())["config"]
    block = {"name": "h100-block", "instanceTypes": ["p5.48xlarge"], "gpu": True, "capacityType": "CAPACITY_BLOCK",
             "maxSize": 2, "efa": True, "capacityReservation": {
                 "id": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b", "instanceCount": 2}}
    jobs = values["ml-cluster:jobs"]
    [index] = [i for i, spec in enumerate(jobs) if spec["name"] == "resnet50-ddp"]  # an h100 EFA gang
    jobs[index] = {**jobs[index], "terminationGracePeriodSeconds": 900}
    with pytest.raises(ConfigError) as caught:
        plan_config("prod", {"ml-cluster:nodePools": [*values["ml-cluster:nodePools"], block],
                             "ml-cluster:jobs": jobs})
    [line] = caught.value.lines()
    assert f"ml-cluster:jobs[{index}]" in line and "this Job takes up to 900 s" in line
