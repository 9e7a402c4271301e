"""`make new-stack FROM_CLUSTER=describe.json`: a stack file on an existing EKS cluster from `aws eks describe-cluster`
output (region, account, VPC, subnets, version from the answer) that plans offline; a hostile file is one line and
nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.placeholders import placeholder_problems
from infra.plan.engine import FIXTURES_DIR, Fixtures, plan_stack
from scripts.new_stack import main as new_stack

ACCOUNT = "210987654321"
SUBNETS = {"subnet-07c4e2a91b3d5f608": "eu-west-1a", "subnet-0e93b1d7a4c2f6051": "eu-west-1b",
           "subnet-05f1a8c3e7b9d2046": "eu-west-1c"}
DESCRIBED = {"cluster": {
    "name": "research", "arn": f"arn:aws:eks:eu-west-1:{ACCOUNT}:cluster/research", "createdAt": 1772442867.0,
    "version": "1.35", "endpoint": "https://5E1A7C93B2D4F6081A3C5E7092B4D6F8.gr7.eu-west-1.eks.amazonaws.com",
    "roleArn": f"arn:aws:iam::{ACCOUNT}:role/research-cluster", "status": "ACTIVE", "platformVersion": "eks.12",
    "resourcesVpcConfig": {"subnetIds": list(SUBNETS), "securityGroupIds": [],
                           "clusterSecurityGroupId": "sg-0b7d3f1a9c5e2d468", "vpcId": "vpc-04e8a2c6f1b9d3075",
                           "endpointPublicAccess": True, "endpointPrivateAccess": True,
                           "publicAccessCidrs": ["0.0.0.0/0"]},
    "certificateAuthority": {"data": "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg=="},
    "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"}, "tags": {}}}


def _fixtures(tmp_path: Path) -> Fixtures:
    """The repo's fixtures plus this cluster (as aws.eks.getCluster answers it) and its subnets."""
    fixtures = tmp_path / "fixtures"
    shutil.copytree(FIXTURES_DIR, fixtures)
    cluster = DESCRIBED["cluster"]
    vpc = cluster["resourcesVpcConfig"]
    entry = {"name": cluster["name"], "arn": cluster["arn"], "version": cluster["version"], "status": "ACTIVE",
             "endpoint": cluster["endpoint"], "certificateAuthorities": [cluster["certificateAuthority"]],
             "vpcConfig": vpc, "accessConfigs": [cluster["accessConfig"]]}
    table = json.loads((fixtures / "clusters.json").read_text())
    table["research"] = entry
    (fixtures / "clusters.json").write_text(json.dumps(table))
    subnets = json.loads((fixtures / "subnets.json").read_text())
    for subnet, zone in SUBNETS.items():
        subnets[subnet] = {"id": subnet, "vpcId": vpc["vpcId"], "availabilityZone": zone,
                           "mapPublicIpOnLaunch": False}
    (fixtures / "subnets.json").write_text(json.dumps(subnets))
    return Fixtures(fixtures)


def _written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    answer = tmp_path / "research.json"
    answer.write_text(json.dumps(DESCRIBED, indent=4))  # as `aws eks describe-cluster --name research` prints it
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    assert new_stack(["--stack", "team", "--from-cluster", str(answer), "--stacks-dir", str(stacks),
                      "--researcher-role-arn", f"arn:aws:iam::{ACCOUNT}:role/ml-researchers"]) == 0, \
        capsys.readouterr().err
    return stacks / "Pulumi.team.yaml"


def test_a_stack_file_from_describe_cluster_names_its_vpc_subnets_version_and_region(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _written(tmp_path, capsys)
    values = yaml.safe_load(path.read_text())["config"]
    assert values["aws:region"] == "eu-west-1" and values["ml-cluster:accountId"] == ACCOUNT
    assert values["ml-cluster:network"] == {"existing": {"vpcId": "vpc-04e8a2c6f1b9d3075",
                                                         "privateSubnetIds": list(SUBNETS), "publicSubnetIds": []}}
    assert values["ml-cluster:cluster"]["existing"] is True and values["ml-cluster:cluster"]["kubernetesVersion"] == \
        "1.35"
    assert "sg-0b7d3f1a9c5e2d468" in path.read_text()  # the cluster's own group, named for the reader
    assert placeholder_problems(values, deploying=True) == []


@pytest.mark.slow  # a whole offline plan (~6 s here); the file's content is checked in the fast suite above
def test_a_stack_file_from_describe_cluster_plans_offline_on_that_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _written(tmp_path, capsys)
    plan = plan_stack("team", path, _fixtures(tmp_path))
    types = {r["type"] for r in plan["resources"]}
    assert "aws:eks/cluster:Cluster" not in types and "aws:ec2/vpc:Vpc" not in types
    assert {r["inputs"]["clusterName"] for r in plan["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup"} == \
        {"research"}


def _broken(cluster: dict[str, Any]) -> dict[str, Any]:
    return {"cluster": cluster}


@pytest.mark.parametrize(("content", "why"), [
    (b"", "not JSON"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b"[1, 2]", "not the output of aws eks describe-cluster"),
    (json.dumps({"clusters": ["research"]}).encode(), "not the output of aws eks describe-cluster"),
    (json.dumps(_broken({**DESCRIBED["cluster"], "version": None})).encode(),
     "cluster research: version: null, not a string"),
    (json.dumps(_broken({**DESCRIBED["cluster"], "resourcesVpcConfig": "vpc-04e8a2c6f1b9d3075"})).encode(),
     "cluster research: resourcesVpcConfig: \"vpc-04e8a2c6f1b9d3075\" is a string, not an object"),
    (json.dumps(_broken({**DESCRIBED["cluster"], "status": "CREATING"})).encode(),
     "cluster research is CREATING, not ACTIVE"),
    (json.dumps(_broken({**DESCRIBED["cluster"], "accessConfig": {"authenticationMode": "CONFIG_MAP"}})).encode(),
     "authenticates with CONFIG_MAP only"),
    (b"[" * 100000 + b"]" * 100000, "not JSON"),
])
def test_a_hostile_describe_file_is_one_line_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, why: str) -> None:
    answer = tmp_path / "research.json"
    answer.write_bytes(content)
    assert new_stack(["--stack", "team", "--from-cluster", str(answer), "--stacks-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and why in err[0], err
    assert str(answer) in err[0] and not (tmp_path / "Pulumi.team.yaml").exists()


def test_a_missing_or_directory_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for where in (tmp_path / "nowhere.json", tmp_path):
        assert new_stack(["--stack", "team", "--from-cluster", str(where), "--stacks-dir", str(tmp_path)]) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"error: {where}: cannot read: ")
