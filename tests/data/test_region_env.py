"""AWS_REGION is honoured wherever the project reads the configured region (boto3 alone reads only
AWS_DEFAULT_REGION and the profile): the S3 client of the data tools and the checkpoint mirror, preflight's
"credentials region" and new_stack's region, against a moto server."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from workloads.awsenv import configured_region
from workloads.data.moving.s3 import make_client

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def region_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))  # no profile region from ~/.aws/config
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return monkeypatch


def test_aws_region_alone_is_the_configured_region(region_env: pytest.MonkeyPatch) -> None:
    assert configured_region() is None
    region_env.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert configured_region() == "us-west-2"
    region_env.setenv("AWS_REGION", "eu-west-1")  # as the AWS CLI v2 and the other SDKs: AWS_REGION wins
    assert configured_region() == "eu-west-1"


def test_data_tools_s3_client_uses_aws_region(region_env: pytest.MonkeyPatch) -> None:
    assert make_client(None, 2).meta.region_name == "us-east-1"  # nothing configured: S3's default
    region_env.setenv("AWS_REGION", "eu-central-1")
    assert make_client(None, 2).meta.region_name == "eu-central-1"  # was us-east-1: AWS_REGION was ignored


def test_new_stack_takes_its_region_from_aws_region(region_env: pytest.MonkeyPatch, s3_url: str) -> None:
    """moto answers STS and EC2 here; before, only --region or AWS_DEFAULT_REGION were read."""
    region_env.delenv("AWS_DEFAULT_REGION", raising=False)
    region_env.setenv("AWS_REGION", "eu-west-1")
    region_env.setenv("AWS_ENDPOINT_URL", s3_url)
    spec = importlib.util.spec_from_file_location("new_stack_under_test", ROOT / "scripts" / "new_stack.py")
    assert spec is not None and spec.loader is not None
    new_stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(new_stack)
    account, region, zones = new_stack._from_aws(argparse.Namespace(account=None, region=None, zones=None))
    assert region == "eu-west-1"
    assert zones and all(zone.startswith("eu-west-1") for zone in zones)
