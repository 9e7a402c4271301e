"""The packs' own role against moto with IAM enforced: the real `pack` slices and publish run as the role.

The packer role (infra/packing.py) writes a dataset into the packInto bucket; the same packs into a bucket not
marked packInto, or as the training Jobs' role (which never writes datasets), are refused by IAM: one error line.
moto enforces identity policies once its setup requests are served (see tests/tenancy/test_team_access_moto.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.jobs import job_access_policy
from infra.packing import pack_access_policy
from tests.data.helpers import write_corpus
from tests.data.test_pack_s3 import put_tree
from tests.moto_server import agent_credentials, agent_trust
from tests.tenancy.test_team_access_moto import _client, moto_iam  # noqa: F401 (the fixture)
from workloads.data.format.manifest import MANIFEST_NAME

REPO = Path(__file__).resolve().parents[2]
DATASETS, CHECKPOINTS = "dev-datasets-123456789012", "dev-checkpoints-123456789012"
OPTIONS = ["--size", "16", "--shard-size", "2500B", "--workers", "1", "--no-progress"]


def _arn(bucket: str) -> str:
    return f"arn:aws:s3:::{bucket}"


def _with_moto_head_bucket(policy: str) -> str:
    """moto authorizes HeadBucket as the action s3:HeadBucket, which AWS does not have: AWS authorizes it as
    s3:ListBucket (S3 API reference, HeadBucket), which the rendered policies grant on the same buckets. Both roles
    get the stand-in alike, so what differs between them is the rendered policy alone."""
    document = json.loads(policy)
    listed = next(s["Resource"] for s in document["Statement"] if "s3:ListBucket" in s["Action"])
    document["Statement"].append({"Sid": "MotoHeadBucket", "Effect": "Allow", "Action": ["s3:HeadBucket"],
                                  "Resource": listed})
    return json.dumps(document)


def _roles(url: str, tmp_path: Path) -> dict[str, dict[str, str]]:
    """Buckets with a source tree, the packer and jobs roles as rendered, and credentials of each (enforcement on)."""
    iam, s3 = _client("iam", url), _client("s3", url)
    for bucket in (DATASETS, CHECKPOINTS):
        s3.create_bucket(Bucket=bucket)
    write_corpus(tmp_path / "src", per_class=4)
    put_tree(url, DATASETS, "raw", tmp_path / "src")
    trust = agent_trust(iam)
    policies = {"packer": pack_access_policy([_arn(DATASETS), _arn(CHECKPOINTS)], [_arn(DATASETS)]),
                "jobs": job_access_policy([_arn(DATASETS), _arn(CHECKPOINTS)], [_arn(CHECKPOINTS)])}
    arns = {}
    for name, policy in policies.items():
        arns[name] = iam.create_role(RoleName=name, AssumeRolePolicyDocument=trust)["Role"]["Arn"]
        iam.put_role_policy(RoleName=name, PolicyName="bucket-access", PolicyDocument=_with_moto_head_bucket(policy))
    agent = agent_credentials(iam, url, arns.values())  # the agent may assume these roles and nothing else
    credentials = {}
    for name, arn in arns.items():
        creds = _client("sts", url, **agent).assume_role(RoleArn=arn, RoleSessionName=name)["Credentials"]
        credentials[name] = {"AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
                             "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
                             "AWS_SESSION_TOKEN": creds["SessionToken"]}
    return credentials


def _pack(url: str, credentials: dict[str, str], args: list[str], index: int | None = None) -> Any:
    env = {key: value for key, value in os.environ.items() if not key.startswith("AWS_")}
    env.update({"PYTHONPATH": str(REPO), "AWS_REGION": "us-east-1", **credentials})
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = str(index)
    return subprocess.run([sys.executable, "-m", "workloads.data", "pack", *args, *OPTIONS, "--endpoint-url", url],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_only_the_packer_role_writes_a_dataset_and_only_into_packinto_buckets(
        moto_iam: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)  # the setup's own calls (before enforcement)
    credentials = _roles(moto_iam, tmp_path)
    packer = {"aws_" + key[4:].lower(): value for key, value in credentials["packer"].items()}
    as_packer = _client("s3", moto_iam, **packer)
    source, dest = f"s3://{DATASETS}/raw", f"s3://{DATASETS}/packed"
    for index in (0, 1):
        done = _pack(moto_iam, credentials["packer"], [source, dest, "--shard-count", "2"], index)
        assert done.returncode == 0, done.stderr
    published = _pack(moto_iam, credentials["packer"], [source, dest, "--publish"])
    assert published.returncode == 0 and published.stdout.startswith("published 8 samples"), published.stderr
    keys = [o["Key"] for o in as_packer.list_objects_v2(Bucket=DATASETS, Prefix="packed/")["Contents"]]
    assert f"packed/{MANIFEST_NAME}" in keys

    # the packer into a bucket not marked packInto, and the training Jobs' role into the datasets bucket: refused
    for role, target in (("packer", f"s3://{CHECKPOINTS}/packed"), ("jobs", f"s3://{DATASETS}/by-jobs")):
        refused = _pack(moto_iam, credentials[role], [source, target, "--shard-count", "1"], 0)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), (role, refused.stderr)
        assert "AccessDenied" in lines[0] or "denied" in lines[0].lower(), lines
    assert as_packer.list_objects_v2(Bucket=CHECKPOINTS).get("KeyCount", 0) == 0
