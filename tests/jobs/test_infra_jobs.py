"""Pure builders of infra/jobs.py: the Jobs' IAM policy and namespace."""

from __future__ import annotations

import json

import pytest

from infra.jobs import checkpoint_buckets, job_access_policy, namespace_manifest, service_account_manifest
from tests.jobs.jobrules import validate_strict
from workloads.jobspec import parse_spec

ARNS = ["arn:aws:s3:::mlc-prod-datasets-1", "arn:aws:s3:::mlc-prod-checkpoints-1"]


def test_policy_reads_every_stack_bucket_and_writes_only_checkpoint_buckets() -> None:
    statements = {s["Sid"]: s for s in json.loads(job_access_policy(ARNS, {"mlc-prod-checkpoints-1"}))["Statement"]}
    assert statements["ReadStackObjects"]["Resource"] == sorted(f"{arn}/*" for arn in ARNS)
    assert statements["WriteCheckpoints"]["Resource"] == ["arn:aws:s3:::mlc-prod-checkpoints-1/*"]
    assert "s3:DeleteBucket" not in json.dumps(statements)
    read_only = json.loads(job_access_policy(ARNS, set()))["Statement"]
    assert [s["Sid"] for s in read_only] == ["ListStackBuckets", "ReadStackObjects"]


def test_checkpoints_to_a_foreign_bucket_are_a_clear_error() -> None:
    specs = [parse_spec({"name": "a", "image": "x:1", "checkpoint": {"uri": "s3://someone-elses/ckpt/"}})]
    assert checkpoint_buckets(specs) == {"someone-elses"}
    with pytest.raises(ValueError, match="someone-elses are not this stack's buckets"):
        job_access_policy(ARNS, checkpoint_buckets(specs))


def test_namespace_enforces_restricted_pod_security_and_manifests_are_valid() -> None:
    namespace = namespace_manifest("training", "dev", "ml-cluster.io")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    validate_strict(namespace)
    validate_strict(service_account_manifest("training", "training", "dev", "ml-cluster.io"))
