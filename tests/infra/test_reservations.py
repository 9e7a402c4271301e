"""Reserved capacity: the pool config's rules, what the plan renders for a Capacity Block and an On-Demand Capacity
Reservation, and preflight against recorded DescribeCapacityReservations answers served over EC2's query protocol."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.account.preflight import FAIL, PASS, WARN, check_next_blocks, check_reservations
from infra.config import ConfigError, parse_stack_config
from infra.config.schema import decode_config_value
from infra.plan.engine import STACKS_DIR
from tests.awsstub import AwsStub, ec2_error

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
BLOCK = {"id": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b", "instanceCount": 2}
ODCR = {"id": "cr-0fedcba9876543210", "availabilityZone": "us-east-1a", "instanceCount": 4}


def prod_values(*pools: dict[str, Any]) -> dict[str, Any]:
    values = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())["config"]
    values["ml-cluster:nodePools"] = [*values["ml-cluster:nodePools"], *pools]
    return values


def block_pool(**extra: Any) -> dict[str, Any]:
    return {"name": "h100-block", "instanceTypes": ["p5.48xlarge"], "gpu": True, "capacityType": "CAPACITY_BLOCK",
            "maxSize": 2, "capacityReservation": dict(BLOCK), **extra}


def odcr_pool(**extra: Any) -> dict[str, Any]:
    return {"name": "a100-odcr", "instanceTypes": ["p4d.24xlarge"], "gpu": True, "maxSize": 4,
            "capacityReservation": dict(ODCR), **extra}


def parse(values: dict[str, Any]) -> Any:
    return parse_stack_config({key: decode_config_value(value) for key, value in values.items()})


def test_a_capacity_block_and_an_odcr_plan_into_their_reservations(plan_config: Any) -> None:
    plan = plan_config("prod", {"ml-cluster:nodePools": prod_values(block_pool(efa=True), odcr_pool())[
        "ml-cluster:nodePools"]})
    templates = {r["name"]: r["inputs"] for r in plan["resources"]
                 if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate"}
    groups = {r["name"]: r["inputs"] for r in plan["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup"}
    zones = plan["outputs"]["subnetAzs"]
    block, odcr = templates["mlc-prod-nodepools-h100-block-lt"], templates["mlc-prod-nodepools-a100-odcr-lt"]
    assert block["capacityReservationSpecification"] == {"capacityReservationTarget": {
        "capacityReservationId": BLOCK["id"]}}
    assert block["instanceMarketOptions"] == {"marketType": "capacity-block"}
    assert groups["mlc-prod-nodepools-h100-block-ng"]["capacityType"] == "CAPACITY_BLOCK"
    assert {zones[s] for s in groups["mlc-prod-nodepools-h100-block-ng"]["subnetIds"]} == {"us-east-1b"}
    # an EFA block (its one zone is the reservation's): the ENA primary and an EFA-only interface per card
    assert len(block["networkInterfaces"]) == 33
    assert odcr["capacityReservationSpecification"] == {"capacityReservationTarget": {
        "capacityReservationId": ODCR["id"]}}
    assert "instanceMarketOptions" not in odcr
    assert {zones[s] for s in groups["mlc-prod-nodepools-a100-odcr-ng"]["subnetIds"]} == {"us-east-1a"}
    # Kueue: each reservation a flavor of its own before its GPU type's; the other pools of the type kept apart
    assert groups["mlc-prod-nodepools-h100-block-ng"]["labels"]["ml-cluster.io/capacity"] == "reserved"
    assert groups["mlc-prod-nodepools-gpu-h100-ng"]["labels"]["ml-cluster.io/capacity"] == "unreserved"
    [shared] = [r["inputs"] for r in plan["resources"] if r["name"] == "mlc-prod-kueue-cq-shared"]
    assert [(f["name"], next(q["nominalQuota"] for q in f["resources"] if q["name"] == "nvidia.com/gpu"))
            for f in shared["spec"]["resourceGroups"][0]["flavors"]] == [
        ("reserved-a100-odcr", "32"), ("a100", "64"), ("reserved-h100-block", "16"), ("h100", "128"), ("cpu", "0")]
    # monitoring: an idle-GPU alert per reservation, on the pool label kube-state-metrics now exports
    [rule] = [r["inputs"] for r in plan["resources"]
              if r["type"] == "kubernetes:monitoring.coreos.com/v1:PrometheusRule"]
    idle = {r["labels"]["pool"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]
            if r.get("alert") == "ReservedGpusIdle"}
    assert set(idle) == {"h100-block", "a100-odcr"} and idle["a100-odcr"].startswith("((vector(32) - (sum(")
    [release] = [r["inputs"] for r in plan["resources"] if r["name"] == "mlc-prod-monitoring-kps"]
    assert release["values"]["kube-state-metrics"]["metricLabelsAllowlist"] == [
        "nodes=[ml-cluster.io/gpu-count,ml-cluster.io/gpu-health,ml-cluster.io/pool]",
        "pods=[app.kubernetes.io/instance]"]
    open_pool = plan_config("prod", {"ml-cluster:nodePools": prod_values(odcr_pool(
        capacityReservation={**ODCR, "preference": "open"}))["ml-cluster:nodePools"]})
    [spec] = [r["inputs"]["capacityReservationSpecification"] for r in open_pool["resources"]
              if r["name"] == "mlc-prod-nodepools-a100-odcr-lt"]
    assert spec == {"capacityReservationPreference": "open"}


@pytest.mark.parametrize(("pool", "why"), [
    (block_pool(capacityReservation=None), "capacityType CAPACITY_BLOCK needs capacityReservation"),
    (odcr_pool(capacityType="SPOT"), "a Spot pool cannot launch into capacityReservation"),
    (odcr_pool(instanceTypes=["p4d.24xlarge", "p4de.24xlarge"]), "a reservation holds one instance type"),
    (odcr_pool(availabilityZones=["us-east-1c"]), "reservation cr-0fedcba9876543210 is in us-east-1a"),
    (odcr_pool(maxSize=5), "maxSize 5 is above the 4 instances reservation cr-0fedcba9876543210 holds"),
    (block_pool(capacityReservation={**BLOCK, "preference": "open"}), "a Capacity Block is always targeted"),
    (odcr_pool(capacityReservation={**ODCR, "availabilityZone": "us-east-1z"}), "no private subnet"),
])
def test_each_bad_reservation_is_one_error_line(plan_config: Any, pool: dict[str, Any], why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_config("prod", {"ml-cluster:nodePools": prod_values(pool)["ml-cluster:nodePools"]})
    lines = caught.value.lines()
    assert len(lines) == 1 and why in lines[0] and "nodePools[3]" in lines[0], lines


def _item(**fields: Any) -> str:
    defaults = {"capacityReservationId": BLOCK["id"], "instanceType": "p5.48xlarge",
                "availabilityZone": "us-east-1b", "totalInstanceCount": "2", "availableInstanceCount": "2",
                "state": "active", "startDate": "2026-11-20T11:30:00.000Z", "endDate": "2026-11-27T11:30:00.000Z",
                "instanceMatchCriteria": "targeted", "reservationType": "capacity-block"}
    body = "".join(f"<{k}>{v}</{k}>" for k, v in {**defaults, **fields}.items())
    return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeCapacityReservationsResponse "
            "xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>stub</requestId><capacityReservationSet>"
            f"<item>{body}</item></capacityReservationSet></DescribeCapacityReservationsResponse>")


@pytest.fixture(scope="module")
def ec2() -> Iterator[tuple[AwsStub, Any]]:
    stub = AwsStub().start()
    yield stub, stub.client("ec2")
    stub.stop()


@pytest.mark.parametrize(("answer", "status", "says"), [
    (_item(), PASS, "cr-0123456789abcdef0 active, Capacity Block of 2 x p5.48xlarge in us-east-1b, 2026-11-20 11:30 "
                    "UTC to 2026-11-27 11:30 UTC"),
    (_item(state="scheduled", startDate="2026-11-30T11:30:00.000Z"), WARN, "the pool gets nodes from 2026-11-30"),
    (_item(state="expired"), FAIL, "no instance can launch into it"),
    (_item(availabilityZone="us-east-1c"), FAIL, "it is in us-east-1c, the config says us-east-1b"),
    (_item(instanceType="p5en.48xlarge"), FAIL, "it holds p5en.48xlarge, the pool runs p5.48xlarge"),
    (_item(reservationType="default"), FAIL, "it is not a Capacity Block, the pool's capacityType is CAPACITY_BLOCK"),
    (_item(availableInstanceCount="0"), WARN, "only 0 of 2 free"),
    (_item(endDate="2026-11-25T06:00:00.000Z"), WARN, "ends in 18.0 h; running Jobs get SIGTERM"),
])
def test_preflight_reads_each_reservation_state(ec2: tuple[AwsStub, Any], answer: str, status: str,
                                                says: str) -> None:
    stub, client = ec2
    stub.ec2_actions["DescribeCapacityReservations"] = lambda form: (200, answer)
    [check] = check_reservations(client, parse(prod_values(block_pool())), now=lambda: NOW)
    assert check.status == status and says in check.detail, check
    assert stub.requests[-1][1]["CapacityReservationId.1"] == BLOCK["id"]
    assert (check.fix != "") == (status != PASS)


def test_preflight_compares_the_configured_end_with_ec2s(ec2: tuple[AwsStub, Any]) -> None:
    stub, client = ec2
    stub.ec2_actions["DescribeCapacityReservations"] = lambda form: (200, _item())
    right = block_pool(capacityReservation={**BLOCK, "endTime": "2026-11-27T11:30:00Z"})
    assert [c.status for c in check_reservations(client, parse(prod_values(right)), now=lambda: NOW)] == [PASS]
    wrong = block_pool(capacityReservation={**BLOCK, "endTime": "2026-11-28T11:30:00Z"})
    [check] = check_reservations(client, parse(prod_values(wrong)), now=lambda: NOW)
    assert check.status == FAIL and "it ends 2026-11-27 11:30 UTC, the config says 2026-11-28 11:30 UTC" in check.detail
    assert check.fix.endswith(".endTime: 2026-11-27T11:30:00+00:00")
    early = block_pool(capacityReservation={**BLOCK, "startTime": "2026-11-19T11:30:00Z"})
    [check] = check_reservations(client, parse(prod_values(early)), now=lambda: NOW)
    assert check.status == FAIL and "it starts 2026-11-20 11:30 UTC, the config says 2026-11-19 11:30 UTC" in \
        check.detail
    assert check.fix.endswith(".startTime: 2026-11-20T11:30:00+00:00")
    both = block_pool(capacityReservation={**BLOCK, "startTime": "2026-11-20T11:30:00Z",
                                           "endTime": "2026-11-27T11:30:00Z"})
    assert [c.status for c in check_reservations(client, parse(prod_values(both)), now=lambda: NOW)] == [PASS]


def _offerings(*offers: dict[str, str]) -> str:
    """A DescribeCapacityBlockOfferings answer as EC2 writes it: the result's members by their locationName
    (botocore 1.44.8 data/ec2/2016-11-15/service-2.json: capacityBlockOfferingSet :27379, its `item`s :14113, a
    CapacityBlockOffering's fields :13962-14035)."""
    items = []
    for fields in offers:
        defaults = {"capacityBlockOfferingId": "cb-0a1b2c3d4e5f60009", "instanceType": "p5.48xlarge",
                    "availabilityZone": "us-east-1b", "instanceCount": "2", "startDate": "2026-11-27T11:30:00.000Z",
                    "endDate": "2026-12-04T11:30:00.000Z", "capacityBlockDurationHours": "168",
                    "capacityBlockDurationMinutes": "0", "upfrontFee": "10080.00", "currencyCode": "USD",
                    "tenancy": "default"}
        items.append("<item>" + "".join(f"<{k}>{v}</{k}>" for k, v in {**defaults, **fields}.items()) + "</item>")
    return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeCapacityBlockOfferingsResponse "
            "xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>stub</requestId><capacityBlockOfferingSet>"
            f"{''.join(items)}</capacityBlockOfferingSet></DescribeCapacityBlockOfferingsResponse>")


WEEK_BLOCK = {**BLOCK, "startTime": "2026-11-20T11:30:00Z", "endTime": "2026-11-27T11:30:00Z"}


@pytest.mark.parametrize(("answer", "status", "says"), [
    (_offerings({}), PASS, "2 x p5.48xlarge for 168 h in us-east-1b from 2026-11-27 11:30 UTC: USD 10,080.00 "
                           "upfront (30.00 per instance-hour)"),
    (_offerings({"startDate": "2026-11-29T11:30:00.000Z"}), WARN, "it starts 48.0 h after this one ends"),
    (_offerings({"availabilityZone": "us-east-1c"}), WARN, "none offered in us-east-1b (offered in us-east-1c)"),
    (_offerings(), WARN, "none offered in us-east-1b"),
])
def test_preflight_prices_the_next_block(ec2: tuple[AwsStub, Any], answer: str, status: str, says: str) -> None:
    stub, client = ec2
    stub.ec2_actions["DescribeCapacityBlockOfferings"] = lambda form: (200, answer)
    [check] = check_next_blocks(client, parse(prod_values(block_pool(capacityReservation=WEEK_BLOCK))),
                                now=lambda: NOW)
    assert check.status == status and says in check.detail, check
    assert check.name == "next block h100-block"
    if "offered in us-east-1c" in says:
        assert check.fix == ("a block in another zone moves the pool: set "
                             "ml-cluster:nodePools[3].capacityReservation.id and .availabilityZone to the new block's")
    asked = stub.requests[-1][1]
    assert (asked["InstanceType"], asked["InstanceCount"], asked["CapacityDurationHours"]) == (
        "p5.48xlarge", "2", "168")
    assert asked["StartDateRange"].startswith("2026-11-27T11:30:00")  # from the block's end


def test_real_runs_price_a_block_from_ec2s_offerings(ec2: tuple[AwsStub, Any]) -> None:
    """aws_prices over EC2's query protocol: the fixture's recorded offerings served as XML in two pages (boto3's
    paginator follows nextToken); the price equals the offline one."""
    from infra.plan.prices import FIXTURE, aws_prices, fixture_prices
    from infra.plan.pricing import block_query

    stub, _ = ec2
    query = block_query("us-east-1", "p5.48xlarge", 2, 24, ["us-east-1b"])
    [pair] = [p for p in json.loads(FIXTURE.read_text())["describeCapacityBlockOfferings"]
              if p["request"]["CapacityDurationHours"] == 24]
    pages = [_offerings({key[0].lower() + key[1:]: str(value) for key, value in offer.items()})
             for offer in pair["response"]["CapacityBlockOfferings"]]

    def answer(form: dict[str, Any]) -> tuple[int, str]:
        if form.get("NextToken") == "page-2":
            return 200, pages[1]
        return 200, pages[0].replace("</capacityBlockOfferingSet>", "</capacityBlockOfferingSet><nextToken>page-2"
                                                                    "</nextToken>")

    stub.ec2_actions["DescribeCapacityBlockOfferings"] = answer
    prices = aws_prices([query], stub.client)
    assert prices == fixture_prices([query]) and prices[query.key] == pytest.approx(1510.27 / 48)
    asked = [form for action, form in stub.requests if action == "ec2 DescribeCapacityBlockOfferings"][-2:]
    assert [form.get("NextToken") for form in asked] == [None, "page-2"]
    assert asked[0]["CapacityDurationHours"] == "24" and asked[0]["InstanceCount"] == "2"


def test_preflight_without_permission_for_offerings_warns(ec2: tuple[AwsStub, Any]) -> None:
    stub, client = ec2
    stub.ec2_actions["DescribeCapacityBlockOfferings"] = lambda form: (
        403, ec2_error("UnauthorizedOperation", "You are not authorized to perform this operation."))
    [check] = check_next_blocks(client, parse(prod_values(block_pool(), odcr_pool())), now=lambda: NOW)
    assert check.status == WARN and "UnauthorizedOperation" in check.detail  # the ODCR pool has no next block
    assert check.fix == "grant ec2:DescribeCapacityBlockOfferings"


def test_a_reservation_ec2_does_not_know_is_a_fail_with_its_fix(ec2: tuple[AwsStub, Any]) -> None:
    stub, client = ec2
    stub.ec2_actions["DescribeCapacityReservations"] = lambda form: (
        400, ec2_error("InvalidCapacityReservationId.NotFound", "The capacity reservation does not exist"))
    [check] = check_reservations(client, parse(prod_values(block_pool())), now=lambda: NOW)
    assert check.status == FAIL and "InvalidCapacityReservationId.NotFound" in check.detail
    assert check.fix.startswith("set ml-cluster:nodePools[3].capacityReservation.id")
    assert check_reservations(client, parse(prod_values()), now=lambda: NOW) == []


def test_reserved_hours_are_priced_as_what_they_are(plan_config: Any) -> None:
    from infra.plan.cost import estimate
    from infra.plan.holdings import price_queries
    from infra.plan.prices import fixture_prices

    plan = plan_config("prod", {"ml-cluster:nodePools": prod_values(block_pool(), odcr_pool(minSize=1))[
        "ml-cluster:nodePools"]})
    report = estimate(plan, fixture_prices(price_queries(plan)), "fixture", NOW.date())
    lines = {line.item: line for line in report.lines}
    odcr, idle = lines["node pool a100-odcr"], lines["idle reservation a100-odcr"]
    rate = odcr.unit_price
    # the reservation bills 4 instances at every size: the ones running (1/1/4) plus the idle ones (3/3/0)
    assert odcr.hourly == (rate, rate, 4 * rate) and idle.hourly == (3 * rate, 3 * rate, 0.0)
    assert "cr-0fedcba9876543210: 4 x p4d.24xlarge reserved, 3/3/0 idle" in idle.detail
    # the block: the offering in its zone (us-east-1b, not the cheaper one in us-east-1a), its upfront fee per
    # instance-hour (stacks/fixtures/prices.json: $1,510.27 for 2 x 24 h) x the 2 reserved, at every size
    block = lines["node pool h100-block"]
    assert block.unit_price == pytest.approx(1510.27 / 48) and block.hourly == (2 * block.unit_price,) * 3
    assert "Capacity Block cr-0123456789abcdef0: 2 reserved for 24 h, prepaid" in block.detail
    week = plan_config("prod", {"ml-cluster:nodePools": prod_values(block_pool(capacityReservation={
        **BLOCK, "startTime": "2026-11-20T11:30:00Z", "endTime": "2026-11-27T11:30:00Z"}))["ml-cluster:nodePools"]})
    [line] = [line for line in estimate(week, fixture_prices(price_queries(week)), "fixture", NOW.date()).lines
              if line.item == "node pool h100-block"]
    assert line.unit_price == pytest.approx(30.125) and "2 reserved for 168 h" in line.detail


@pytest.mark.parametrize(("start", "end", "hours"), [
    (None, "2026-11-27T11:30:00+00:00", 24),  # unknown: a day, the shortest block
    ("2026-11-20T11:30:00+00:00", "2026-11-21T11:30:00+00:00", 24),
    ("2026-11-20T11:30:00+00:00", "2026-11-21T12:00:00+00:00", 48),  # rounded up to whole days
    ("2026-11-20T11:30:00+00:00", "2026-12-04T11:30:00+00:00", 336),  # 14 days
    ("2026-11-20T11:30:00+00:00", "2026-12-05T11:30:00+00:00", 504),  # 15 days: whole weeks from there on
    ("2026-01-01T00:00:00+00:00", "2027-01-01T00:00:00+00:00", 4368),  # at most 182 days
])
def test_a_blocks_duration_is_one_ec2_offers(start: str | None, end: str, hours: int) -> None:
    from infra.plan.pricing import block_hours

    assert block_hours(start, end) == hours


def test_block_offerings_that_cannot_price_it_are_an_error() -> None:
    from infra.plan.pricing import PriceError, block_query, parse_capacity_block_offerings

    query = block_query("us-east-1", "p5.48xlarge", 2, 24, ["us-east-1b"])
    offer = {"InstanceType": "p5.48xlarge", "InstanceCount": 2, "AvailabilityZone": "us-east-1c",
             "CapacityBlockDurationHours": 23, "CapacityBlockDurationMinutes": 30, "UpfrontFee": "1410.00",
             "CurrencyCode": "USD"}
    assert parse_capacity_block_offerings({"CapacityBlockOfferings": [offer]}, query) == 30.0  # another zone: a price
    for offers, why in (([], "no Capacity Block of 2 x p5.48xlarge for 24 h is offered"),
                        ([{**offer, "InstanceCount": 4}], "no Capacity Block of 2 x p5.48xlarge"),
                        ([{**offer, "CurrencyCode": "CNY"}], "an offering priced in CNY, not USD")):
        with pytest.raises(PriceError, match=why):
            parse_capacity_block_offerings({"CapacityBlockOfferings": offers}, query)


@settings(max_examples=80, deadline=None)
@given(capacity=st.sampled_from(["ON_DEMAND", "SPOT", "CAPACITY_BLOCK"]), reserved=st.booleans(),
       types=st.sampled_from([["p5.48xlarge"], ["p5.48xlarge", "p5e.48xlarge"]]),
       zones=st.sampled_from([[], ["us-east-1a"], ["us-east-1b"], ["us-east-1a", "us-east-1b"]]),
       max_size=st.integers(1, 6), count=st.integers(1, 6), preference=st.sampled_from(["targeted", "open"]))
def test_a_pool_that_parses_keeps_every_reservation_rule(capacity: str, reserved: bool, types: list[str],
                                                         zones: list[str], max_size: int, count: int,
                                                         preference: str) -> None:
    pool: dict[str, Any] = {"name": "r", "instanceTypes": types, "gpu": True, "capacityType": capacity,
                            "maxSize": max_size, "availabilityZones": zones}
    if reserved:
        pool["capacityReservation"] = {"id": "cr-0123456789abcdef0", "availabilityZone": "us-east-1a",
                                       "instanceCount": count, "preference": preference}
    try:
        cfg = parse(prod_values(pool))
    except ConfigError as exc:
        assert len(exc.lines()) == 1 and "nodePools[3]" in exc.lines()[0]
        return
    [parsed] = [p for p in cfg.node_pools if p.name == "r"]
    reservation = parsed.capacity_reservation
    assert (reservation is not None) == reserved and (capacity != "CAPACITY_BLOCK" or reserved)
    if reservation is not None:
        assert capacity != "SPOT" and len(types) == 1 and max_size <= count
        assert zones in ([], ["us-east-1a"]) and parsed.launch_zones(["us-east-1a", "us-east-1b"]) == ["us-east-1a"]
        assert capacity != "CAPACITY_BLOCK" or preference == "targeted"
