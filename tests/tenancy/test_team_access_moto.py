"""The rendered team policies against moto with IAM enforced: assume each team's role and make real S3 calls.

moto evaluates identity policies (actions, resource ARNs with wildcards) once INITIAL_NO_AUTH_ACTION_COUNT requests
have been served; the setup runs before that (its /moto-api/reset-auth turns enforcement on after it). It ignores
condition operators other than StringEquals, so the s3:prefix condition on ListBucket is not enforced there:
listing is reported, but only object reads and writes carry the proof.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from infra.config.queueing import KueueConfig
from infra.iam import pod_identity_trust_policy
from infra.tenancy import team_access_policy
from tests.moto_server import agent_credentials, agent_trust, free_port
from tests.tenancy.teams import TEAMS

BUCKETS = {"datasets": "prod-datasets-123456789012", "checkpoints": "prod-checkpoints-123456789012"}
REGION = "us-east-1"
ADMIN = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@pytest.fixture(scope="module")
def moto_iam() -> Iterator[str]:
    """A moto server process of its own (enforcement is a process-wide setting), stopped by its PID."""
    port = free_port()
    env = {**os.environ, "MOTO_IAM_LOAD_MANAGED_POLICIES": "false"}
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


def _client(service: str, url: str, **credentials: Any) -> Any:
    return boto3.client(service, endpoint_url=url, region_name=REGION, config=Config(retries={"max_attempts": 1}),
                        **(credentials or ADMIN))


def _attempt(call: Any) -> str:
    try:
        call()
        return "allow"
    except ClientError as error:
        code = error.response["Error"]["Code"]
        assert code in ("AccessDenied", "403"), error
        return "deny"


def measure(url: str) -> list[tuple[str, str, str, str]]:
    """(team, resource, action, allow|deny) for each team role against every team's prefixes."""
    kueue = KueueConfig.model_validate({"enabled": True, "teams": TEAMS})
    iam, s3 = _client("iam", url), _client("s3", url)
    for bucket in BUCKETS.values():
        s3.create_bucket(Bucket=bucket)
    for team in kueue.teams:
        for data in team.data:
            s3.put_object(Bucket=BUCKETS[data.bucket], Key=f"{data.prefix}seed", Body=b"x")
    # The caller standing in for the Pod Identity agent (moto cannot act as pods.eks.amazonaws.com, so the test roles
    # trust this user instead of the service; the permission policies are the rendered ones, unchanged).
    assert json.loads(pod_identity_trust_policy())["Statement"][0]["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    trust = agent_trust(iam)
    roles = {}
    for team in kueue.teams:
        role = iam.create_role(RoleName=f"team-{team.name}", AssumeRolePolicyDocument=trust)
        iam.put_role_policy(RoleName=f"team-{team.name}", PolicyName="bucket-access",
                            PolicyDocument=team_access_policy(team, BUCKETS))
        roles[team.name] = role["Role"]["Arn"]
    agent = agent_credentials(iam, url, roles.values())  # the agent may assume these roles and nothing else

    # Enforcement on: the agent itself may not touch S3.
    assert _attempt(lambda: _client("s3", url, **agent).get_object(
        Bucket=BUCKETS["datasets"], Key="vision/seed")) == "deny"
    matrix = []
    for team in kueue.teams:
        creds = _client("sts", url, **agent).assume_role(RoleArn=roles[team.name],
                                                         RoleSessionName=f"{team.name}-job")["Credentials"]
        as_team = _client("s3", url, aws_access_key_id=creds["AccessKeyId"],
                          aws_secret_access_key=creds["SecretAccessKey"], aws_session_token=creds["SessionToken"])
        for owner in kueue.teams:
            for kind, entries in (("datasets", owner.datasets), ("checkpoints", owner.checkpoints)):
                for data in entries:
                    bucket, prefix = BUCKETS[data.bucket], data.prefix
                    resource = f"s3://{data.bucket}/{prefix}"
                    actions: dict[str, Any] = {
                        "GetObject": lambda b=bucket, p=prefix, c=as_team: c.get_object(Bucket=b, Key=f"{p}seed"),
                        "PutObject": lambda b=bucket, p=prefix, t=team.name, c=as_team: c.put_object(
                            Bucket=b, Key=f"{p}from-{t}", Body=b"y"),
                        "DeleteObject": lambda b=bucket, p=prefix, c=as_team: c.delete_object(
                            Bucket=b, Key=f"{p}seed2"),
                    }
                    for action, call in actions.items():
                        matrix.append((team.name, f"{resource} ({owner.name} {kind})", action, _attempt(call)))
        matrix.append((team.name, "any bucket", "ListBuckets", _attempt(as_team.list_buckets)))
        matrix.append((team.name, "s3://datasets/shared/ (no team's)", "PutObject", _attempt(
            lambda c=as_team: c.put_object(Bucket=BUCKETS["datasets"], Key="shared/x", Body=b"z"))))
    return matrix


def test_each_team_role_reaches_only_its_own_prefixes(moto_iam: str) -> None:
    matrix = measure(moto_iam)
    print(f"\n{'team':9} {'resource':52} {'action':13} result")
    for team, resource, action, result in matrix:
        print(f"{team:9} {resource:52} {action:13} {result}")
    expected = []
    for team, resource, action, _ in matrix:
        own = f"({team} " in resource
        if action == "GetObject":
            allowed = own
        elif action in ("PutObject", "DeleteObject"):
            allowed = own and "checkpoints" in resource
        else:
            allowed = False
        expected.append((team, resource, action, "allow" if allowed else "deny"))
    assert matrix == expected
