"""A checkpoint on FSx for Lustre is written at the file system's share of its baseline throughput (per-unit
throughput x capacity, over the Job's clients that write at once), not a stated constant: figures by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.jobs.facts import prod_facts
from workloads.cluster_facts import ClusterFacts, FileSystemFacts, facts_from_dict, facts_to_dict
from workloads.jobspec import JobSpecError, parse_spec, render_job

IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/ml-cluster-train:0.1.0"
GIB = 2**30
# prod's file system: 4800 GiB at 250 MB/s/TiB = 250e6 x 4800 / 1024 = 1,171,875,000 bytes/s
PROD_FSX = FileSystemFacts(kind="fsx-lustre", per_unit_mbps=250, capacity_gib=4800)


def _facts() -> ClusterFacts:
    facts = prod_facts()
    return replace(facts, volume_claims=("fsx-lustre", "checkpoints-efs"), file_systems={"fsx-lustre": PROD_FSX})


def _grace(checkpoint: dict, facts: ClusterFacts | None = None, **fields: object) -> int:
    spec = parse_spec({"name": "ddp", "image": IMAGE, "nodes": 2, "gpus": 8, "gpuType": "h100",
                       "checkpoint": {"claimName": "fsx-lustre", "mountPath": "/fsx", **checkpoint}, **fields})
    job, *_ = render_job(spec, facts or _facts())
    return job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def test_the_file_systems_throughput_is_per_unit_times_capacity() -> None:
    assert PROD_FSX.bytes_per_second == 1_171_875_000
    assert FileSystemFacts("fsx-lustre", 1000, 1200).bytes_per_second == 1_171_875_000  # 1000 x 1.171875 TiB


def test_a_whole_checkpoint_is_written_by_rank_0_at_the_whole_file_systems_rate() -> None:
    # 8 GiB = 8,589,934,592 bytes / 1,171,875,000 bytes/s = 7.33 s -> 8 s, plus the 60 s stop base
    assert _grace({"size": "8Gi"}) == 68
    # the same checkpoint on a claim without a known throughput: the 100 MiB/s default, 81.92 s -> 82 s
    assert _grace({"claimName": "checkpoints-efs", "size": "8Gi"}) == 60 + 82


def test_sharded_writers_share_the_file_system_node_by_node() -> None:
    # 64 GiB over 2 nodes x 8 ranks: 4 GiB a rank, 32 GiB = 34,359,738,368 bytes a node, both nodes at once:
    # 1,171,875,000 / 2 = 585,937,500 bytes/s each -> 58.64 s -> 59 s
    assert _grace({"size": "64Gi", "sharded": True}) == 60 + 59
    # a larger file system (9600 GiB at 500 MB/s/TiB = 4,687,500,000 bytes/s; 2,343,750,000 a node): 14.66 s -> 15
    bigger = replace(_facts(), file_systems={"fsx-lustre": FileSystemFacts("fsx-lustre", 500, 9600)})
    assert _grace({"size": "64Gi", "sharded": True}, bigger) == 60 + 15


def test_a_stated_rate_above_the_file_systems_share_is_refused_with_both_numbers() -> None:
    with pytest.raises(JobSpecError) as caught:
        _grace({"size": "8Gi", "writeRate": "2Gi"})
    text = str(caught.value)
    assert text.startswith("checkpoint.writeRate: 2Gi (2147483648 bytes/s) is more than claim fsx-lustre")
    assert "1171875000 bytes/s = 1171875000 bytes/s (250 MB/s/TiB x 4800 GiB" in text
    with pytest.raises(JobSpecError, match=r"checkpoint.localWriteRate: 1Gi .* 585937500 bytes/s .* / 2 writer"):
        _grace({"size": "64Gi", "sharded": True, "localWriteRate": "1Gi"})


def test_a_stated_lower_rate_is_kept() -> None:
    # a measured 500 MiB/s (524,288,000 bytes/s): 8 GiB in 16.38 s -> 17 s
    assert _grace({"size": "8Gi", "writeRate": "500Mi"}) == 60 + 17


def test_a_set_grace_period_is_checked_against_the_file_systems_rate() -> None:
    with pytest.raises(JobSpecError, match="terminationGracePeriodSeconds: 100 s cannot save the sharded checkpoint"):
        _grace({"size": "64Gi", "sharded": True}, terminationGracePeriodSeconds=100)
    assert _grace({"size": "64Gi", "sharded": True}, terminationGracePeriodSeconds=119) == 119


def test_the_file_systems_travel_in_the_published_facts_and_are_left_out_without_one() -> None:
    assert "file_systems" not in facts_to_dict(prod_facts())
    facts = _facts()
    assert facts_from_dict(facts_to_dict(facts)) == facts
