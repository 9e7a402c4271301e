"""The unit prices a cost estimate needs, as questions and answers in AWS's own shapes: a `PriceQuery` per price,
the request that asks it (pricing.get_products for list prices, ec2.describe_spot_price_history for Spot,
ec2.describe_capacity_block_offerings for Capacity Blocks), and the parsers that read a response, whether it came
from AWS or from the committed fixture (infra/plan/prices.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any


class PriceError(ValueError):
    """A price that cannot be found or read; `where` names the source (fixture file, API)."""

    def __init__(self, where: str, why: str):
        self.where, self.why = where, why
        super().__init__(f"{where}: {why}")


@dataclass(frozen=True)
class PriceQuery:
    """One unit price a plan needs. `kind` is `list` (pricing.get_products) or `spot`
    (ec2.describe_spot_price_history). For list prices, `filters` are TERM_MATCH filters and `usagetype_suffix`
    picks the product among those that match (the usage type carries a region prefix such as USE2-, which the
    region code already pins, so a suffix is the account- and region-independent part)."""

    key: str
    kind: str
    service_code: str
    filters: tuple[tuple[str, str], ...]
    unit: str
    usagetype_suffix: str = ""
    region: str = ""
    instance_type: str = ""
    zones: tuple[str, ...] = ()
    instance_count: int = 0  # capacity-block: the block's instances
    hours: int = 0  # capacity-block: its duration


def instance_query(region: str, instance_type: str) -> PriceQuery:
    return PriceQuery(
        key=f"ec2:{region}:{instance_type}:on-demand", kind="list", service_code="AmazonEC2",
        filters=(("regionCode", region), ("instanceType", instance_type), ("operatingSystem", "Linux"),
                 ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("capacitystatus", "Used"),
                 ("licenseModel", "No License required")),
        unit="Hrs")


def spot_query(region: str, instance_type: str, zones: Sequence[str]) -> PriceQuery:
    return PriceQuery(key=f"ec2:{region}:{instance_type}:spot", kind="spot", service_code="AmazonEC2", filters=(),
                      unit="Hrs", region=region, instance_type=instance_type, zones=tuple(sorted(set(zones))))


def block_query(region: str, instance_type: str, instance_count: int, hours: int, zones: Sequence[str]) -> PriceQuery:
    """A Capacity Block's price per instance-hour: what EC2 offers now for a block of this type, count and duration
    (ec2.describe_capacity_block_offerings; an existing block's purchase price is in no API: the CapacityBlock and
    CapacityReservation shapes carry no fee, botocore 1.44.8 data/ec2/2016-11-15/service-2.json:13702 and :14493)."""
    return PriceQuery(key=f"capacity-block:{region}:{instance_type}:{instance_count}x{hours}h", kind="capacity-block",
                      service_code="AmazonEC2", filters=(), unit="Hrs", region=region, instance_type=instance_type,
                      zones=tuple(sorted(set(zones))), instance_count=instance_count, hours=hours)


def block_hours(start: str | None, end: str | None) -> int:
    """A block's duration as DescribeCapacityBlockOfferings takes it (CapacityDurationHours: whole days up to 14,
    then whole weeks up to 182 days; service-2.json:27344): the configured start to end, rounded up to the next
    valid duration; one day when either is unknown."""
    if not start or not end:
        return 24
    hours = math.ceil((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() / 3600)
    days = max(math.ceil(hours / 24), 1)
    return 24 * (days if days <= 14 else min(math.ceil(days / 7) * 7, 182))


def nat_query(region: str) -> PriceQuery:
    return PriceQuery(key=f"nat:{region}", kind="list", service_code="AmazonEC2",
                      filters=(("regionCode", region), ("productFamily", "NAT Gateway")),
                      unit="Hrs", usagetype_suffix="NatGateway-Hours")


def eks_query(region: str, extended: bool = False) -> PriceQuery:
    """The control plane's hourly rate: standard support, or (`extended`) while its minor is in extended support."""
    return PriceQuery(key=f"eks-extended:{region}" if extended else f"eks:{region}", kind="list",
                      service_code="AmazonEKS", filters=(("regionCode", region), ("productFamily", "Compute")),
                      unit="Hrs",
                      usagetype_suffix="AmazonEKS-Hours:extendedSupport" if extended else "AmazonEKS-Hours:perCluster")


def eks_extended_query(region: str) -> PriceQuery:
    return eks_query(region, extended=True)


def gp3_query(region: str) -> PriceQuery:
    return PriceQuery(key=f"gp3:{region}", kind="list", service_code="AmazonEC2",
                      filters=(("regionCode", region), ("productFamily", "Storage"), ("volumeApiName", "gp3")),
                      unit="GB-Mo", usagetype_suffix="EBS:VolumeUsage.gp3")


def efs_query(region: str) -> PriceQuery:
    return PriceQuery(key=f"efs:{region}", kind="list", service_code="AmazonEFS",
                      filters=(("regionCode", region), ("productFamily", "Storage"),
                               ("storageClass", "General Purpose")),
                      unit="GB-Mo", usagetype_suffix="TimedStorage-ByteHrs")


def fsx_lustre_query(region: str, throughput: int) -> PriceQuery:
    """FSx for Lustre PERSISTENT_2 SSD storage at one throughput tier (MB/s/TiB): USD per GB-month of capacity.

    The attribute names are AmazonFSx's as AWS's Price List carries them (fileSystemType, storageType,
    throughputCapacity, productFamily Storage: those infracost's FSx for Windows query filters on,
    infracost/infracost internal/resources/aws/fsx_windows_file_system.go). PERSISTENT_1 and PERSISTENT_2 share
    deploymentOption "Persistent" in the Price List, as far as the public readers of it show; their throughput
    tiers do not overlap (50/100/200 against 125/250/500/1000), so the tier alone picks PERSISTENT_2, and the usage
    type (<region>-Storage.SSD.<tier>, the PERSISTENT_1 pattern AWS's offer file shows) picks the storage product.
    Not checked against the live API from here: a mismatch is a PriceError naming this query."""
    return PriceQuery(key=f"fsx-lustre:{region}:persistent-2:{throughput}", kind="list", service_code="AmazonFSx",
                      filters=(("regionCode", region), ("productFamily", "Storage"), ("fileSystemType", "Lustre"),
                               ("storageType", "SSD"), ("throughputCapacity", str(throughput))),
                      unit="GB-Mo", usagetype_suffix=f"Storage.SSD.{throughput}")


def s3_query(region: str) -> PriceQuery:
    return PriceQuery(key=f"s3:{region}", kind="list", service_code="AmazonS3",
                      filters=(("regionCode", region), ("productFamily", "Storage"), ("volumeType", "Standard")),
                      unit="GB-Mo", usagetype_suffix="TimedStorage-ByteHrs")


def get_products_request(query: PriceQuery) -> dict[str, Any]:
    """The boto3 `pricing.get_products` arguments for a list-price query (also the offline fixture's key)."""
    return {"ServiceCode": query.service_code, "FormatVersion": "aws_v1",
            "Filters": [{"Type": "TERM_MATCH", "Field": name, "Value": value} for name, value in query.filters]}


def spot_history_request(query: PriceQuery) -> dict[str, Any]:
    """The boto3 `ec2.describe_spot_price_history` arguments, without StartTime (the caller adds "now", which asks
    for the current price in each zone; the fixture's key leaves it out so it never goes stale)."""
    return {"InstanceTypes": [query.instance_type], "ProductDescriptions": ["Linux/UNIX"]}


def capacity_block_request(query: PriceQuery) -> dict[str, Any]:
    """The boto3 `ec2.describe_capacity_block_offerings` arguments (service-2.json:27320-27372; also the fixture's
    key)."""
    return {"InstanceType": query.instance_type, "InstanceCount": query.instance_count,
            "CapacityDurationHours": query.hours}


def parse_capacity_block_offerings(response: Mapping[str, Any], query: PriceQuery) -> float:
    """USD per instance-hour from a describe_capacity_block_offerings response (CapacityBlockOffering,
    service-2.json:13962-14035): the cheapest offering of the query's type and count, in its zone when one is
    offered there, UpfrontFee / (InstanceCount x (CapacityBlockDurationHours + CapacityBlockDurationMinutes / 60))."""
    offers = [offer for offer in response.get("CapacityBlockOfferings") or []
              if offer.get("InstanceType") == query.instance_type
              and int(offer.get("InstanceCount") or 0) == query.instance_count]
    if not offers:
        raise PriceError(query.key, f"no Capacity Block of {query.instance_count} x {query.instance_type} for "
                                    f"{query.hours} h is offered")
    in_zone = [offer for offer in offers if offer.get("AvailabilityZone") in query.zones]
    rates = []
    for offer in in_zone or offers:
        if offer.get("CurrencyCode") != "USD":
            raise PriceError(query.key, f"an offering priced in {offer.get('CurrencyCode')}, not USD")
        hours = int(offer.get("CapacityBlockDurationHours") or 0) + int(offer.get("CapacityBlockDurationMinutes")
                                                                         or 0) / 60
        if hours <= 0:
            raise PriceError(query.key, f"offering {offer.get('CapacityBlockOfferingId')} has no duration")
        rates.append(float(offer["UpfrontFee"]) / (query.instance_count * hours))
    return min(rates)


def parse_get_products(response: Mapping[str, Any], query: PriceQuery) -> float:
    """USD per `query.unit` from a get_products response: the first tier (beginRange 0) of the OnDemand term of the
    product whose usage type ends with the query's suffix. Raises PriceError when there is none or several."""
    prices: set[float] = set()
    for raw in response.get("PriceList") or []:
        item = json.loads(raw) if isinstance(raw, str) else raw
        attributes = (item.get("product") or {}).get("attributes") or {}
        if query.usagetype_suffix and not str(attributes.get("usagetype", "")).endswith(query.usagetype_suffix):
            continue
        for term in ((item.get("terms") or {}).get("OnDemand") or {}).values():
            for dimension in (term.get("priceDimensions") or {}).values():
                if dimension.get("unit") == query.unit and str(dimension.get("beginRange", "0")) == "0":
                    prices.add(float(dimension["pricePerUnit"]["USD"]))
    if not prices:
        raise PriceError(query.key, f"no {query.unit} on-demand price in the get_products response")
    if len(prices) > 1:  # a filter too loose to name one product: refuse rather than guess
        raise PriceError(query.key, f"{len(prices)} different prices match: {sorted(prices)}")
    return prices.pop()


def parse_spot_history(response: Mapping[str, Any], query: PriceQuery) -> float:
    """USD per hour from a describe_spot_price_history response: the newest price in each of the query's zones,
    then the highest of those (the autoscaler may start a node in any of the pool's zones)."""
    latest: dict[str, tuple[str, float]] = {}
    for entry in response.get("SpotPriceHistory") or []:
        zone = str(entry.get("AvailabilityZone", ""))
        if entry.get("InstanceType") != query.instance_type or (query.zones and zone not in query.zones):
            continue
        stamp = str(entry.get("Timestamp", ""))
        if zone not in latest or stamp > latest[zone][0]:
            latest[zone] = (stamp, float(entry["SpotPrice"]))
    if not latest:
        zones = ", ".join(query.zones) or "any zone"
        raise PriceError(query.key, f"no Spot price for {query.instance_type} in {zones}")
    return max(price for _, price in latest.values())
