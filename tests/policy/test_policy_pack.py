"""The CrossGuard pack itself, run in its own virtualenv (pulumi-policy pins protobuf 5 / grpcio 1.71).

Skipped where that virtualenv has not been created; .ci/run creates it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from infra.policy.rules import POLICIES

ROOT = Path(__file__).resolve().parents[2]
PACK_PYTHON = ROOT / "infra/policy/pack/venv/bin/python"
DRIVER = ROOT / "tests/policy/pack_driver.py"

pytestmark = pytest.mark.skipif(
    not PACK_PYTHON.exists(),
    reason="policy pack virtualenv absent: python3 -m venv infra/policy/pack/venv && "
    "infra/policy/pack/venv/bin/pip install -r infra/policy/pack/requirements.txt",
)


def drive(*args: str) -> dict[str, Any]:
    result = subprocess.run([str(PACK_PYTHON), str(DRIVER), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_pack_adapts_every_rule_and_reports_violations_with_urns() -> None:
    out = drive()
    assert out["policies"] == sorted(rule.name for rule in POLICIES)
    reports = out["reports"]
    assert [at for _, at in reports["job-gpu-shm"]] == ["urn:pulumi:test::ml-cluster::kubernetes:batch/v1:Job::train"]
    assert [at for _, at in reports["gpu-node-group-tainted"]] == [
        "urn:pulumi:test::ml-cluster::aws:eks/nodeGroup:NodeGroup::gpu"
    ]
    # The pack config's `protected: true` reaches the rules that read it.
    assert len(reports["prod-training-pools-spot"]) == 1
    # Stack-level: the bucket is joined to its SSE config and TLS policy through property dependencies (its
    # id is unknown, as in a real preview), so only the missing public access block is reported, on the bucket.
    assert reports["s3-bucket-public-access-blocked"] == [
        ["has no aws.s3.BucketPublicAccessBlock", "urn:pulumi:test::ml-cluster::aws:s3/bucket:Bucket::data"]
    ]
    assert reports["s3-bucket-encrypted"] == [] and reports["s3-bucket-tls-only"] == []
    quiet = set(reports) - {
        "job-gpu-shm",
        "gpu-node-group-tainted",
        "prod-training-pools-spot",
        "s3-bucket-public-access-blocked",
    }
    assert all(reports[name] == [] for name in quiet)


def test_served_pack_analyzes_over_grpc_like_the_engine() -> None:
    out = drive("--served")
    assert out["name"] == "ml-cluster"
    assert out["policies"] == {
        rule.name: "MANDATORY" if rule.enforcement == "mandatory" else "ADVISORY" for rule in POLICIES
    }
    assert [(policy, level) for policy, level, _ in out["diagnostics"]] == [("job-not-privileged", "MANDATORY")]
    assert "container train is privileged" in out["diagnostics"][0][2]
