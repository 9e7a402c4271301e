"""The Spot interruption notice: a stack Job with a checkpoint that may run on a Spot pool must stop (the step in
flight, then the whole save: the local tier and the copy to the remote one) within the 120 s between EC2's notice
and the reclaim; one that needs longer is one config error line naming the numbers. Figures computed by hand."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from infra.nodes.blockend import SPOT_NOTICE_S, spot_notice_problems
from infra.nodes.poolplan import plan_node_pools, pool_facts
from tests.jobs.facts import dev_facts
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool
from workloads.jobspec import parse_spec, render_job

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"


def pools() -> Any:
    return plan_node_pools(eks_config([
        gpu_pool("a10g-spot", ["g5.12xlarge"], capacityType="SPOT"),  # 4 A10G per node
        gpu_pool("l4", ["g6.xlarge"]),
    ]), fixture_lookup)


def problems(**fields: Any) -> list[tuple[str, str]]:
    spec = parse_spec({"image": IMAGE, "name": "run", "gpus": 4, "gpuType": "a10g", **fields})
    manifests = render_job(spec, replace(dev_facts(), pools=pool_facts(pools())))
    return spot_notice_problems(pools(), [spec], [manifests])


SHARDED = {"uri": "s3://ckpt-bucket/run", "size": "64Gi", "sharded": True, "localWriteRate": "4Gi"}


def test_the_notice_is_two_minutes() -> None:
    assert SPOT_NOTICE_S == 120


def test_a_sharded_save_that_fits_the_notice_passes() -> None:
    # 64 GiB over 4 ranks: 16 GiB per rank, 64 GiB per node; 64/4 = 16 s local, 64/2 = 32 s to S3: 60 + 48 = 108 s
    assert problems(checkpoint={**SHARDED, "writeRate": "2Gi"}) == []


def test_a_sharded_save_past_the_notice_is_a_config_error_naming_the_numbers() -> None:
    # the same at 1 GiB/s to S3: 16 s + 64 s = 80 s, 60 + 80 = 140 s > 120 s
    [(path, why)] = problems(checkpoint={**SHARDED, "writeRate": "1Gi"})
    assert path == "ml-cluster:jobs[0]"
    assert why.startswith("may run on Spot pool a10g-spot, whose nodes EC2 reclaims 120 s after the interruption "
                          "notice, but its stop takes 140 s: 60 s stop base + 16.0 GiB per rank x 4 ranks per node = "
                          "64.0 GiB at 4.0 GiB/s local (16 s) then at 1.0 GiB/s to the remote tier (64 s)"), why


def test_a_whole_state_checkpoint_counts_its_write_and_its_mirror() -> None:
    # rank 0 writes 4 GiB at 100 MiB/s (40.96 s), then mirrors it (40.96 s): 81.92 -> 82 s, 60 + 82 = 142 s
    [(_, why)] = problems(checkpoint={"uri": "s3://ckpt-bucket/run", "size": "4Gi", "writeRate": "100Mi"})
    assert "its stop takes 142 s: 60 s stop base + 4.0 GiB whole at 0.1 GiB/s, written then mirrored (82 s)" in why


@pytest.mark.parametrize("fields", [
    {"checkpoint": {**SHARDED, "writeRate": "1Gi"}, "gpuType": "l4", "gpus": 1},  # never on the Spot pool
    {},  # no checkpoint: nothing to save on the notice
])
def test_jobs_off_spot_or_without_a_checkpoint_pass(fields: dict[str, Any]) -> None:
    assert problems(**fields) == []
