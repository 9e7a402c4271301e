"""Preflight against moto in server mode (STS, EC2 regions/zones/subnets/offerings/instance types, S3 HeadBucket,
ECR) and, for what moto does not serve (Service Quotas values, EKS cluster versions, an S3 bucket owned by someone
else), a stub speaking the real AWS protocols. boto3 is unmodified: endpoints come from AWS_ENDPOINT_URL[_SERVICE]."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from infra.account.preflight import (
    FAIL,
    PASS,
    WARN,
    Check,
    check_buckets,
    check_identity,
    check_kubernetes_version,
    check_offerings,
    check_quotas,
    check_region,
    check_registry,
    quota_family,
    stack_zones,
)
from infra.config.schema import StackConfig, decode_config_value, parse_stack_config
from infra.plan.engine import STACKS_DIR
from scripts import preflight as preflight_cli
from tests.awsstub import AwsStub
from tests.moto_server import moto_server
from tests.moto_server import reset as reset_moto

MOTO_ACCOUNT = "123456789012"  # moto's default account
QUOTA_TARGET = "ServiceQuotasV20190624.GetServiceQuota"
DEFAULT_QUOTA_TARGET = "ServiceQuotasV20190624.GetAWSDefaultServiceQuota"


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")  # preflight reads no AMIs; loading them costs seconds
        with moto_server() as url:
            yield url


@pytest.fixture(scope="module")
def stub_server() -> Iterator[AwsStub]:
    server = AwsStub().start()
    yield server
    server.stop()


def quota_handler(values: dict[str, float], defaults: dict[str, float] | None = None) -> Any:
    def handle(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        code = body["QuotaCode"]
        table = values if defaults is None else defaults
        if body["ServiceCode"] != "ec2" or code not in table:
            return 400, {"__type": "NoSuchResourceException", "message": f"The quota {code} does not exist"}
        return 200, {"Quota": {"ServiceCode": "ec2", "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)",
                               "QuotaArn": f"arn:aws:servicequotas:us-west-2:{MOTO_ACCOUNT}:ec2/{code}",
                               "QuotaCode": code, "QuotaName": code, "Value": table[code], "Unit": "None",
                               "Adjustable": True, "GlobalQuota": False}}
    return handle


def versions_handler(statuses: dict[str, str]) -> Any:
    def handle(query: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        assert query.get("clusterType") == "eks" and query.get("includeAll") == "true"
        return 200, {"clusterVersions": [{"clusterVersion": v, "clusterType": "eks", "versionStatus": s,
                                          "status": s.lower().replace("_", "-")} for v, s in statuses.items()]}
    return handle


GOOD_QUOTAS = {"L-1216C47A": 64.0, "L-34B43A08": 64.0, "L-DB2E81BA": 64.0, "L-3819A6DF": 64.0,
               "L-417A185B": 384.0, "L-7212CCBC": 384.0}
VERSIONS = {"1.31": "EXTENDED_SUPPORT", "1.32": "STANDARD_SUPPORT", "1.33": "STANDARD_SUPPORT",
            "1.34": "STANDARD_SUPPORT", "1.35": "STANDARD_SUPPORT"}


@pytest.fixture
def world(moto_url: str, stub_server: AwsStub, monkeypatch: pytest.MonkeyPatch) -> AwsStub:
    """Clean moto state, a stub answering good quotas and versions, credentials and endpoints in the environment."""
    reset_moto(moto_url)
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-west-2"), ("AWS_ENDPOINT_URL", moto_url),
                       ("AWS_ENDPOINT_URL_SERVICE_QUOTAS", stub_server.url),
                       ("AWS_ENDPOINT_URL_EKS", stub_server.url)):
        monkeypatch.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    stub_server.requests.clear()
    stub_server.heads.clear()
    stub_server.targets.clear()
    stub_server.targets[QUOTA_TARGET] = quota_handler(GOOD_QUOTAS)
    stub_server.routes[("GET", "/cluster-versions")] = versions_handler(VERSIONS)
    return stub_server


def client(service: str, region: str = "us-west-2") -> Any:
    return boto3.client(service, region_name=region)


def config(stack: str = "dev", edit: Callable[[dict[str, Any]], None] | None = None) -> StackConfig:
    values = yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())["config"]
    if edit is not None:
        edit(values)
    return parse_stack_config({k: decode_config_value(v) for k, v in values.items()})


def stack_file(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    document = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    edit(document["config"])
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def own_account(values: dict[str, Any]) -> None:
    for entry in values["ml-cluster:cluster"]["accessEntries"]:
        entry["principalArn"] = entry["principalArn"].replace("111122223333", MOTO_ACCOUNT)


def statuses(checks: list[Check]) -> dict[str, str]:
    return {check.name: check.status for check in checks}


def test_quota_families() -> None:
    types = ("p5.48xlarge", "p5en.48xlarge", "p4d.24xlarge", "p3dn.24xlarge", "p6-b200.48xlarge", "g6e.12xlarge",
             "vt1.3xlarge", "m6i.large", "c7gn.xlarge", "inf2.xlarge", "trn1.32xlarge", "dl1.24xlarge")
    assert [quota_family(t) for t in types] == \
        ["P", "P", "P", "P", "P", "G", "G", "Standard", "Standard", None, None, None]
    # Spot: P5-class instances count against their own quota, the older P families against theirs
    assert [quota_family(t, "SPOT") for t in types] == \
        ["P5", "P5", "P", "P", None, "G", "G", "Standard", "Standard", None, None, None]


def test_p5_spot_is_checked_against_its_own_quota_and_p4d_spot_against_the_older_p_quota(world: AwsStub) -> None:
    def spot_p5(values: dict[str, Any]) -> None:
        values["ml-cluster:nodePools"].append({"name": "gpu-h100-spot", "instanceTypes": ["p5.48xlarge"],
                                               "capacityType": "SPOT", "maxSize": 2})

    world.targets[QUOTA_TARGET] = quota_handler({**GOOD_QUOTAS, "L-C4BD4855": 192.0})
    checks = {c.name: c for c in check_quotas(client("ec2", "us-east-1"), client("service-quotas", "us-east-1"),
                                              config("prod", spot_p5), "us-east-1")}
    p5_spot, older_p_spot = checks["quota L-C4BD4855"], checks["quota L-7212CCBC"]
    assert p5_spot.status == FAIL and p5_spot.detail.startswith("All P5 Spot Instance Requests: 192 vCPUs")
    assert "pools at max need 384 (gpu-h100-spot 2 x 192)" in p5_spot.detail
    assert "--quota-code L-C4BD4855 --desired-value 384" in p5_spot.fix
    assert older_p_spot.detail.startswith("All P4, P3 and P2 Spot Instance Requests: 384 vCPUs")
    assert "(gpu-a100 8 x 96)" in older_p_spot.detail and "gpu-h100-spot" not in older_p_spot.detail


def test_a_ready_account_passes_and_exits_0(world: AwsStub, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    client("ecr").create_repository(repositoryName="mlc-dev-train",
                                    tags=[{"Key": "project", "Value": "ml-cluster"}, {"Key": "stack", "Value": "dev"}])
    client("s3").create_bucket(Bucket=f"mlc-dev-datasets-{MOTO_ACCOUNT}",
                               CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    assert preflight_cli.main(["--stack", "dev", "--config", str(stack_file(tmp_path, own_account)),
                               "--account", MOTO_ACCOUNT]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("preflight of stack dev (us-west-2)")
    flat = re.sub(r" +", " ", out)
    for expected in (f"PASS credentials account {MOTO_ACCOUNT}", "PASS region us-west-2 is enabled",
                     "PASS availability zones us-west-2a, us-west-2b, us-west-2c",
                     "PASS offering gpu-a10g g5.xlarge offered in", "PASS quota L-1216C47A", "PASS quota L-3819A6DF",
                     "PASS kubernetes 1.35", f"PASS bucket mlc-dev-datasets-{MOTO_ACCOUNT} exists",
                     f"PASS bucket mlc-dev-checkpoints-{MOTO_ACCOUNT} free",
                     "PASS repository mlc-dev-train exists, tagged as this stack's"):
        assert expected in flat, expected
    assert "0 FAIL, 0 WARN, 11 PASS" in out
    # system 3 x m6i.large (2 vCPUs) on-demand; gpu-a10g 2 x g5.xlarge (4 vCPUs) Spot
    assert "pools at max need 6 (system 3 x 2)" in out and "pools at max need 8 (gpu-a10g 2 x 4)" in out
    asked = [body["QuotaCode"] for target, body in world.requests if target == QUOTA_TARGET]
    assert sorted(asked) == ["L-1216C47A", "L-3819A6DF"]


def test_every_failure_is_a_row_with_its_fix_and_exit_2(world: AwsStub, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Quota too small, Kubernetes version not offered, bucket taken, repository someone else's, instance type not
    offered in a pool's zone, the wrong account: one FAIL row each, one error line each."""
    world.targets[QUOTA_TARGET] = quota_handler({**GOOD_QUOTAS, "L-3819A6DF": 4.0})
    world.routes[("GET", "/cluster-versions")] = versions_handler({"1.34": "STANDARD_SUPPORT"})
    world.heads[f"/mlc-dev-datasets-{MOTO_ACCOUNT}"] = 403
    client("ecr").create_repository(repositoryName="mlc-dev-train")

    def edit(values: dict[str, Any]) -> None:
        own_account(values)
        values["ml-cluster:network"]["create"]["availabilityZones"] = ["us-west-2a", "us-west-2b", "us-west-2d"]

    path = stack_file(tmp_path, edit)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ENDPOINT_URL_S3", world.url)  # HeadBucket 403: a bucket of another account
        assert preflight_cli.main(["--stack", "dev", "--config", str(path), "--account", "210987654321"]) == 2
    out, err = capsys.readouterr()
    errors = err.splitlines()
    assert all(line.startswith("error: ") for line in errors)
    assert f"error: account: credentials are for account {MOTO_ACCOUNT}, expected 210987654321" in err
    assert ("error: offering gpu-a10g g5.xlarge: not offered in us-west-2d; fix: set "
            "ml-cluster:nodePools[1].availabilityZones: [us-west-2a, us-west-2b]") in errors
    assert ("fix: aws service-quotas request-service-quota-increase --region us-west-2 --service-code ec2 "
            "--quota-code L-3819A6DF --desired-value 8") in err
    assert ("error: kubernetes 1.35: not offered by EKS; fix: set ml-cluster:cluster.kubernetesVersion to one of "
            "1.34") in errors
    assert (f"error: bucket mlc-dev-datasets-{MOTO_ACCOUNT}: taken: it exists and belongs to someone else "
            "(HeadBucket 403); fix: name the bucket yourself: ml-cluster:storage.buckets[0].bucketName") in errors
    assert "error: repository mlc-dev-train: exists and is not this stack's" in err
    assert len(errors) == 6
    assert "6 FAIL, 0 WARN" in out
    assert out.count("fix: ") == 6  # the table carries each fix too


def test_no_credentials_is_one_fail(world: AwsStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert preflight_cli.main(["--stack", "dev"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: credentials: sts:GetCallerIdentity failed: NoCredentialsError")
    assert "1 FAIL, 0 WARN, 0 PASS" in out


def test_identity_account_and_access_entries(world: AwsStub) -> None:
    sts = client("sts")
    checks, account = check_identity(sts, config("dev"), None)
    assert account == MOTO_ACCOUNT
    assert statuses(checks) == {"credentials": PASS, "access entries": WARN}  # the stack file's example account
    assert "111122223333" in checks[1].detail
    checks, _ = check_identity(sts, config("dev", own_account), MOTO_ACCOUNT)
    assert statuses(checks) == {"credentials": PASS}
    checks, _ = check_identity(sts, config("dev", own_account), "210987654321")
    assert statuses(checks) == {"credentials": PASS, "account": FAIL}


def test_region_zone_and_subnet_checks(world: AwsStub) -> None:
    ec2 = client("ec2")
    assert statuses(check_region(ec2, "us-west-2", "us-west-2")) == {"region": PASS}
    result = check_region(ec2, "xx-nowhere-1", "eu-west-1")
    assert statuses(result) == {"region": FAIL, "credentials region": WARN}
    assert "aws account enable-region --region-name xx-nowhere-1" in result[0].fix

    def zones(values: dict[str, Any]) -> None:
        values["ml-cluster:network"]["create"]["availabilityZones"] = ["us-west-2a", "us-west-2q"]

    [check], _ = stack_zones(ec2, config("dev", zones))
    assert (check.status, check.detail) == (FAIL, "us-west-2q not in the region")
    # an adopted VPC: the zones are those of its subnets; a subnet that does not exist is a FAIL
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnets = [ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.0.{i}.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
               for i, zone in enumerate(["us-west-2a", "us-west-2a", "us-west-2c"])]

    def adopt(ids: list[str]) -> Callable[[dict[str, Any]], None]:
        def edit(values: dict[str, Any]) -> None:
            values["ml-cluster:network"] = {"existing": {"vpcId": "vpc-0123456789abcdef0", "privateSubnetIds": ids}}
        return edit

    checks, found = stack_zones(ec2, config("dev", adopt(subnets)))
    assert found == ["us-west-2a", "us-west-2c"] and checks[0].status == PASS
    checks, found = stack_zones(ec2, config("dev", adopt(["subnet-0000000000000dead"])))
    assert checks[0].status == FAIL and "InvalidSubnetID.NotFound" in checks[0].detail and found == []


def test_offerings_per_pool_zone(world: AwsStub) -> None:
    def pools(values: dict[str, Any]) -> None:
        values["ml-cluster:nodePools"][1]["availabilityZones"] = ["us-west-2d"]

    checks = check_offerings(client("ec2"), config("dev", pools), ["us-west-2a", "us-west-2b", "us-west-2d"])
    assert statuses(checks) == {"offering system m6i.large": PASS, "offering gpu-a10g g5.xlarge": FAIL}
    assert checks[1].detail == "not offered in any of us-west-2d"
    assert statuses(check_offerings(client("ec2"), config("dev"), [])) == {"instance offerings": WARN}


def test_quota_default_fallback_unreadable_and_other_families(world: AwsStub) -> None:
    # No applied value: the AWS default is used (GetAWSDefaultServiceQuota)
    world.targets[QUOTA_TARGET] = quota_handler({})
    world.targets[DEFAULT_QUOTA_TARGET] = quota_handler({}, defaults={"L-1216C47A": 5.0, "L-3819A6DF": 0.0})
    checks = check_quotas(client("ec2"), client("service-quotas"), config("dev"), "us-west-2")
    assert statuses(checks) == {"quota L-1216C47A": FAIL, "quota L-3819A6DF": FAIL}
    by_name = {check.name: check for check in checks}
    assert "5 vCPUs (AWS default), pools at max need 6" in by_name["quota L-1216C47A"].detail
    assert "0 vCPUs (AWS default), pools at max need 8" in by_name["quota L-3819A6DF"].detail
    # Unreadable quota: a WARN that says what the pools need; an unchecked family: a WARN
    world.targets.pop(DEFAULT_QUOTA_TARGET)

    def inf(values: dict[str, Any]) -> None:
        values["ml-cluster:nodePools"].append({"name": "infer", "instanceTypes": ["inf2.xlarge"], "maxSize": 1})

    checks = check_quotas(client("ec2"), client("service-quotas"), config("dev", inf), "us-west-2")
    assert statuses(checks) == {"quota infer": WARN, "quota L-1216C47A": WARN, "quota L-3819A6DF": WARN}
    assert "the pools need 6 vCPUs" in {check.name: check for check in checks}["quota L-1216C47A"].detail
    # prod: P on-demand 16 x p5.48xlarge (192) and P Spot 8 x p4d.24xlarge (96)
    world.targets[QUOTA_TARGET] = quota_handler(GOOD_QUOTAS)
    checks = check_quotas(client("ec2", "us-east-1"), client("service-quotas", "us-east-1"), config("prod"),
                          "us-east-1")
    assert {c.name: (c.status, c.detail.split(", pools at max need ")[1].split(" ")[0]) for c in checks} == {
        "quota L-1216C47A": (PASS, "48"), "quota L-417A185B": (FAIL, "3072"), "quota L-7212CCBC": (FAIL, "768")}


def test_kubernetes_version_support_levels(world: AwsStub) -> None:
    eks = client("eks")
    assert check_kubernetes_version(eks, "1.33")[0].status == PASS
    [extended] = check_kubernetes_version(eks, "1.31")
    assert extended.status == WARN and "extended" in extended.detail and extended.fix.endswith("1.32, 1.33, 1.34, 1.35")
    assert check_kubernetes_version(eks, "1.30")[0].status == FAIL


def test_buckets_free_ours_taken(world: AwsStub) -> None:
    """404 and 200 from moto; 403 (another account's bucket) from the stub: moto serves one account."""
    cfg = config("dev")
    client("s3").create_bucket(Bucket="mlc-dev-checkpoints-" + MOTO_ACCOUNT,
                               CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    checks = check_buckets(client("s3"), cfg, "dev", MOTO_ACCOUNT)
    assert [(c.name.split("-")[2], c.status, c.detail.split(":")[0]) for c in checks] == [
        ("datasets", PASS, "free"), ("checkpoints", PASS, "exists and this account can use it (the stack's own, or "
                                     "import it)")]
    world.heads["/mlc-dev-checkpoints-" + MOTO_ACCOUNT] = 403
    world.heads["/mlc-dev-datasets-" + MOTO_ACCOUNT] = 400
    stubbed = boto3.client("s3", region_name="us-west-2", endpoint_url=world.url)
    checks = check_buckets(stubbed, cfg, "dev", MOTO_ACCOUNT)
    assert [c.status for c in checks] == [FAIL, FAIL]
    assert checks[0].detail == "HeadBucket answered 400" and "taken" in checks[1].detail
    assert checks[1].fix == "name the bucket yourself: ml-cluster:storage.buckets[1].bucketName"


def test_registry_free_ours_foreign(world: AwsStub) -> None:
    ecr, cfg = client("ecr"), config("dev")
    assert statuses(check_registry(ecr, cfg, "dev")) == {"repository mlc-dev-train": PASS}
    ecr.create_repository(repositoryName="mlc-dev-train", tags=[{"Key": "project", "Value": "ml-cluster"},
                                                                 {"Key": "stack", "Value": "staging"}])
    [check] = check_registry(ecr, cfg, "dev")
    assert check.status == FAIL and "ml-cluster:registry.repository" in check.fix


def test_bad_input_is_one_error_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert preflight_cli.main(["--stack", "onprem"]) == 2
    assert capsys.readouterr().err.endswith("preflight checks AWS (eks) stacks only\n")
    assert preflight_cli.main(["--stack", "dev", "--account", "12"]) == 2
    assert capsys.readouterr().err == "error: --account: '12' is not a 12-digit AWS account id\n"
    bad = tmp_path / "Pulumi.dev.yaml"
    bad.write_text(json.dumps({"config": {"ml-cluster:platform": "eks", "ml-cluster:nodePools": "x"}}))
    assert preflight_cli.main(["--stack", "dev", "--config", str(bad)]) == 2
    assert all(line.startswith("error: ") for line in capsys.readouterr().err.splitlines())


def test_an_efa_pool_is_checked_in_its_one_zone_only() -> None:
    class Offerings:
        def __init__(self) -> None:
            self.asked: list[list[str]] = []

        def get_paginator(self, _: str) -> Any:
            asked = self.asked

            class Pages:
                def paginate(self, **request: Any) -> list[dict[str, Any]]:
                    asked.append(request["Filters"][1]["Values"])
                    # p5.48xlarge offered in us-west-2a only; everything else everywhere
                    return [{"InstanceTypeOfferings": [
                        {"InstanceType": t, "Location": z} for t in request["Filters"][0]["Values"]
                        for z in request["Filters"][1]["Values"] if t != "p5.48xlarge" or z == "us-west-2a"]}]
            return Pages()

    def efa_pool(zones: list[str]) -> Callable[[dict[str, Any]], None]:
        def edit(values: dict[str, Any]) -> None:
            values["ml-cluster:nodePools"].append({"name": "h100", "instanceTypes": ["p5.48xlarge"], "gpu": True,
                                                   "efa": True, "availabilityZones": zones})
        return edit

    zones = ["us-west-2b", "us-west-2a", "us-west-2c"]
    by_name = {c.name: c for c in check_offerings(Offerings(), config("dev", efa_pool([])), zones)}
    assert by_name["offering h100 p5.48xlarge"] == Check(PASS, "offering h100 p5.48xlarge", "offered in us-west-2a")
    by_name = {c.name: c for c in check_offerings(Offerings(), config("dev", efa_pool(["us-west-2c"])), zones)}
    assert by_name["offering h100 p5.48xlarge"].status == FAIL
    assert by_name["offering h100 p5.48xlarge"].detail == "not offered in any of us-west-2c"


def test_a_capacity_block_pool_preflights_in_rows_with_no_traceback(world: AwsStub, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A CAPACITY_BLOCK pool has no vCPU quota of its own in the table: its row says so, the other pools' quotas are
    still checked, and the block itself is checked by its reservation row (moto knows no such block: a FAIL row)."""
    def edit(values: dict[str, Any]) -> None:
        own_account(values)
        values["ml-cluster:nodePools"].append({
            "name": "h100-block", "instanceTypes": ["p5.48xlarge"], "gpu": True, "capacityType": "CAPACITY_BLOCK",
            "maxSize": 2, "capacityReservation": {"id": "cr-0123456789abcdef0", "availabilityZone": "us-west-2a",
                                                  "instanceCount": 2}})

    checks = statuses(check_quotas(client("ec2"), client("service-quotas"), config("dev", edit), "us-west-2"))
    assert checks["quota h100-block"] == PASS and checks["quota L-3819A6DF"] == PASS
    assert preflight_cli.main(["--stack", "dev", "--config", str(stack_file(tmp_path, edit)),
                               "--account", MOTO_ACCOUNT]) == 2
    out, err = capsys.readouterr()
    flat = re.sub(r" +", " ", out)
    assert "Traceback" not in out + err
    assert "PASS quota h100-block p5.48xlarge: a Capacity Block pool, not held to a vCPU quota here" in flat
    assert "FAIL reservation h100-block cr-0123456789abcdef0" in flat


def test_the_quota_codes_in_the_docs_are_the_codes_preflight_checks() -> None:
    """Every EC2 quota code docs/ names is one preflight asks for, under the name AWS gives it (an old Spot code for
    p5 stood in the runbook after the code moved to the P5 Spot quota)."""
    from infra.account.preflight import QUOTAS

    titles = {code: title for code, title in QUOTAS.values()}
    docs = Path(__file__).resolve().parents[2] / "docs"
    named = 0
    for page in sorted(docs.glob("*.md")):
        for match in re.finditer(r"`?(L-[0-9A-F]{8})`?\s+([A-Z][^|:\n]*?)(?=\s*(?:\||:|;|$))", page.read_text(),
                                 flags=re.MULTILINE):
            code, title = match.group(1), match.group(2).strip()
            assert code in titles, f"{page.name}: {code} is not a quota preflight checks"
            if title.startswith(("Running", "All")):
                named += 1
                short = re.sub(r" \([^)]*\)", "", titles[code])  # the family list in brackets may be left out
                assert title in (titles[code], short), f"{page.name}: {code} is {titles[code]!r}, not {title!r}"
    assert named >= 5


def test_p6_pools_preflight_their_quota_and_offerings(world: AwsStub) -> None:
    """p6-b200 and p6-b300 count against the On-Demand P quota at their 192 vCPUs; their offering rows come from
    EC2's DescribeInstanceTypeOfferings like any type's."""
    def p6(values: dict[str, Any]) -> None:
        values["ml-cluster:nodePools"] += [
            {"name": "gpu-b200", "instanceTypes": ["p6-b200.48xlarge"], "gpu": True, "efa": True, "maxSize": 2,
             "availabilityZones": ["us-east-1a"]},
            {"name": "gpu-b300", "instanceTypes": ["p6-b300.48xlarge"], "gpu": True, "efa": True, "maxSize": 2,
             "availabilityZones": ["us-east-1a"]}]

    world.targets[QUOTA_TARGET] = quota_handler({**GOOD_QUOTAS, "L-417A185B": 3072.0})
    cfg = config("prod", p6)
    quota = {c.name: c for c in check_quotas(client("ec2", "us-east-1"), client("service-quotas", "us-east-1"), cfg,
                                             "us-east-1")}["quota L-417A185B"]
    assert "gpu-b200 2 x 192" in quota.detail and "gpu-b300 2 x 192" in quota.detail
    assert quota.status == FAIL and "--desired-value 3840" in quota.fix  # 16 x 192 (p5) + 2 x 192 + 2 x 192
    zones = ["us-east-1a", "us-east-1b", "us-east-1c"]  # prod's adopted subnets are not in moto: its zones, given
    rows = [c for c in check_offerings(client("ec2", "us-east-1"), cfg, zones) if "gpu-b" in c.name]
    assert {c.name for c in rows} == {"offering gpu-b200 p6-b200.48xlarge", "offering gpu-b300 p6-b300.48xlarge"}
