"""Pure builders of infra/jobs.py: the Jobs' IAM policy and namespace."""

from __future__ import annotations

import json

from infra.jobs import job_access_policy, namespace_manifest, service_account_manifest
from tests.jobs.jobrules import validate_strict

ARNS = ["arn:aws:s3:::mlc-prod-datasets-1", "arn:aws:s3:::mlc-prod-checkpoints-1"]


def test_policy_reads_what_jobs_read_and_writes_only_checkpoint_buckets() -> None:
    statements = {s["Sid"]: s for s in json.loads(job_access_policy(ARNS[:1], ARNS[1:]))["Statement"]}
    assert statements["ReadStackObjects"]["Resource"] == sorted(f"{arn}/*" for arn in ARNS)
    assert statements["WriteCheckpoints"]["Resource"] == ["arn:aws:s3:::mlc-prod-checkpoints-1/*"]
    assert "s3:DeleteBucket" not in json.dumps(statements)
    read_only = json.loads(job_access_policy(ARNS[:1], []))["Statement"]
    assert [s["Sid"] for s in read_only] == ["ListStackBuckets", "ReadStackObjects"]
    assert read_only[1]["Resource"] == ["arn:aws:s3:::mlc-prod-datasets-1/*"]
# A foreign checkpoint bucket is a config error found before any resource: tests/infra/test_stack_checks.py.


def test_namespace_enforces_restricted_pod_security_and_manifests_are_valid() -> None:
    namespace = namespace_manifest("training", "dev", "ml-cluster.io")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    validate_strict(namespace)
    validate_strict(service_account_manifest("training", "training", "dev", "ml-cluster.io"))
