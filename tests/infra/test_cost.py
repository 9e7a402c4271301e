"""The cost estimate: a pure function of a plan and unit prices; the parsers read the real AWS response shapes, from
the committed fixture offline and from a stub Price List API over HTTP (boto3 unmodified)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from infra.plan.cost import GB_PER_GIB, HOURS_PER_MONTH, CostReport, estimate, format_cost_diff, format_report
from infra.plan.holdings import price_queries
from infra.plan.prices import FIXTURE, aws_prices, fixture_prices
from infra.plan.pricing import (
    PriceError,
    eks_query,
    get_products_request,
    instance_query,
    parse_get_products,
    parse_spot_history,
    s3_query,
    spot_query,
)
from scripts import plan as plan_cli
from tests.awsstub import AwsStub, without_aws_credentials
from tests.moto_server import moto_server

PlanGetter = Callable[[str], dict[str, Any]]


def _resource(token: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"type": token, "name": name, "parent": None, "provider": None, "inputs": inputs, "options": {}}


def small_plan() -> dict[str, Any]:
    """Two pools (on-demand 1/2/4 of m6i.large with 50 GiB disks, Spot 0/0/3 of g5.xlarge with 1 GPU and no disk
    size), a NAT gateway, a cluster, EFS
    with 100Gi and 50Gi claims (plus one claim on another class), a bucket, and a 2-pod Job of 1 GPU for 10 h."""
    subnets = {"subnet-a": "us-west-2a", "subnet-b": "us-west-2b"}
    return {"project": "ml-cluster", "stack": "t", "outputs": {"region": "us-west-2", "subnetAzs": subnets},
            "resources": [
                _resource("aws:eks/nodeGroup:NodeGroup", "sys", {
                    "instanceTypes": ["m6i.large"], "capacityType": "ON_DEMAND", "subnetIds": ["subnet-a"],
                    "diskSize": 50,
                    "scalingConfig": {"minSize": 1, "desiredSize": 2, "maxSize": 4},
                    "labels": {"x.io/pool": "system"}}),
                _resource("aws:eks/nodeGroup:NodeGroup", "gpu", {
                    "instanceTypes": ["g5.xlarge"], "capacityType": "SPOT", "subnetIds": ["subnet-a", "subnet-b"],
                    "scalingConfig": {"minSize": 0, "desiredSize": 0, "maxSize": 3},
                    "labels": {"x.io/pool": "gpu", "x.io/gpu-count": "1", "x.io/gpu-type": "a10g"}}),
                _resource("aws:ec2/natGateway:NatGateway", "nat", {}),
                _resource("aws:eks/cluster:Cluster", "eks", {"name": "c"}),
                _resource("aws:efs/fileSystem:FileSystem", "fs", {}),
                _resource("aws:s3/bucket:Bucket", "b", {"bucket": "b"}),
                _resource("kubernetes:storage.k8s.io/v1:StorageClass", "efs", {
                    "metadata": {"name": "efs-ap"}, "provisioner": "efs.csi.aws.com"}),
                _resource("kubernetes:storage.k8s.io/v1:StorageClass", "gp3", {
                    "metadata": {"name": "gp3"}, "provisioner": "ebs.csi.aws.com"}),
                *[_resource("kubernetes:core/v1:PersistentVolumeClaim", f"pvc{i}", {"spec": {
                    "storageClassName": cls, "resources": {"requests": {"storage": size}}}})
                  for i, (cls, size) in enumerate((("efs-ap", "100Gi"), ("efs-ap", "50Gi"), ("gp3", "1Ti")))],
                _resource("kubernetes:batch/v1:Job", "job", {
                    "metadata": {"name": "train-1234", "labels": {"app.kubernetes.io/name": "train"}},
                    "spec": {"parallelism": 2, "activeDeadlineSeconds": 36000, "template": {"spec": {
                        "nodeSelector": {"x.io/gpu-type": "a10g"},
                        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}),
            ]}


TODAY = date(2026, 11, 24)  # a fixed clock: which support tier a Kubernetes minor is in depends on the day

PRICES = {"gp3:us-west-2": 0.1,
          "ec2:us-west-2:m6i.large:on-demand": 0.1, "ec2:us-west-2:g5.xlarge:spot": 0.5, "nat:us-west-2": 0.05,
          "eks:us-west-2": 0.1, "eks-extended:us-west-2": 0.6, "efs:us-west-2": 0.3, "s3:us-west-2": 0.023}


def test_known_prices_give_known_totals() -> None:
    report = estimate(small_plan(), PRICES, "test prices", TODAY)
    efs_hourly = 150 * GB_PER_GIB * 0.3 / HOURS_PER_MONTH
    disk = 50 * GB_PER_GIB * 0.1 / HOURS_PER_MONTH  # per m6i.large node
    fixed = 0.05 + 0.1 + efs_hourly
    assert report.hourly() == pytest.approx((0.1 + disk + fixed, 0.2 + 2 * disk + fixed,
                                             0.4 + 4 * disk + 1.5 + fixed), abs=1e-6)
    assert report.monthly() == pytest.approx(tuple(round(h * 730, 2) for h in report.hourly()))
    assert report.monthly()[0] == pytest.approx(236.19, abs=0.01)  # (0.1 + 0.0074 + 0.05 + 0.1 + 0.0662) x 730
    bucket = next(line for line in report.lines if line.item == "S3 buckets")
    assert bucket.per_gib_month and bucket.unit_price == 0.023 and bucket.hourly == (0.0, 0.0, 0.0)
    [job] = report.jobs
    assert (job.name, job.pool, job.nodes, job.gpus, job.hours, job.gpu_hours) == ("train", "gpu", 2, 2, 10, 20)
    assert job.cost == pytest.approx(2 * 0.5 * 10)


def test_a_missing_price_is_an_error_not_a_zero() -> None:
    prices = {k: v for k, v in PRICES.items() if not k.startswith("nat:")}
    with pytest.raises(PriceError, match="no price for nat:us-west-2"):
        estimate(small_plan(), prices, "test prices", TODAY)


def test_spot_pools_ask_spot_history_for_their_zones_only() -> None:
    queries = {q.key: q for q in price_queries(small_plan())}
    spot = queries["ec2:us-west-2:g5.xlarge:spot"]
    assert spot.kind == "spot" and spot.zones == ("us-west-2a", "us-west-2b")
    history = {"SpotPriceHistory": [
        {"AvailabilityZone": "us-west-2a", "InstanceType": "g5.xlarge", "SpotPrice": "0.40",
         "Timestamp": "2026-11-02T10:00:00+00:00"},
        {"AvailabilityZone": "us-west-2a", "InstanceType": "g5.xlarge", "SpotPrice": "0.90",  # older: ignored
         "Timestamp": "2026-11-01T10:00:00+00:00"},
        {"AvailabilityZone": "us-west-2b", "InstanceType": "g5.xlarge", "SpotPrice": "0.45",
         "Timestamp": "2026-11-02T09:00:00+00:00"},
        {"AvailabilityZone": "us-west-2d", "InstanceType": "g5.xlarge", "SpotPrice": "2.00",  # not a pool zone
         "Timestamp": "2026-11-02T10:00:00+00:00"}]}
    assert parse_spot_history(history, spot) == 0.45
    with pytest.raises(PriceError, match="no Spot price"):
        parse_spot_history({"SpotPriceHistory": []}, spot)


def _item(usagetype: str, dimensions: list[tuple[str, str, str]]) -> str:
    return json.dumps({"product": {"attributes": {"usagetype": usagetype}, "sku": "SKU"}, "terms": {"OnDemand": {
        "SKU.T": {"priceDimensions": {f"SKU.T.{i}": {"unit": unit, "beginRange": begin, "pricePerUnit": {"USD": usd}}
                                      for i, (unit, begin, usd) in enumerate(dimensions)}}}}})


def test_get_products_parser_picks_the_first_tier_of_the_named_usage_type() -> None:
    s3 = s3_query("us-west-2")
    response = {"FormatVersion": "aws_v1", "PriceList": [
        _item("USW2-TimedStorage-ByteHrs", [("GB-Mo", "0", "0.0230000000"), ("GB-Mo", "51200", "0.022")]),
        _item("USW2-Requests-Tier1", [("Requests", "0", "0.000005")])]}
    assert parse_get_products(response, s3) == 0.023
    eks = eks_query("us-west-2")
    ambiguous = {"PriceList": [_item("USW2-AmazonEKS-Hours:perCluster", [("Hrs", "0", "0.10")]),
                               _item("X-AmazonEKS-Hours:perCluster", [("Hrs", "0", "0.60")])]}
    with pytest.raises(PriceError, match="2 different prices"):
        parse_get_products(ambiguous, eks)
    with pytest.raises(PriceError, match="no Hrs on-demand price"):
        parse_get_products({"PriceList": []}, eks)


def test_every_committed_stack_is_priced_from_the_fixture(stack_plan: PlanGetter) -> None:
    dev = stack_plan("dev")
    report = estimate(dev, fixture_prices(price_queries(dev)), "fixture", TODAY)
    # system 2 x m6i.large 0.096, one NAT 0.045, EKS 0.10, EFS 700Gi x 0.30/GB-month; Spot g5.xlarge: the highest
    # newest price of dev's zones a-c (0.4127 in us-west-2b; us-west-2d's 0.6012 is not a dev zone); 100 GiB gp3
    # ($0.08/GB-month) per node of either pool
    efs = 700 * GB_PER_GIB * 0.30 / HOURS_PER_MONTH
    disk = 100 * GB_PER_GIB * 0.08 / HOURS_PER_MONTH
    assert report.hourly()[0] == pytest.approx(2 * (0.096 + disk) + 0.045 + 0.10 + efs, abs=1e-6)
    assert report.hourly()[2] == pytest.approx(3 * (0.096 + disk) + 2 * (0.4127 + disk) + 0.045 + 0.10 + efs,
                                               abs=1e-6)
    for stack in ("staging", "prod"):
        plan = stack_plan(stack)
        assert estimate(plan, fixture_prices(price_queries(plan)), "fixture", TODAY).monthly()[2] > 0
    onprem = estimate(stack_plan("onprem"), {}, "fixture", TODAY)
    assert onprem.lines == [] and "not priced" in format_report(onprem)


def test_fixture_without_a_price_names_the_request(tmp_path: Path) -> None:
    empty = tmp_path / "prices.json"
    empty.write_text(json.dumps({"getProducts": [], "describeSpotPriceHistory": []}))
    with pytest.raises(PriceError, match=r"no fixture response for ec2:eu-west-1:m6i.large:on-demand"):
        fixture_prices([instance_query("eu-west-1", "m6i.large")], empty)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(PriceError, match="unreadable price fixture"):
        fixture_prices([], broken)


@pytest.fixture(scope="module")
def stub() -> Iterator[AwsStub]:
    server = AwsStub().start()
    yield server
    server.stop()


def test_real_runs_ask_the_price_list_api(stub: AwsStub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The boto3 path against a Price List API stub that answers from the fixture's recorded responses (paginated in
    two pages, as AWS does): the prices equal the offline ones."""
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(key, value)
    recorded = json.loads(FIXTURE.read_text())

    def get_products(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        request = {key: body[key] for key in ("ServiceCode", "FormatVersion", "Filters")}
        pair = next(p for p in recorded["getProducts"] if p["request"] == request)
        items = pair["response"]["PriceList"]
        if body.get("NextToken") == "page-2":
            return 200, {"FormatVersion": "aws_v1", "PriceList": items[1:]}
        return 200, {"FormatVersion": "aws_v1", "PriceList": items[:1], **({"NextToken": "page-2"}
                                                                             if len(items) > 1 else {})}

    stub.targets["AWSPriceListService.GetProducts"] = get_products
    queries = [instance_query("us-west-2", "g5.xlarge"), s3_query("us-west-2"), eks_query("us-east-1")]
    prices = aws_prices(queries, lambda service, region: boto3.client(service, region_name=region,
                                                                      endpoint_url=stub.url))
    assert prices == fixture_prices(queries)
    sent = [body for target, body in stub.requests if target == "AWSPriceListService.GetProducts"]
    assert {"ServiceCode": "AmazonS3", "FormatVersion": "aws_v1",
            "Filters": get_products_request(s3_query("us-west-2"))["Filters"]} in sent
    assert any(body.get("NextToken") == "page-2" for body in sent)


def test_real_runs_read_spot_history_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    """describe_spot_price_history against moto in server mode (it serves one price per offered zone), paginated by
    boto3 with StartTime=now: the pool's zones only, their highest newest price."""
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")):
        monkeypatch.setenv(key, value)
    with moto_server() as url:
        spot = spot_query("us-east-1", "p4d.24xlarge", ["us-east-1a", "us-east-1b"])
        now = datetime(2026, 11, 2, tzinfo=UTC)
        prices = aws_prices([spot], lambda service, region: boto3.client(service, region_name=region,
                                                                         endpoint_url=url), now=lambda: now)
        assert prices == {spot.key: 0.00001}  # moto's constant Spot price
        missing = spot_query("us-east-1", "p4d.24xlarge", ["us-east-1z"])
        with pytest.raises(PriceError, match="no Spot price for p4d.24xlarge in us-east-1z"):
            aws_prices([missing], lambda service, region: boto3.client(service, region_name=region,
                                                                       endpoint_url=url), now=lambda: now)


def test_plan_cli_prints_the_table_and_the_diff(stack_plan: PlanGetter, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(plan_cli, "plan_stack", lambda stack, config=None: stack_plan(stack))
    assert plan_cli.main(["--stack", "dev", "--cost"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("cost of stack dev (us-west-2), offline prices")
    assert "node pool gpu-a10g" in table and "resnet50-s3-copy" in table and "total per month (730 h)" in table
    assert plan_cli.main(["--stack", "dev", "--cost", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["stack"] == "dev" and document["sizes"] == ["min", "desired", "max"]
    assert document["monthly"] == [round(h * 730, 2) for h in document["hourly"]]
    assert {job["name"] for job in document["jobs"]} == {"finetune-efs", "resnet50-s3-copy"}
    base = json.loads(json.dumps(stack_plan("dev")))
    for resource in base["resources"]:
        if resource["name"] == "mlc-dev-nodepools-system-ng":
            resource["inputs"]["scalingConfig"] = {"minSize": 1, "desiredSize": 1, "maxSize": 3}
    old = tmp_path / "base.json"
    old.write_text(json.dumps(base))
    assert plan_cli.main(["--stack", "dev", "--cost", "--diff", str(old)]) == 0
    text = capsys.readouterr().out
    assert "diff  +$78.67 / +$78.67 / +$0.00" in text  # one more m6i.large (0.096 x 730) and its 100 GiB gp3 (8.59)
    assert "~ node pool system: m6i.large on-demand x 1/1/3" in text
    same = estimate(base, PRICES_DEV, "x", TODAY)
    assert format_cost_diff(same, same).splitlines()[4:] == ["  no cost change"]
    longer = json.loads(json.dumps(base))
    for resource in longer["resources"]:
        if resource["name"] == "mlc-dev-jobs-resnet50-s3-copy":
            resource["inputs"]["spec"]["activeDeadlineSeconds"] = 3600 * 96
    assert format_cost_diff(same, estimate(longer, PRICES_DEV, "x", TODAY)).splitlines()[4:] == [
        "~ job resnet50-s3-copy at its deadline: 48 GPU-hours, $19.20 -> 96 GPU-hours, $38.40"]


PRICES_DEV = {"gp3:us-west-2": 0.08,
              "ec2:us-west-2:m6i.large:on-demand": 0.096, "ec2:us-west-2:g5.xlarge:spot": 0.4, "nat:us-west-2": 0.045,
              "eks:us-west-2": 0.1, "eks-extended:us-west-2": 0.6, "efs:us-west-2": 0.3, "s3:us-west-2": 0.023}


def test_aws_prices_without_credentials_is_one_error_line(stack_plan: PlanGetter, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(plan_cli, "plan_stack", lambda stack, config=None: stack_plan(stack))
    without_aws_credentials(monkeypatch, tmp_path)
    assert plan_cli.main(["--stack", "dev", "--cost", "--prices", "aws"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note: ")]
    assert errors == ["error: aws: Unable to locate credentials"]


@pytest.mark.parametrize(("day", "rate", "tier"), [
    (date(2026, 7, 28), 0.10, "standard support"),  # 1.33's last day of EKS standard support
    (date(2026, 7, 29), 0.60, "extended support on 2026-07-29"),
    (date(2027, 7, 28), 0.60, "extended support on 2027-07-28"),
])
def test_the_control_plane_is_priced_by_its_support_tier_on_the_day(stack_plan: PlanGetter, day: date, rate: float,
                                                                    tier: str) -> None:
    def pinned_to(version: str) -> CostReport:
        plan = json.loads(json.dumps(stack_plan("dev")))
        [cluster] = [r for r in plan["resources"] if r["type"] == "aws:eks/cluster:Cluster"]
        cluster["inputs"]["version"] = version
        return estimate(plan, fixture_prices(price_queries(plan)), "fixture", day)

    report = pinned_to("1.33")
    [line] = [line for line in report.lines if line.item == "EKS control plane"]
    assert (line.unit_price, line.hourly) == (rate, (rate, rate, rate))
    assert line.detail == f"Kubernetes 1.33, {tier}"
    # 1.36 is in standard support on each of these days; a month of extended support costs (0.60 - 0.10) x 730 h
    # = $365 more
    assert report.monthly()[0] - pinned_to("1.36").monthly()[0] == pytest.approx((rate - 0.10) * HOURS_PER_MONTH,
                                                                                   abs=0.02)


def _team(name: str, gpus: int, borrowing: int | None) -> list[dict[str, Any]]:
    gpu = {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)}
    if borrowing is not None:
        gpu["borrowingLimit"] = str(borrowing)
    namespace = f"team-{name}"
    return [
        _resource("kubernetes:core/v1:Namespace", f"{name}-ns", {
            "metadata": {"name": namespace, "labels": {"x.io/team": name}}}),
        _resource("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue", f"cq-{name}", {
            "metadata": {"name": name}, "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                "resourceGroups": [{"flavors": [
                    {"name": "a10g", "resources": [{"name": "cpu", "nominalQuota": "8"}, gpu]},
                    {"name": "cpu", "resources": [{"name": "cpu", "nominalQuota": "0"}]}]}]}}),
    ]


def teams_plan() -> dict[str, Any]:
    """small_plan plus an on-demand pool of the same GPU type (the dearer rate for the flavor), the a10g flavor, team
    a (2 GPUs, may borrow 1) with a 200Gi claim on an EFS access-point PV, team b (1 GPU, no borrowing limit), and
    the shared queue (not a team's: no label on its namespace)."""
    plan = small_plan()
    plan["resources"] += [
        _resource("aws:eks/nodeGroup:NodeGroup", "gpu-od", {
            "instanceTypes": ["g5.xlarge"], "capacityType": "ON_DEMAND", "subnetIds": ["subnet-a"],
            "scalingConfig": {"minSize": 0, "desiredSize": 0, "maxSize": 2},
            "labels": {"x.io/pool": "gpu-od", "x.io/gpu-count": "1", "x.io/gpu-type": "a10g"}}),
        _resource("kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor", "flavor-a10g", {
            "metadata": {"name": "a10g"}, "spec": {"nodeLabels": {"x.io/gpu-type": "a10g"}}}),
        *_team("a", 2, 1), *_team("b", 1, None),
        _resource("kubernetes:core/v1:Namespace", "training-ns", {"metadata": {"name": "training"}}),
        _resource("kubernetes:kueue.x-k8s.io/v1beta2:ClusterQueue", "cq-shared", {"spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "training"}},
            "resourceGroups": [{"flavors": [{"name": "a10g", "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": "3"}]}]}]}}),
        _resource("kubernetes:core/v1:PersistentVolume", "pv-a", {
            "metadata": {"name": "team-a-team-shared"},
            "spec": {"csi": {"driver": "efs.csi.aws.com", "volumeHandle": "fs-1::fsap-1"}}}),
        _resource("kubernetes:core/v1:PersistentVolumeClaim", "pvc-a", {
            "metadata": {"name": "team-shared", "namespace": "team-a"},
            "spec": {"storageClassName": "", "volumeName": "team-a-team-shared",
                     "resources": {"requests": {"storage": "200Gi"}}}}),
    ]
    return plan


def test_teams_are_charged_their_quota_at_the_dearest_pool_rate_and_their_efs() -> None:
    prices = {**PRICES, "ec2:us-west-2:g5.xlarge:on-demand": 1.0}
    report = estimate(teams_plan(), prices, "test prices", TODAY)
    efs = 200 * GB_PER_GIB * 0.3 / HOURS_PER_MONTH
    assert [(t.team, t.flavor, t.gpus, t.at_most, t.gpu_hour_price, t.hourly, t.hourly_at_most)
            for t in report.teams] == [
        ("a", "a10g", 2, 3, 1.0, 2.0, 3.0),
        ("a", "", 0, None, 0.3, pytest.approx(efs), pytest.approx(efs)),
        ("b", "a10g", 1, None, 1.0, 1.0, None),
    ]
    assert report.team_monthly() == {"a": pytest.approx(round((2.0 + efs) * 730, 2)), "b": 730.0}
    # Attribution only: the totals are the pools and storage, the team claim counted once in the EFS line.
    assert next(line for line in report.lines if line.item == "EFS storage").detail == "350 GiB claimed, Standard"
    text = format_report(report)
    assert "teams at their Kueue quota" in text and "(may borrow without limit)" in text
    # 2 GPUs x $1/h x 730 h + 200 GiB x 1.0737 GB/GiB x $0.30/GB-month
    assert "$1,524.42" in text.split("  total a", 1)[1].splitlines()[0]


def test_a_capacity_block_of_the_flavor_prices_the_teams_gpus_too() -> None:
    plan = teams_plan()
    plan["outputs"]["nodePools"] = {"gpu-block": {"reservation": {"id": "cr-0123456789abcdef0", "instanceCount": 2}}}
    plan["resources"].append(_resource("aws:eks/nodeGroup:NodeGroup", "gpu-block", {
        "instanceTypes": ["g5.xlarge"], "capacityType": "CAPACITY_BLOCK", "subnetIds": ["subnet-a"],
        "scalingConfig": {"minSize": 0, "desiredSize": 0, "maxSize": 2},
        "labels": {"x.io/pool": "gpu-block", "x.io/gpu-count": "1", "x.io/gpu-type": "a10g"}}))
    prices = {**PRICES, "ec2:us-west-2:g5.xlarge:on-demand": 1.0, "capacity-block:us-west-2:g5.xlarge:2x24h": 2.5}
    report = estimate(plan, prices, "test prices", TODAY)
    assert {(t.team, t.gpu_hour_price) for t in report.teams if t.flavor} == {("a", 2.5), ("b", 2.5)}


@pytest.mark.parametrize(("where", "value", "named"), [
    ((0, "scalingConfig", "minSize"), "two", "aws:eks/nodeGroup:NodeGroup sys"),
    ((0, "scalingConfig"), [1, 2], "aws:eks/nodeGroup:NodeGroup sys"),
    ((1, "labels"), ["x.io/pool"], "aws:eks/nodeGroup:NodeGroup gpu"),
    ((1, "instanceTypes"), 5, "aws:eks/nodeGroup:NodeGroup gpu"),
    ((8, "spec", "resources"), {"requests": {"storage": "lots"}}, "kubernetes:core/v1:PersistentVolumeClaim pvc0"),
    ((11, "spec", "parallelism"), "two", "kubernetes:batch/v1:Job job"),
])
def test_a_base_plan_with_values_of_the_wrong_type_is_one_line_naming_the_resource(
        where: tuple[Any, ...], value: Any, named: str) -> None:
    """--diff --cost reads the base plan's values: a hand-edited one is a PlanValueError naming the resource."""
    from infra.plan.holdings import PlanValueError

    base = small_plan()
    target = base["resources"][where[0]]["inputs"]
    for key in where[1:-1]:
        target = target[key]
    target[where[-1]] = value
    with pytest.raises(PlanValueError, match=rf"^{named}: an input of the wrong type or value \("):
        plan_cli.cost_text(small_plan(), base, "fixture", TODAY)
    assert plan_cli.cost_text(small_plan(), small_plan(), "fixture", TODAY)  # the same plans price as before
