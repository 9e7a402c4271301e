"""verify_stack's AWS half against moto in server mode on 127.0.0.1 (real HTTP, real boto3 calls)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from infra.storage.verify import aws_checks
from scripts.verify_stack import main as verify_main
from tests.moto_server import moto_server
from tests.moto_server import reset as reset_moto

REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with moto_server() as url:
        yield url


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_SESSION_TOKEN", "testing"), ("AWS_DEFAULT_REGION", REGION)):
        monkeypatch.setenv(key, value)
    reset_moto(moto_url)

    def client(service: str) -> Any:
        return boto3.client(service, region_name=REGION, endpoint_url=moto_url)

    return client


def build_environment(client: Any) -> dict[str, Any]:
    """A VPC with two private subnets in us-east-1a and one in us-east-1b, EFS as the stack builds it, a bucket."""
    ec2, efs, s3 = client("ec2"), client("efs"), client("s3")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
               for i, zone in enumerate(["us-east-1a", "us-east-1a", "us-east-1b"], start=1)]
    node_sg = ec2.create_security_group(GroupName="nodes", Description="nodes", VpcId=vpc)["GroupId"]
    efs_sg = ec2.create_security_group(GroupName="efs", Description="efs", VpcId=vpc)["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=efs_sg, IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 2049, "ToPort": 2049, "UserIdGroupPairs": [{"GroupId": node_sg}]}])
    fs = efs.create_file_system(CreationToken="mlc-test", Encrypted=True, ThroughputMode="elastic")["FileSystemId"]
    targets = {zone: efs.create_mount_target(FileSystemId=fs, SubnetId=subnet, SecurityGroups=[efs_sg])
               for zone, subnet in (("us-east-1a", subnets[0]), ("us-east-1b", subnets[2]))}
    bucket = "mlc-test-datasets-123456789012"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_encryption(Bucket=bucket, ServerSideEncryptionConfiguration={
        "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]})
    s3.put_public_access_block(Bucket=bucket, PublicAccessBlockConfiguration={
        "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True, "RestrictPublicBuckets": True})
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [{
        "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}}}]}))
    outputs = {"platform": "eks", "region": REGION, "storage": {
        "efs": {"fileSystemId": fs, "securityGroupId": efs_sg, "nodeSecurityGroupId": node_sg, "subnetIds": subnets},
        "buckets": {"datasets": bucket}, "storageClasses": ["gp3", "efs-ap"]}}
    return {"outputs": outputs, "targets": targets, "subnets": subnets, "efs_sg": efs_sg, "bucket": bucket}


def statuses(checks: list) -> dict[str, str]:
    return {check.name: check.status for check in checks}


def test_correct_environment_passes_every_check(aws: Any) -> None:
    env = build_environment(aws)
    checks = aws_checks(env["outputs"], aws)
    assert statuses(checks) == {
        "efs mount target us-east-1a": "PASS", "efs mount target us-east-1b": "PASS",
        "efs sg admits 2049 from nodes": "PASS", "efs sg admits nothing else": "PASS",
        f"s3 {env['bucket']} encryption": "PASS", f"s3 {env['bucket']} public access block": "PASS",
        f"s3 {env['bucket']} tls-only policy": "PASS",
    }


def test_aws_rejects_a_second_mount_target_in_the_same_zone(aws: Any) -> None:
    env = build_environment(aws)
    fs = env["outputs"]["storage"]["efs"]["fileSystemId"]
    with pytest.raises(ClientError, match="MountTargetConflict"):
        aws("efs").create_mount_target(FileSystemId=fs, SubnetId=env["subnets"][1], SecurityGroups=[env["efs_sg"]])


def test_missing_mount_target_is_reported_naming_the_zone(aws: Any, moto_url: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    env = build_environment(aws)
    aws("efs").delete_mount_target(MountTargetId=env["targets"]["us-east-1b"]["MountTargetId"])
    [failed] = [check for check in aws_checks(env["outputs"], aws) if check.status == "FAIL"]
    assert failed.name == "efs mount target us-east-1b"
    assert "us-east-1b" in failed.detail
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(env["outputs"]))
    code = verify_main(["--outputs", str(outputs_file), "--endpoint-url", moto_url, "--skip-kubernetes"])
    out = capsys.readouterr()
    assert code == 1
    assert re.search(r"^efs mount target us-east-1b +FAIL +no available mount target .* in us-east-1b$", out.out, re.M)
    assert "1 of 7 checks failed" in out.err


def test_script_passes_on_a_correct_environment(aws: Any, moto_url: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    env = build_environment(aws)
    outputs_file = tmp_path / "outputs.json"
    outputs_file.write_text(json.dumps(env["outputs"]))
    code = verify_main(["--outputs", str(outputs_file), "--endpoint-url", moto_url, "--skip-kubernetes", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 0
    assert len(rows) == 7 and {row["status"] for row in rows} == {"PASS"}


def test_mount_target_in_the_wrong_security_group_fails(aws: Any) -> None:
    env = build_environment(aws)
    ec2, efs = aws("ec2"), aws("efs")
    vpc = ec2.describe_subnets(SubnetIds=[env["subnets"][0]])["Subnets"][0]["VpcId"]
    other = ec2.create_security_group(GroupName="other", Description="other", VpcId=vpc)["GroupId"]
    efs.modify_mount_target_security_groups(MountTargetId=env["targets"]["us-east-1a"]["MountTargetId"],
                                            SecurityGroups=[other])
    result = statuses(aws_checks(env["outputs"], aws))
    assert result["efs mount target us-east-1a"] == "FAIL"
    assert result["efs mount target us-east-1b"] == "PASS"


def test_nfs_open_to_a_cidr_fails(aws: Any) -> None:
    env = build_environment(aws)
    aws("ec2").authorize_security_group_ingress(GroupId=env["efs_sg"], IpPermissions=[{
        "IpProtocol": "tcp", "FromPort": 2049, "ToPort": 2049, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    checks = {check.name: check for check in aws_checks(env["outputs"], aws)}
    assert checks["efs sg admits 2049 from nodes"].status == "PASS"
    assert checks["efs sg admits nothing else"].status == "FAIL"
    assert "0.0.0.0/0" in checks["efs sg admits nothing else"].detail


def test_unprotected_bucket_fails_each_bucket_check(aws: Any) -> None:
    env = build_environment(aws)
    s3 = aws("s3")
    bucket = "mlc-test-plain"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": "arn:aws:iam::123456789012:root"}, "Action": "s3:GetObject",
        "Resource": f"arn:aws:s3:::{bucket}/*"}]}))
    env["outputs"]["storage"]["buckets"] = {"plain": bucket}
    result = statuses(aws_checks(env["outputs"], aws))
    assert result[f"s3 {bucket} public access block"] == "FAIL"
    assert result[f"s3 {bucket} tls-only policy"] == "FAIL"
