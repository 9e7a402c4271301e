"""Sharded checkpoints size the grace period from the per-rank share and the tiers' write rates; a grace period
too short for them is a config error naming the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs.facts import ALL_FACTS
from tests.jobs.jobrules import check_job
from workloads.jobspec import JobSpecError, load_job_file, parse_spec, render_job

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train-fsdp-job.yaml"
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"


def _spec(checkpoint: dict, **fields: object):  # noqa: ANN202
    return parse_spec({"name": "llm", "image": IMAGE, "nodes": 4, "gpus": 8, "checkpoint": checkpoint, **fields})


def test_the_fsdp_example_renders_with_a_grace_period_from_its_shards() -> None:
    (spec,) = load_job_file(EXAMPLE)
    job, *_ = render_job(spec, ALL_FACTS["prod"])
    check_job(job)
    # 40 GiB over 16 ranks = 2.5 GiB per rank, 20 GiB per node: 10 s at 2 GiB/s local, 40.96 s at 500 MiB/s to S3
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 60 + 51


def test_sharded_needs_a_fraction_of_the_whole_state_write() -> None:
    whole = _spec({"uri": "s3://ckpt-bucket/run", "size": "1Ti", "writeRate": "1Gi"})
    sharded = _spec({"uri": "s3://ckpt-bucket/run", "size": "1Ti", "writeRate": "1Gi", "sharded": True,
                     "localWriteRate": "4Gi"})
    assert whole.grace_seconds() == 60 + 2048  # rank 0 writes 1 TiB, then mirrors it
    assert sharded.grace_seconds() == 60 + 64 + 256  # each node: 256 GiB at 4 GiB/s, then at 1 GiB/s


def test_a_grace_period_too_short_for_the_sharded_state_is_refused_with_the_numbers() -> None:
    with pytest.raises(JobSpecError) as caught:
        _spec({"uri": "s3://ckpt-bucket/run", "size": "1Ti", "writeRate": "1Gi", "sharded": True,
               "localWriteRate": "4Gi"}, terminationGracePeriodSeconds=300)
    text = str(caught.value)
    assert "terminationGracePeriodSeconds" in text
    assert "32.0 GiB per rank x 8 ranks per node = 256.0 GiB" in text and "380 s" in text


def test_a_whole_state_checkpoint_keeps_its_explicit_grace_period() -> None:
    spec = _spec({"uri": "s3://ckpt-bucket/run", "size": "1Ti", "writeRate": "1Gi"}, terminationGracePeriodSeconds=300)
    assert spec.grace_seconds() == 300
