"""What a plan costs: $/hour and $/month of a stack at its pools' min, desired and max sizes, and per Job.

Pure functions over a plan document (scripts/plan.py --json) and a table of unit prices, so the same code prices a
plan offline, in CI (base against head) and against live AWS prices. Which prices a plan needs is a list of
`PriceQuery`s; each is answered by a response in the real AWS shape (pricing.get_products for list prices,
ec2.describe_spot_price_history for Spot), read by `parse_get_products` / `parse_spot_history` whether it came from
AWS or from the committed fixture (infra.plan.prices).

What is priced, and how:
- node groups: instances x the type's Linux on-demand hourly rate, or its Spot rate for SPOT pools, at each size;
- node volumes: the launch template's gp3 volumes (or the node group's diskSize) per node, at each size;
- NAT gateways and the EKS control plane: their hourly rate (data processed is usage, not priced);
- EFS: the sum of the PersistentVolumeClaims on EFS storage classes, all in Standard storage (an upper bound:
  lifecycle moves cold files to Infrequent Access);
- S3 buckets: the Standard storage rate per GiB-month only: a bucket declares no size, so it adds nothing to totals;
- Jobs: GPU-hours and the cost of the whole nodes they hold for activeDeadlineSeconds (the most a run can bill);
- tenant teams (a Kueue ClusterQueue admitting one namespace labelled `<prefix>/team`): their guaranteed GPUs
  (nominalQuota) and, where a borrowingLimit bounds it, the most they can hold, each GPU at its flavor's dearest
  pool's per-GPU rate, plus their EFS claims. This attributes the pools' cost for charge-back; it is not added to
  the totals (the pools are already there).
Prices are per GB (AWS bills GB-Mo for storage); declared sizes are in GiB, so storage is priced at GiB x 1.0737.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from typing import Any

from infra.config.support import eks_tier
from infra.plan.engine import offline_id

HOURS_PER_MONTH = 730  # AWS's own convention in its pricing pages and calculator
GB_PER_GIB = 1024**3 / 1000**3
SIZES = ("min", "desired", "max")

NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NAT_GATEWAY = "aws:ec2/natGateway:NatGateway"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
EFS_FILE_SYSTEM = "aws:efs/fileSystem:FileSystem"
BUCKET = "aws:s3/bucket:Bucket"
JOB = "kubernetes:batch/v1:Job"
PVC = "kubernetes:core/v1:PersistentVolumeClaim"
STORAGE_CLASS = "kubernetes:storage.k8s.io/v1:StorageClass"
EFS_PROVISIONER = "efs.csi.aws.com"
PV = "kubernetes:core/v1:PersistentVolume"
NAMESPACE = "kubernetes:core/v1:Namespace"
KUEUE_TYPE_PREFIX = "kubernetes:kueue.x-k8s.io/"
TEAM_LABEL_SUFFIX = "/team"
GPU_RESOURCE = "nvidia.com/gpu"
POOL_LABEL_SUFFIX = "/pool"
GPU_COUNT_LABEL_SUFFIX = "/gpu-count"


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


def eks_query(region: str) -> PriceQuery:
    return PriceQuery(key=f"eks:{region}", kind="list", service_code="AmazonEKS",
                      filters=(("regionCode", region), ("productFamily", "Compute")),
                      unit="Hrs", usagetype_suffix="AmazonEKS-Hours:perCluster")


def eks_extended_query(region: str) -> PriceQuery:
    """The control plane's rate while its Kubernetes minor is in extended support (instead of eks_query's)."""
    return PriceQuery(key=f"eks-extended:{region}", kind="list", service_code="AmazonEKS",
                      filters=(("regionCode", region), ("productFamily", "Compute")),
                      unit="Hrs", usagetype_suffix="AmazonEKS-Hours:extendedSupport")


def gp3_query(region: str) -> PriceQuery:
    return PriceQuery(key=f"gp3:{region}", kind="list", service_code="AmazonEC2",
                      filters=(("regionCode", region), ("productFamily", "Storage"), ("volumeApiName", "gp3")),
                      unit="GB-Mo", usagetype_suffix="EBS:VolumeUsage.gp3")


def efs_query(region: str) -> PriceQuery:
    return PriceQuery(key=f"efs:{region}", kind="list", service_code="AmazonEFS",
                      filters=(("regionCode", region), ("productFamily", "Storage"),
                               ("storageClass", "General Purpose")),
                      unit="GB-Mo", usagetype_suffix="TimedStorage-ByteHrs")


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


# --------------------------------------------------------------------------------------------- what a plan holds


@dataclass(frozen=True)
class Pool:
    name: str
    instance_type: str
    capacity_type: str  # ON_DEMAND or SPOT
    sizes: tuple[int, int, int]  # min, desired, max
    zones: tuple[str, ...]
    gpus_per_node: int
    labels: Mapping[str, str]
    disk_gib: float = 0.0  # gp3 GiB per node (root, and Bottlerocket's data volume)
    reserved: int = 0  # instances of a capacity reservation the pool launches into (stack output nodePools)
    reservation_id: str = ""
    reservation_hours: int = 24  # a Capacity Block's duration (block_hours of its startTime and endTime)


@dataclass(frozen=True)
class JobUse:
    name: str
    pods: int
    gpus_per_pod: int
    deadline_s: int | None
    node_selector: Mapping[str, str]


def _quantity_gib(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGTPE]i?)?", str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a storage quantity")
    number, unit = float(match.group(1)), match.group(2) or ""
    binary = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    decimal = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    return number * (binary.get(unit) or decimal.get(unit) or 1) / 2**30


def _of(plan: Mapping[str, Any], token: str) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if r["type"] == token]


def plan_region(plan: Mapping[str, Any]) -> str | None:
    region = (plan.get("outputs") or {}).get("region")
    return str(region) if region else None


def pools_of(plan: Mapping[str, Any]) -> list[Pool]:
    subnet_azs = (plan.get("outputs") or {}).get("subnetAzs") or {}
    reservations = {name: facts.get("reservation") or {} for name, facts in
                    ((plan.get("outputs") or {}).get("nodePools") or {}).items() if isinstance(facts, Mapping)}
    # A node group names its launch template by id; offline, that id is derived from the template's name.
    disks: dict[str, float] = {}
    for template in _of(plan, LAUNCH_TEMPLATE):
        disks[offline_id(LAUNCH_TEMPLATE, template["name"])] = float(sum(
            float((m.get("ebs") or {}).get("volumeSize") or 0) for m in template["inputs"].get("blockDeviceMappings")
            or [] if (m.get("ebs") or {}).get("volumeType") == "gp3"))
    pools = []
    for resource in _of(plan, NODE_GROUP):
        inputs = resource["inputs"]
        labels = inputs.get("labels") or {}
        scaling = inputs.get("scalingConfig") or {}
        low, high = int(scaling.get("minSize") or 0), int(scaling.get("maxSize") or 0)
        desired = scaling.get("desiredSize")
        name = next((v for k, v in labels.items() if k.endswith(POOL_LABEL_SUFFIX)), resource["name"])
        gpus = next((int(v) for k, v in labels.items() if k.endswith(GPU_COUNT_LABEL_SUFFIX)), 0)
        for instance_type in (inputs.get("instanceTypes") or [])[:1]:  # the first type is what EKS launches first
            pools.append(Pool(name=str(name), instance_type=str(instance_type),
                              capacity_type=str(inputs.get("capacityType") or "ON_DEMAND"),
                              sizes=(low, int(desired) if desired is not None else low, high),
                              zones=tuple(sorted({str(subnet_azs[s]) for s in inputs.get("subnetIds") or []
                                                  if s in subnet_azs})),
                              gpus_per_node=gpus, labels=labels,
                              disk_gib=disks.get(str((inputs.get("launchTemplate") or {}).get("id")),
                                                 float(inputs.get("diskSize") or 0)),
                              reserved=int((reservations.get(str(name)) or {}).get("instanceCount") or 0),
                              reservation_id=str((reservations.get(str(name)) or {}).get("id") or ""),
                              reservation_hours=block_hours((reservations.get(str(name)) or {}).get("startTime"),
                                                            (reservations.get(str(name)) or {}).get("endTime"))))
    return sorted(pools, key=lambda pool: pool.name)


def jobs_of(plan: Mapping[str, Any]) -> list[JobUse]:
    jobs = []
    for resource in _of(plan, JOB):
        spec = resource["inputs"].get("spec") or {}
        pod = (spec.get("template") or {}).get("spec") or {}
        gpus = sum(int(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
                   for c in pod.get("containers") or [])
        metadata = resource["inputs"].get("metadata") or {}
        name = (metadata.get("labels") or {}).get("app.kubernetes.io/name") or metadata.get("name") or resource["name"]
        deadline = spec.get("activeDeadlineSeconds")
        jobs.append(JobUse(name=str(name), pods=int(spec.get("parallelism") or 1), gpus_per_pod=gpus,
                           deadline_s=int(deadline) if deadline is not None else None,
                           node_selector=pod.get("nodeSelector") or {}))
    return sorted(jobs, key=lambda job: job.name)


def efs_claims(plan: Mapping[str, Any]) -> list[tuple[str, float]]:
    """(namespace, GiB) of each PersistentVolumeClaim on EFS: of an EFS storage class of this plan, or bound to a
    static PV of the EFS CSI driver (a team's access point)."""
    classes = {(r["inputs"].get("metadata") or {}).get("name") for r in _of(plan, STORAGE_CLASS)
               if r["inputs"].get("provisioner") == EFS_PROVISIONER}
    efs_volumes = {(r["inputs"].get("metadata") or {}).get("name") for r in _of(plan, PV)
                   if ((r["inputs"].get("spec") or {}).get("csi") or {}).get("driver") == EFS_PROVISIONER}
    claims = []
    for claim in _of(plan, PVC):
        spec = claim["inputs"].get("spec") or {}
        if spec.get("storageClassName") in classes or (spec.get("volumeName") and spec["volumeName"] in efs_volumes):
            claims.append((str((claim["inputs"].get("metadata") or {}).get("namespace") or ""),
                           _quantity_gib(((spec.get("resources") or {}).get("requests") or {}).get("storage", "0"))))
    return claims


def efs_gib(plan: Mapping[str, Any]) -> float:
    """GiB requested by the PersistentVolumeClaims on EFS."""
    return sum(gib for _, gib in efs_claims(plan))


@dataclass(frozen=True)
class TeamQuota:
    """A tenant team's GPUs of one flavor: guaranteed (nominalQuota) and the most it may hold (None: no
    borrowingLimit, as much as the cohort lends)."""

    team: str
    namespace: str
    flavor: str
    gpus: int
    at_most: int | None


def _kueue(plan: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if r["type"].startswith(KUEUE_TYPE_PREFIX) and r["type"].endswith(f":{kind}")]


def team_namespaces_of(plan: Mapping[str, Any]) -> dict[str, str]:
    """Namespace -> team, for the namespaces labelled `<prefix>/team`."""
    found = {}
    for namespace in _of(plan, NAMESPACE):
        metadata = namespace["inputs"].get("metadata") or {}
        team = next((v for k, v in (metadata.get("labels") or {}).items() if k.endswith(TEAM_LABEL_SUFFIX)), None)
        if team and metadata.get("name"):
            found[str(metadata["name"])] = str(team)
    return found


def team_quotas_of(plan: Mapping[str, Any]) -> list[TeamQuota]:
    """The GPU quotas of the ClusterQueues that admit exactly one team namespace (flavors with a guarantee)."""
    teams = team_namespaces_of(plan)
    quotas = []
    for queue in _kueue(plan, "ClusterQueue"):
        spec = queue["inputs"].get("spec") or {}
        selector = (spec.get("namespaceSelector") or {}).get("matchLabels") or {}
        namespace = selector.get("kubernetes.io/metadata.name")
        if namespace not in teams:
            continue
        for group in spec.get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for resource in flavor.get("resources") or []:
                    if resource.get("name") != GPU_RESOURCE or not int(resource.get("nominalQuota") or 0):
                        continue
                    gpus = int(resource["nominalQuota"])
                    borrow = resource.get("borrowingLimit")
                    quotas.append(TeamQuota(teams[namespace], str(namespace), str(flavor.get("name")), gpus,
                                            gpus + int(borrow) if borrow is not None else None))
    return sorted(quotas, key=lambda quota: (quota.team, quota.flavor))


def flavor_pools(plan: Mapping[str, Any], pools: Sequence[Pool]) -> dict[str, list[Pool]]:
    """ResourceFlavor name -> the GPU pools whose labels carry all its nodeLabels."""
    found = {}
    for flavor in _kueue(plan, "ResourceFlavor"):
        labels = (flavor["inputs"].get("spec") or {}).get("nodeLabels") or {}
        name = (flavor["inputs"].get("metadata") or {}).get("name")
        if labels and name:
            found[str(name)] = [pool for pool in pools if pool.gpus_per_node
                                and all(pool.labels.get(k) == v for k, v in labels.items())]
    return found


def pool_query(region: str, pool: Pool) -> PriceQuery:
    """A pool's instances cost the type's Spot price for SPOT pools, a Capacity Block's offering price per
    instance-hour for blocks, its on-demand list price otherwise."""
    if pool.capacity_type == "SPOT":
        return spot_query(region, pool.instance_type, pool.zones)
    if pool.capacity_type == "CAPACITY_BLOCK":
        return block_query(region, pool.instance_type, pool.reserved, pool.reservation_hours, pool.zones)
    return instance_query(region, pool.instance_type)


def price_queries(plan: Mapping[str, Any]) -> list[PriceQuery]:
    """Every unit price the plan needs, each once, in a fixed order."""
    region = plan_region(plan)
    if region is None:
        return []
    queries: dict[str, PriceQuery] = {}
    for pool in pools_of(plan):
        query = pool_query(region, pool)
        if query.key in queries and query.kind == "spot":  # two Spot pools of one type: every zone of both
            query = spot_query(region, pool.instance_type, queries[query.key].zones + query.zones)
        queries[query.key] = query
    if any(pool.disk_gib for pool in pools_of(plan)):
        queries.setdefault(f"gp3:{region}", gp3_query(region))
    if _of(plan, NAT_GATEWAY):
        queries.setdefault(f"nat:{region}", nat_query(region))
    if _of(plan, EKS_CLUSTER):  # both tiers: which one applies depends on the day the estimate is made
        queries.setdefault(f"eks:{region}", eks_query(region))
        queries.setdefault(f"eks-extended:{region}", eks_extended_query(region))
    if _of(plan, EFS_FILE_SYSTEM):
        queries.setdefault(f"efs:{region}", efs_query(region))
    if _of(plan, BUCKET):
        queries.setdefault(f"s3:{region}", s3_query(region))
    return list(queries.values())


# --------------------------------------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class CostLine:
    """One priced thing. `hourly` is USD/hour at min, desired and max; storage lines have a monthly rate and
    their hourly share. `per_gib_month` lines (buckets) carry a rate only and add nothing to the totals."""

    item: str
    detail: str
    unit_price: float
    unit: str
    hourly: tuple[float, float, float]
    per_gib_month: bool = False


@dataclass(frozen=True)
class JobCost:
    name: str
    pool: str | None
    nodes: int
    gpus: int
    hours: float | None
    gpu_hours: float | None
    node_hour_price: float | None
    cost: float | None
    note: str = ""


@dataclass(frozen=True)
class TeamCost:
    """A tenant team's share for charge-back: per flavor line, the GPUs' hourly rate at quota (and at most)."""

    team: str
    namespace: str
    flavor: str  # "" for the team's EFS line
    gpus: int
    at_most: int | None
    gpu_hour_price: float  # USD per GPU-hour of the flavor (its dearest pool); per GB-month for EFS
    hourly: float  # at the guaranteed quota (EFS: its monthly cost / 730)
    hourly_at_most: float | None
    efs_gib: float = 0.0
    note: str = ""


@dataclass
class CostReport:
    stack: str
    region: str | None
    source: str
    lines: list[CostLine] = field(default_factory=list)
    jobs: list[JobCost] = field(default_factory=list)
    teams: list[TeamCost] = field(default_factory=list)
    note: str = ""

    def team_monthly(self) -> dict[str, float]:
        """Team -> USD per month at its guaranteed quota, EFS included."""
        totals: dict[str, float] = {}
        for line in self.teams:
            totals[line.team] = round(totals.get(line.team, 0.0) + line.hourly * HOURS_PER_MONTH, 2)
        return totals

    def hourly(self) -> tuple[float, float, float]:
        totals = [0.0, 0.0, 0.0]
        for line in self.lines:
            if not line.per_gib_month:
                for i in range(3):
                    totals[i] += line.hourly[i]
        return (round(totals[0], 6), round(totals[1], 6), round(totals[2], 6))

    def monthly(self) -> tuple[float, float, float]:
        low, mid, high = self.hourly()
        return (round(low * HOURS_PER_MONTH, 2), round(mid * HOURS_PER_MONTH, 2), round(high * HOURS_PER_MONTH, 2))


def estimate(plan: Mapping[str, Any], prices: Mapping[str, float], source: str, today: date) -> CostReport:
    """Price a plan with `prices` (PriceQuery.key -> USD per unit) on `today` (an EKS control plane whose minor is in
    extended support that day bills at the extended rate). Raises PriceError for a price it lacks."""
    region = plan_region(plan)
    report = CostReport(stack=str(plan.get("stack", "")), region=region, source=source)
    if region is None:
        report.note = "not priced: no AWS region (existing nodes and storage are not billed by this stack)"
        return report

    def price(query: PriceQuery) -> float:
        if query.key not in prices:
            raise PriceError(source, f"no price for {query.key}")
        return prices[query.key]

    by_key = {query.key: query for query in price_queries(plan)}
    pools = pools_of(plan)
    for pool in pools:
        counts = "/".join(map(str, pool.sizes))
        rate = price(by_key[pool_query(region, pool).key])
        if pool.capacity_type == "CAPACITY_BLOCK":
            # Paid up front for every reserved instance and hour, whatever runs: the same at every size.
            report.lines.append(CostLine(
                item=f"node pool {pool.name}",
                detail=f"{pool.instance_type} Capacity Block {pool.reservation_id}: {pool.reserved} reserved for "
                       f"{pool.reservation_hours} h, prepaid (an offered block's upfront fee per instance-hour; "
                       f"{counts} running)",
                unit_price=rate, unit="hour", hourly=(rate * pool.reserved,) * 3))
            continue
        spot = pool.capacity_type == "SPOT"
        report.lines.append(CostLine(
            item=f"node pool {pool.name}",
            detail=f"{pool.instance_type} {'spot' if spot else 'on-demand'} x {counts}",
            unit_price=rate, unit="hour", hourly=(rate * pool.sizes[0], rate * pool.sizes[1], rate * pool.sizes[2])))
        if pool.reserved:  # an On-Demand Capacity Reservation bills every reserved instance, running or not
            idle = tuple(max(pool.reserved - size, 0) for size in pool.sizes)
            report.lines.append(CostLine(
                item=f"idle reservation {pool.name}",
                detail=f"{pool.reservation_id}: {pool.reserved} x {pool.instance_type} reserved, "
                       f"{'/'.join(map(str, idle))} idle, billed on-demand",
                unit_price=rate, unit="hour", hourly=(rate * idle[0], rate * idle[1], rate * idle[2])))
    with_disks = [pool for pool in pools if pool.disk_gib]
    if with_disks:
        rate = price(gp3_query(region))
        per_node = [pool.disk_gib * GB_PER_GIB * rate / HOURS_PER_MONTH for pool in with_disks]
        hourly = tuple(sum(cost * pool.sizes[i] for cost, pool in zip(per_node, with_disks, strict=True))
                       for i in range(3))
        sizes = sorted({pool.disk_gib for pool in with_disks})
        detail = f"gp3, {'/'.join(f'{size:g}' for size in sizes)} GiB per node"
        report.lines.append(CostLine("node volumes", detail, rate, "GB-month", (hourly[0], hourly[1], hourly[2])))
    nats = len(_of(plan, NAT_GATEWAY))
    if nats:
        rate = price(nat_query(region))
        report.lines.append(CostLine("NAT gateways", f"{nats} x hourly (data processed not included)", rate, "hour",
                                     (rate * nats,) * 3))
    for cluster in _of(plan, EKS_CLUSTER):  # one per stack
        version = str(cluster["inputs"].get("version") or "")
        extended = eks_tier(version, today) in ("extended", "ended")
        rate = price(eks_extended_query(region) if extended else eks_query(region))
        tier = f"extended support on {today}" if extended else "standard support"
        report.lines.append(CostLine("EKS control plane", f"Kubernetes {version}, {tier}", rate, "hour",
                                     (rate,) * 3))
    if _of(plan, EFS_FILE_SYSTEM):
        rate, gib = price(efs_query(region)), efs_gib(plan)
        efs_hourly = rate * gib * GB_PER_GIB / HOURS_PER_MONTH
        report.lines.append(CostLine("EFS storage", f"{gib:g} GiB claimed, Standard", rate, "GB-month",
                                     (efs_hourly, efs_hourly, efs_hourly)))
    buckets = _of(plan, BUCKET)
    if buckets:
        rate = price(s3_query(region))
        report.lines.append(CostLine("S3 buckets", f"{len(buckets)} bucket(s), Standard; no declared size", rate,
                                     "GB-month", (0.0, 0.0, 0.0), per_gib_month=True))
    report.jobs = [_job_cost(job, pools, lambda pool: price(by_key[pool_query(region, pool).key]))
                   for job in jobs_of(plan)]
    report.teams = _team_costs(plan, pools, lambda pool: price(by_key[pool_query(region, pool).key]),
                               price(efs_query(region)) if _of(plan, EFS_FILE_SYSTEM) else None)
    return report


def _team_costs(plan: Mapping[str, Any], pools: Sequence[Pool], rate_of: Callable[[Pool], float],
                efs_rate: float | None) -> list[TeamCost]:
    by_flavor = flavor_pools(plan, pools)
    lines = []
    for quota in team_quotas_of(plan):
        candidates = by_flavor.get(quota.flavor, [])  # Capacity Blocks too: priced per instance-hour
        if not candidates:
            lines.append(TeamCost(quota.team, quota.namespace, quota.flavor, quota.gpus, quota.at_most, 0.0, 0.0,
                                  None, note="no node pool of this flavor"))
            continue
        per_gpu = max(rate_of(pool) / pool.gpus_per_node for pool in candidates)
        lines.append(TeamCost(quota.team, quota.namespace, quota.flavor, quota.gpus, quota.at_most, per_gpu,
                              per_gpu * quota.gpus, per_gpu * quota.at_most if quota.at_most is not None else None,
                              note="" if quota.at_most is not None else "may borrow without limit"))
    teams = team_namespaces_of(plan)
    if efs_rate is not None:
        claimed: dict[str, float] = {}
        for namespace, gib in efs_claims(plan):
            if namespace in teams:
                claimed[namespace] = claimed.get(namespace, 0.0) + gib
        for namespace, gib in sorted(claimed.items()):
            hourly = efs_rate * gib * GB_PER_GIB / HOURS_PER_MONTH
            lines.append(TeamCost(teams[namespace], namespace, "", 0, None, efs_rate, hourly, hourly, efs_gib=gib))
    return sorted(lines, key=lambda line: (line.team, line.flavor == "", line.flavor))


def _job_cost(job: JobUse, pools: Sequence[Pool], rate_of: Callable[[Pool], float]) -> JobCost:
    """A Job holds whole nodes: ceil(GPUs per pod / GPUs per node) per pod, for at most activeDeadlineSeconds."""
    matching = [pool for pool in pools if job.node_selector
                and all(pool.labels.get(k) == v for k, v in job.node_selector.items())]
    gpus = job.pods * job.gpus_per_pod
    hours = job.deadline_s / 3600 if job.deadline_s is not None else None
    gpu_hours = gpus * hours if hours is not None else None
    if not matching:
        return JobCost(job.name, None, 0, gpus, hours, gpu_hours, None, None, "no node pool matches its nodeSelector")
    pool = matching[0]
    per_pod = math.ceil(job.gpus_per_pod / pool.gpus_per_node) if pool.gpus_per_node and job.gpus_per_pod else 1
    nodes = job.pods * per_pod
    rate = rate_of(pool) * nodes
    cost = rate * hours if hours is not None else None
    return JobCost(job.name, pool.name, nodes, gpus, hours, gpu_hours, rate, cost,
                   "" if hours is not None else "no activeDeadlineSeconds: runs until it ends")


# --------------------------------------------------------------------------------------------- text


def report_document(report: CostReport) -> dict[str, Any]:
    """The estimate as JSON-ready data (scripts/plan.py --cost --json): every line and Job, and the totals."""
    return {"stack": report.stack, "region": report.region, "source": report.source, "note": report.note,
            "hoursPerMonth": HOURS_PER_MONTH, "sizes": list(SIZES),
            "hourly": list(report.hourly()), "monthly": list(report.monthly()),
            "lines": [asdict(line) for line in report.lines], "jobs": [asdict(job) for job in report.jobs],
            "teams": [asdict(team) for team in report.teams], "teamMonthly": report.team_monthly()}


def _money(value: float) -> str:
    return f"${value:,.2f}" if value >= 0.01 or value == 0 else f"${value:,.4f}"


def format_report(report: CostReport) -> str:
    """The estimate as a fixed-width table (same input, same bytes)."""
    lines = [f"cost of stack {report.stack} ({report.region or 'no region'}), {report.source}"]
    if report.note:
        return "\n".join([*lines, report.note]) + "\n"
    header = f"  {'item':<26} {'detail':<44} {'unit price':>17} {'$/h min':>12} {'$/h desired':>12} {'$/h max':>12}"
    lines += ["", header]
    for line in report.lines:
        unit_price = f"${line.unit_price:.4f}/{'GB-month' if line.per_gib_month else line.unit}"
        cells = ("per GB", "per GB", "per GB") if line.per_gib_month else tuple(_money(h) for h in line.hourly)
        lines.append(f"  {line.item:<26} {line.detail:<44} {unit_price:>17} {cells[0]:>12} {cells[1]:>12} "
                     f"{cells[2]:>12}")
    hourly, monthly = report.hourly(), report.monthly()
    lines.append(f"  {'total per hour':<71} {'':>17} {_money(hourly[0]):>12} {_money(hourly[1]):>12} "
                 f"{_money(hourly[2]):>12}")
    lines.append(f"  {'total per month (730 h)':<71} {'':>17} {_money(monthly[0]):>12} {_money(monthly[1]):>12} "
                 f"{_money(monthly[2]):>12}")
    if report.jobs:
        lines += ["", f"  {'job':<24} {'pool':<14} {'nodes':>5} {'GPUs':>5} {'deadline h':>10} {'GPU-hours':>10} "
                      f"{'$/h':>10} {'cost at deadline':>17}"]
        for job in report.jobs:
            hours = f"{job.hours:g}" if job.hours is not None else "none"
            gpu_hours = f"{job.gpu_hours:g}" if job.gpu_hours is not None else "-"
            rate = _money(job.node_hour_price) if job.node_hour_price is not None else "-"
            cost = _money(job.cost) if job.cost is not None else "-"
            lines.append(f"  {job.name:<24} {job.pool or '-':<14} {job.nodes:>5} {job.gpus:>5} {hours:>10} "
                         f"{gpu_hours:>10} {rate:>10} {cost:>17}" + (f"  ({job.note})" if job.note else ""))
    if report.teams:
        lines += ["", "  teams at their Kueue quota (charge-back; already in the pools above, not added to totals)",
                  f"  {'team':<16} {'flavor / storage':<18} {'GPUs':>5} {'at most':>7} {'unit price':>17} "
                  f"{'$/h quota':>12} {'$/h at most':>12} {'$/month quota':>14}"]
        for team in report.teams:
            if team.flavor:
                what, gpus = team.flavor, str(team.gpus)
                at_most = str(team.at_most) if team.at_most is not None else "-"
                unit = f"${team.gpu_hour_price:.4f}/GPU-h"
                most = _money(team.hourly_at_most) if team.hourly_at_most is not None else "-"
            else:
                what, gpus, at_most = f"EFS {team.efs_gib:g} GiB", "", ""
                unit, most = f"${team.gpu_hour_price:.4f}/GB-month", _money(team.hourly)
            lines.append(f"  {team.team:<16} {what:<18} {gpus:>5} {at_most:>7} {unit:>17} {_money(team.hourly):>12} "
                         f"{most:>12} {_money(team.hourly * HOURS_PER_MONTH):>14}"
                         + (f"  ({team.note})" if team.note else ""))
        for name, team_total in sorted(report.team_monthly().items()):
            lines.append(f"  {'total ' + name:<35} {'':>5} {'':>7} {'':>17} {'':>12} {'':>12} "
                         f"{_money(team_total):>14}")
    return "\n".join(lines) + "\n"


def format_cost_diff(old: CostReport, new: CostReport) -> str:
    """Monthly totals before and after, and each line whose cost changed (as Infracost's diff shows it)."""
    lines = [f"cost of stack {new.stack}, {new.source}: per month at min / desired / max"]
    before, after = old.monthly(), new.monthly()
    lines.append("  base  " + " / ".join(_money(v) for v in before))
    lines.append("  head  " + " / ".join(_money(v) for v in after))
    lines.append("  diff  " + " / ".join(("+" if a - b >= 0 else "-") + _money(abs(a - b))
                                         for b, a in zip(before, after, strict=True)))
    old_lines = {line.item: line for line in old.lines}
    new_lines = {line.item: line for line in new.lines}
    for item in sorted(old_lines.keys() | new_lines.keys()):
        was, now = old_lines.get(item), new_lines.get(item)
        if was is not None and now is not None and (was.hourly, was.detail) == (now.hourly, now.detail):
            continue
        mark = "+" if was is None else "-" if now is None else "~"
        def show(line: CostLine | None) -> str:
            if line is None:
                return "(none)"
            return f"{line.detail}: " + " / ".join(_money(h * HOURS_PER_MONTH) for h in line.hourly) + " per month"
        lines.append(f"{mark} {item}: {show(was)} -> {show(now)}")  # the mark first: ```diff colours it
    old_jobs = {job.name: job for job in old.jobs}
    new_jobs = {job.name: job for job in new.jobs}
    for name in sorted(old_jobs.keys() | new_jobs.keys()):
        before_job, after_job = old_jobs.get(name), new_jobs.get(name)
        if before_job == after_job:
            continue
        mark = "+" if before_job is None else "-" if after_job is None else "~"

        def at_deadline(job: JobCost | None) -> str:
            if job is None:
                return "(none)"
            if job.cost is None:
                return f"{job.gpus} GPUs, no deadline"
            return f"{job.gpu_hours:g} GPU-hours, {_money(job.cost)}"
        lines.append(f"{mark} job {name} at its deadline: {at_deadline(before_job)} -> {at_deadline(after_job)}")
    if len(lines) == 4 and before == after:
        lines.append("  no cost change")
    return "\n".join(lines) + "\n"
