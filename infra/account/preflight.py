"""Preflight: what a fresh AWS account must offer before `pulumi up` of a stack can succeed, asked with boto3.

Each check is a function of the parsed stack config and AWS clients, returning `Check`s (PASS / WARN / FAIL, what was
found, and for a FAIL the fix). They read only (Describe*/Get*/Head* calls), so they are safe to run from the deploy
workflow with the deploy role before `pulumi up`, and on a workstation with any read-only credentials.

Checks, in order: the credentials (sts:GetCallerIdentity) and the account the stack file's access entries name; the
region is enabled; the stack's availability zones (or adopted subnets) exist; every node pool instance type is
offered in every zone it may launch in; the EC2 vCPU quotas of the pools' families cover the pools at max size; the
Kubernetes version is offered by EKS; the stack's bucket names are free or already ours; the stack's ECR repository
is free or already this stack's. On a stack laid onto an existing EKS cluster (cluster.existing), infra/account/
existing.py checks the cluster, its add-ons and node groups, the Helm releases on it (through its Kubernetes API,
with an EKS token made from the same credentials) and whether SageMaker HyperPod orchestrates it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from infra.account.checks import AWS_ERRORS, FAIL, PASS, WARN, Check
from infra.account.checks import aws_error as _error
from infra.account.existing import KubeFor, check_existing_cluster
from infra.account.kubeapi import KubeApi, eks_token
from infra.account.preflight_fsx import fsx_rows
from infra.config.names import derived_names
from infra.config.schema import StackConfig
from infra.plan.pricing import block_hours

# EC2 vCPU quotas (Service Quotas, service code `ec2`), each with the name AWS gives it, e.g.
# https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas/L-417A185B (Running On-Demand P instances).
# A quota counts the vCPUs of all running instances (or open Spot requests) of its families in the region. On-Demand
# P instances share one quota, p6 included; Spot P5-class instances (p5, p5e, p5en) have a quota of their own
# beside the older P families' (EC2 User Guide, "Amazon EC2 instance type quotas"). Which Spot quota counts p6 is
# not in AWS's table, so a Spot p6 pool is reported as not checked rather than mapped by guess.
QUOTAS: dict[tuple[str, str], tuple[str, str]] = {
    ("P", "ON_DEMAND"): ("L-417A185B", "Running On-Demand P instances"),
    ("G", "ON_DEMAND"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("Standard", "ON_DEMAND"): ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
    ("P", "SPOT"): ("L-7212CCBC", "All P4, P3 and P2 Spot Instance Requests"),
    ("P5", "SPOT"): ("L-C4BD4855", "All P5 Spot Instance Requests"),
    ("G", "SPOT"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("Standard", "SPOT"): ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests"),
}
_STANDARD_FAMILIES = set("acdhimrtz")
_OLDER_P = ("p2", "p3", "p4")  # p3dn, p4d and p4de are in their generation's family
_P5_CLASS = "p5"  # p5, p5e and p5en

ClientFactory = Callable[[str], Any]  # service name -> boto3 client in the stack's region


def quota_family(instance_type: str, capacity_type: str = "ON_DEMAND") -> str | None:
    """The QUOTAS family of an instance type bought as `capacity_type`: `P`, `P5` (Spot p5-class), `G` (G and VT)
    or `Standard`; None for families with quotas this table does not hold (Spot p6, Inf, Trn, DL, X, U, F,
    HPC ...), which preflight reports as not checked."""
    generation = re.match(r"^([a-z]+)([0-9]*)", instance_type)
    family, number = (generation.group(1), generation.group(2)) if generation else ("", "")
    if family == "p":
        prefix = f"p{number}"
        if capacity_type == "SPOT":
            return "P5" if prefix == _P5_CLASS else "P" if prefix in _OLDER_P else None
        return "P"
    if family in ("g", "vt"):
        return "G"
    if len(family) == 1 and family in _STANDARD_FAMILIES:
        return "Standard"
    return None


# ------------------------------------------------------------------------------------------------- checks


def check_identity(sts: Any, cfg: StackConfig, expected_account: str | None) -> tuple[list[Check], str | None]:
    """The caller's account; a FAIL when there are no usable credentials or they are another account's."""
    try:
        identity = sts.get_caller_identity()
    except AWS_ERRORS as exc:
        code, message = _error(exc)
        fix = "configure AWS credentials for the stack's account (aws configure sso, or the deploy role)"
        return [Check(FAIL, "credentials", f"sts:GetCallerIdentity failed: {code}: {message}", fix)], None
    account, arn = str(identity["Account"]), str(identity["Arn"])
    checks = [Check(PASS, "credentials", f"account {account} as {arn}")]
    if expected_account and expected_account != account:
        checks.append(Check(FAIL, "account", f"credentials are for account {account}, expected {expected_account}",
                            f"use credentials of account {expected_account} (or drop --account)"))
    named = sorted({entry.principal_arn.split(":")[4] for entry in (cfg.cluster.access_entries if cfg.cluster else [])})
    foreign = [other for other in named if other != account]
    if foreign:
        checks.append(Check(WARN, "access entries", f"ml-cluster:cluster.accessEntries name account(s) "
                            f"{', '.join(foreign)}, the credentials are account {account}",
                            "point accessEntries at roles of the stack's account"))
    return checks, account


def check_region(ec2: Any, region: str, session_region: str | None) -> list[Check]:
    checks = []
    try:
        regions = {r["RegionName"] for r in ec2.describe_regions()["Regions"]}
    except AWS_ERRORS as exc:
        code, message = _error(exc)
        return [Check(FAIL, "region", f"{region}: ec2:DescribeRegions failed: {code}: {message}",
                      "grant ec2:DescribeRegions, or check that the region name is right")]
    if region in regions:
        checks.append(Check(PASS, "region", f"{region} is enabled for the account"))
    else:
        checks.append(Check(FAIL, "region", f"{region} is not enabled for the account",
                            f"enable it (aws account enable-region --region-name {region}) or change aws:region"))
    if session_region and session_region != region:
        checks.append(Check(WARN, "credentials region", f"the shell's default region is {session_region}; the "
                            f"stack deploys to {region} (aws:region), preflight checked {region}",
                            f"export AWS_REGION={region} so aws/kubectl commands talk to the stack's region"))
    return checks


def stack_zones(ec2: Any, cfg: StackConfig) -> tuple[list[Check], list[str]]:
    """The zones the stack's private subnets are in: configured ones must exist; adopted subnets must exist."""
    assert cfg.network is not None
    try:
        if cfg.network.create is not None:
            wanted = cfg.network.create.availability_zones
            found = {z["ZoneName"] for z in ec2.describe_availability_zones(
                Filters=[{"Name": "zone-name", "Values": wanted}])["AvailabilityZones"]}
            missing = [zone for zone in wanted if zone not in found]
            if missing:
                return [Check(FAIL, "availability zones", f"{', '.join(missing)} not in the region",
                              f"use zones of the region in ml-cluster:network.create.availabilityZones "
                              f"({', '.join(sorted(found)) or 'none found'} exist)")], sorted(found)
            return [Check(PASS, "availability zones", ", ".join(wanted))], list(wanted)
        ids = cfg.network.existing.private_subnet_ids if cfg.network.existing else []
        subnets = ec2.describe_subnets(SubnetIds=ids)["Subnets"]
    except AWS_ERRORS as exc:
        code, message = _error(exc)
        return [Check(FAIL, "availability zones", f"{code}: {message}",
                      "check ml-cluster:network (adopted subnets must exist in the stack's region and account)")], []
    zones = sorted({s["AvailabilityZone"] for s in subnets})
    return [Check(PASS, "availability zones", f"{', '.join(zones)} (from {len(subnets)} adopted subnets)")], zones


def check_offerings(ec2: Any, cfg: StackConfig, zones: Sequence[str]) -> list[Check]:
    """Every pool's instance types in every zone the pool may launch in (EKS rejects a node group whose subnets
    include a zone without the type)."""
    pools = [(i, pool) for i, pool in enumerate(cfg.node_pools) if pool.instance_types]
    types = sorted({t for _, pool in pools for t in pool.instance_types})
    if not pools:
        return []
    if not zones:  # the zone check failed and said why; say that offerings went unchecked rather than pass them
        return [Check(WARN, "instance offerings", "not checked: the stack's availability zones are unknown",
                      "fix the availability zones check first")]
    offered: set[tuple[str, str]] = set()
    try:
        paginator = ec2.get_paginator("describe_instance_type_offerings")
        for page in paginator.paginate(LocationType="availability-zone", Filters=[
                {"Name": "instance-type", "Values": types}, {"Name": "location", "Values": list(zones)}]):
            offered |= {(o["InstanceType"], o["Location"]) for o in page["InstanceTypeOfferings"]}
    except AWS_ERRORS as exc:
        code, message = _error(exc)
        return [Check(FAIL, "instance offerings", f"{code}: {message}", "grant ec2:DescribeInstanceTypeOfferings")]
    checks = []
    for index, pool in pools:
        pool_zones = pool.launch_zones(zones)  # an EFA pool: its one zone
        for instance_type in pool.instance_types:
            have = [z for z in pool_zones if (instance_type, z) in offered]
            name = f"offering {pool.name} {instance_type}"
            if len(have) == len(pool_zones):
                checks.append(Check(PASS, name, f"offered in {', '.join(pool_zones)}"))
            elif have:
                lacking = [z for z in pool_zones if z not in have]
                checks.append(Check(FAIL, name, f"not offered in {', '.join(lacking)}",
                                    f"set ml-cluster:nodePools[{index}].availabilityZones: [{', '.join(have)}]"))
            else:
                checks.append(Check(FAIL, name, f"not offered in any of {', '.join(pool_zones)}",
                                    f"pick another type for ml-cluster:nodePools[{index}] or another region"))
    return checks


# EC2 DescribeCapacityReservations states: launchable now, later, or never again.
_RESERVATION_USABLE, _RESERVATION_LATER = ("active",), ("scheduled", "pending", "payment-pending", "assessing",
                                                        "delayed")
RESERVATION_ENDING_HOURS = 24  # a reservation ending within this is a WARN: plan the next block


def check_reservations(ec2: Any, cfg: StackConfig, now: Callable[[], datetime] = lambda: datetime.now(UTC),
                       ) -> list[Check]:
    """Each pool's capacityReservation against what EC2 says of it: it exists, is (or will be) active, is a Capacity
    Block exactly when the pool says CAPACITY_BLOCK, and holds the pool's type, zone and size."""
    checks = []
    for index, pool in enumerate(cfg.node_pools):
        reservation = pool.capacity_reservation
        if reservation is None:
            continue
        name, where = f"reservation {pool.name}", f"ml-cluster:nodePools[{index}].capacityReservation"
        try:
            found = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation.id])
            [item] = found.get("CapacityReservations") or [{}]
        except AWS_ERRORS as exc:
            code, message = _error(exc)
            fix = (f"set {where}.id to a reservation of this account and region (aws ec2 "
                   "describe-capacity-reservations)") if "NotFound" in code else \
                "grant ec2:DescribeCapacityReservations"
            checks.append(Check(FAIL, name, f"{reservation.id}: {code}: {message}", fix))
            continue
        state = str(item.get("State") or "unknown")
        block = item.get("ReservationType") == "capacity-block"
        start, end = item.get("StartDate"), item.get("EndDate")
        facts = (f"{reservation.id} {state}, {'Capacity Block' if block else 'On-Demand Capacity Reservation'} of "
                 f"{item.get('TotalInstanceCount')} x {item.get('InstanceType')} in {item.get('AvailabilityZone')}"
                 + (f", {_day(start)} to {_day(end)}" if start or end else ""))
        wrong = []
        if item.get("InstanceType") not in pool.instance_types:
            wrong.append((f"it holds {item.get('InstanceType')}, the pool runs {', '.join(pool.instance_types)}",
                          f"set ml-cluster:nodePools[{index}].instanceTypes: [{item.get('InstanceType')}]"))
        if item.get("AvailabilityZone") != reservation.availability_zone:
            wrong.append((f"it is in {item.get('AvailabilityZone')}, the config says {reservation.availability_zone}",
                          f"set {where}.availabilityZone: {item.get('AvailabilityZone')}"))
        if block != (pool.capacity_type == "CAPACITY_BLOCK"):
            kind = "CAPACITY_BLOCK" if block else "ON_DEMAND"
            wrong.append((f"it is {'a Capacity Block' if block else 'not a Capacity Block'}, the pool's capacityType "
                          f"is {pool.capacity_type}", f"set ml-cluster:nodePools[{index}].capacityType: {kind}"))
        if reservation.start_time is not None and isinstance(start, datetime) and start != reservation.start_time:
            wrong.append((f"it starts {_day(start)}, the config says {_day(reservation.start_time)} (the idle-GPU "
                          "alert would count the wrong hours)", f"set {where}.startTime: {start.isoformat()}"))
        if reservation.end_time is not None and isinstance(end, datetime) and end != reservation.end_time:
            wrong.append((f"it ends {_day(end)}, the config says {_day(reservation.end_time)} (the end alert "
                          "would fire at the wrong time)", f"set {where}.endTime: {end.isoformat()}"))
        total = int(item.get("TotalInstanceCount") or 0)
        if pool.max_size > total:
            wrong.append((f"it holds {total} instances, the pool's maxSize is {pool.max_size}",
                          f"set ml-cluster:nodePools[{index}].maxSize: {total}"))
        if wrong:
            checks += [Check(FAIL, name, f"{facts}: {why}", fix) for why, fix in wrong]
        elif state in _RESERVATION_LATER:
            checks.append(Check(WARN, name, f"{facts}: the pool gets nodes from {_day(start)}",
                                "nothing to do before then"))
        elif state not in _RESERVATION_USABLE:
            checks.append(Check(FAIL, name, f"{facts}: no instance can launch into it",
                                f"buy or find an active reservation and set {where}.id"))
        elif isinstance(end, datetime) and end - now() < timedelta(hours=RESERVATION_ENDING_HOURS):
            checks.append(Check(WARN, name, f"{facts}: ends in {_hours(end - now())}; running Jobs get SIGTERM "
                                            "before EC2 reclaims the block", "move to the next block "
                                            "(docs/operations.md, reserved capacity)"))
        elif int(item.get("AvailableInstanceCount") or 0) < pool.max_size:
            checks.append(Check(WARN, name, f"{facts}: only {item.get('AvailableInstanceCount')} of {total} free "
                                            f"(others already run in it), the pool may grow to {pool.max_size}",
                                "see what runs in it: aws ec2 describe-instances --filters "
                                f"Name=capacity-reservation-id,Values={reservation.id}"))
        else:
            checks.append(Check(PASS, name, facts))
    return checks


def check_next_blocks(ec2: Any, cfg: StackConfig, now: Callable[[], datetime] = lambda: datetime.now(UTC),
                      ) -> list[Check]:
    """For each Capacity Block pool, the block that could follow it: EC2's offerings
    (DescribeCapacityBlockOfferings) of the same type, count and duration from the block's end (or now), in its zone,
    with the upfront fee and what it makes per instance-hour (the cost estimate prices the block the same way)."""
    checks = []
    for index, pool in enumerate(cfg.node_pools):
        reservation = pool.capacity_reservation
        if reservation is None or pool.capacity_type != "CAPACITY_BLOCK":
            continue
        name, where = f"next block {pool.name}", f"ml-cluster:nodePools[{index}].capacityReservation"
        instance_type, count, zone = pool.instance_types[0], reservation.instance_count, reservation.availability_zone
        hours = block_hours(*(moment.isoformat() if moment else None
                              for moment in (reservation.start_time, reservation.end_time)))
        after = reservation.end_time or now()
        shape = f"{count} x {instance_type} for {hours} h"
        try:
            offers = [offer for page in ec2.get_paginator("describe_capacity_block_offerings").paginate(
                InstanceType=instance_type, InstanceCount=count, CapacityDurationHours=hours, StartDateRange=after)
                for offer in page.get("CapacityBlockOfferings") or []
                if offer.get("InstanceType") == instance_type and int(offer.get("InstanceCount") or 0) == count]
        except AWS_ERRORS as exc:
            code, message = _error(exc)
            checks.append(Check(WARN, name, f"{shape}: {code}: {message}", "grant ec2:DescribeCapacityBlockOfferings"))
            continue
        in_zone = [offer for offer in offers if offer.get("AvailabilityZone") == zone]
        if not in_zone:
            elsewhere = sorted({str(offer.get("AvailabilityZone")) for offer in offers})
            checks.append(Check(WARN, name, f"{shape} from {_day(after)}: none offered in {zone}"
                                + (f" (offered in {', '.join(elsewhere)})" if elsewhere else ""),
                                f"a block in another zone moves the pool: set {where}.id and .availabilityZone to "
                                "the new block's" if elsewhere else "look again later, or for a shorter block"))
            continue
        offer = min(in_zone, key=lambda o: (o.get("StartDate") or after, float(o.get("UpfrontFee") or 0)))
        fee, start = float(offer.get("UpfrontFee") or 0), offer.get("StartDate")
        duration = int(offer.get("CapacityBlockDurationHours") or 0) + int(offer.get("CapacityBlockDurationMinutes")
                                                                            or 0) / 60
        facts = (f"{shape} in {zone} from {_day(start)}: {offer.get('CurrencyCode')} {fee:,.2f} upfront"
                 + (f" ({fee / (count * duration):,.2f} per instance-hour)" if duration else ""))
        gap = start - after if isinstance(start, datetime) else timedelta(0)
        if gap > timedelta(minutes=30):  # EC2 stops a block's instances 30 minutes before its end anyway
            checks.append(Check(WARN, name, f"{facts}: it starts {_hours(gap)} after this one ends",
                                f"the pool has no nodes in between: queue work elsewhere, or buy it now "
                                f"({offer.get('CapacityBlockOfferingId')})"))
        else:
            checks.append(Check(PASS, name, facts))
    return checks


def _day(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if isinstance(value, datetime) else str(value)


def _hours(delta: timedelta) -> str:
    return f"{max(delta.total_seconds(), 0) / 3600:.1f} h"


def _vcpus(ec2: Any, types: Iterable[str]) -> dict[str, int]:
    wanted, found = sorted(set(types)), {}
    for start in range(0, len(wanted), 100):  # DescribeInstanceTypes takes at most 100 names
        try:
            for item in ec2.describe_instance_types(InstanceTypes=wanted[start:start + 100])["InstanceTypes"]:
                found[item["InstanceType"]] = int(item["VCpuInfo"]["DefaultVCpus"])
        except ClientError:
            for name in wanted[start:start + 100]:  # one unknown name fails the call: ask one by one
                try:
                    item = ec2.describe_instance_types(InstanceTypes=[name])["InstanceTypes"][0]
                    found[name] = int(item["VCpuInfo"]["DefaultVCpus"])
                except (ClientError, IndexError):
                    continue
    return found


def check_quotas(ec2: Any, quotas: Any, cfg: StackConfig, region: str) -> list[Check]:
    """vCPUs the pools need at max size, per quota (family x purchase option), against the account's value."""
    pools = [pool for pool in cfg.node_pools if pool.instance_types]
    vcpus = _vcpus(ec2, (t for pool in pools for t in pool.instance_types))
    need: dict[tuple[str, str], tuple[int, list[str]]] = {}
    checks = []
    for pool in pools:
        if pool.capacity_type == "CAPACITY_BLOCK":
            checks.append(Check(PASS, f"quota {pool.name}", f"{', '.join(pool.instance_types)}: a Capacity Block "
                                "pool, not held to a vCPU quota here (its reservation row checks the block's size)"))
            continue
        families = {quota_family(t, pool.capacity_type) for t in pool.instance_types}
        known = [vcpus[t] for t in pool.instance_types if t in vcpus]
        if None in families:
            checks.append(Check(WARN, f"quota {pool.name}", f"{', '.join(pool.instance_types)}: a family with its "
                                "own quota, not checked", "check its quota in the Service Quotas console"))
        if not known:
            continue
        for family in sorted(f for f in families if f is not None):
            # The widest listed type at max size: the most the pool can hold.
            total, users = need.get((family, pool.capacity_type), (0, []))
            need[(family, pool.capacity_type)] = (total + pool.max_size * max(known),
                                                  [*users, f"{pool.name} {pool.max_size} x {max(known)}"])
    for (family, capacity), (needed, users) in sorted(need.items()):
        code, title = QUOTAS[(family, capacity)]
        name = f"quota {code}"
        try:
            try:
                quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
                origin = "applied"
            except ClientError as exc:
                if _error(exc)[0] != "NoSuchResourceException":
                    raise
                quota = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
                origin = "AWS default"
        except AWS_ERRORS as exc:
            error, message = _error(exc)
            checks.append(Check(WARN, name, f"{title}: cannot read ({error}: {message}); the pools need {needed} "
                                "vCPUs", "grant servicequotas:GetServiceQuota to check it"))
            continue
        value = int(float(quota.get("Value") or 0))
        detail = f"{title}: {value} vCPUs ({origin}), pools at max need {needed} ({'; '.join(users)})"
        if needed > value:
            checks.append(Check(FAIL, name, detail, f"aws service-quotas request-service-quota-increase --region "
                                f"{region} --service-code ec2 --quota-code {code} --desired-value {needed}"))
        else:
            checks.append(Check(PASS, name, detail))
    return checks


def check_kubernetes_version(eks: Any, version: str) -> list[Check]:
    """EKS must offer the version; extended support works but bills the control plane at the extended rate."""
    name = f"kubernetes {version}"
    offered: dict[str, str] = {}
    try:
        for page in eks.get_paginator("describe_cluster_versions").paginate(clusterType="eks", includeAll=True):
            for item in page.get("clusterVersions") or []:
                offered[str(item["clusterVersion"])] = str(item.get("versionStatus") or item.get("status") or "")
    except AWS_ERRORS as exc:
        code, message = _error(exc)
        return [Check(WARN, name, f"eks:DescribeClusterVersions failed: {code}: {message}",
                      "grant eks:DescribeClusterVersions to check it")]
    standard = sorted((v for v, s in offered.items() if s.upper().replace("-", "_") == "STANDARD_SUPPORT"),
                      key=lambda v: tuple(int(p) for p in v.split(".")))
    status = offered.get(version, "").upper().replace("-", "_")
    fix = f"set ml-cluster:cluster.kubernetesVersion to one of {', '.join(standard) or 'the offered versions'}"
    if status == "STANDARD_SUPPORT":
        return [Check(PASS, name, "offered by EKS, standard support")]
    if status == "EXTENDED_SUPPORT":
        return [Check(WARN, name, "offered in extended support only (the control plane bills at the extended rate)",
                      fix)]
    return [Check(FAIL, name, "not offered by EKS" if not status else f"EKS status {status}", fix)]


def check_buckets(s3: Any, cfg: StackConfig, stack: str, account: str) -> list[Check]:
    """HeadBucket per bucket name: 404 free, 200 ours (this account can read it), 403 someone else's."""
    checks = []
    for item in derived_names(cfg, stack, account):
        if item.service != "s3":
            continue
        name = f"bucket {item.name}"
        try:
            s3.head_bucket(Bucket=item.name)
            checks.append(Check(PASS, name, "exists and this account can use it (the stack's own, or import it)"))
        except ClientError as exc:
            status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 0)
            code = _error(exc)[0]
            if status == 404 or code in ("404", "NoSuchBucket", "NotFound"):
                checks.append(Check(PASS, name, "free: pulumi up creates it"))
            elif status == 403 or code in ("403", "Forbidden", "AccessDenied"):
                checks.append(Check(FAIL, name, "taken: it exists and belongs to someone else (HeadBucket 403)",
                                    f"name the bucket yourself: {item.path.rsplit('.', 1)[0]}.bucketName"))
            else:
                checks.append(Check(FAIL, name, f"HeadBucket answered {status or code}",
                                    f"name the bucket yourself: {item.path.rsplit('.', 1)[0]}.bucketName"))
        except BotoCoreError as exc:
            checks.append(Check(FAIL, name, f"HeadBucket failed: {exc}", "check network access to S3"))
    return checks


def check_registry(ecr: Any, cfg: StackConfig, stack: str) -> list[Check]:
    """The stack's ECR repository: absent (created by pulumi up) or tagged as this stack's; an untagged or other
    stack's repository of that name makes `pulumi up` fail with RepositoryAlreadyExistsException."""
    repos = [item for item in derived_names(cfg, stack) if item.service == "ecr"]
    checks = []
    for item in repos:
        name = f"repository {item.name}"
        try:
            found = ecr.describe_repositories(repositoryNames=[item.name])["repositories"][0]
        except ClientError as exc:
            code, message = _error(exc)
            if code == "RepositoryNotFoundException":
                checks.append(Check(PASS, name, "free: pulumi up creates it"))
            else:
                checks.append(Check(FAIL, name, f"{code}: {message}", "grant ecr:DescribeRepositories"))
            continue
        except BotoCoreError as exc:
            checks.append(Check(FAIL, name, f"DescribeRepositories failed: {exc}", "check network access to ECR"))
            continue
        tags = {t["Key"]: t["Value"] for t in ecr.list_tags_for_resource(
            resourceArn=found["repositoryArn"]).get("tags") or []}
        if tags.get("project") == "ml-cluster" and tags.get("stack") == stack:
            checks.append(Check(PASS, name, "exists, tagged as this stack's"))
        else:
            checks.append(Check(FAIL, name, "exists and is not this stack's (no project=ml-cluster, "
                                f"stack={stack} tags): pulumi up would fail to create it",
                                f"import it (pulumi import aws:ecr/repository:Repository ... {item.name}) or set "
                                f"{item.path} to another name"))
    return checks


def run_preflight(cfg: StackConfig, stack: str, client: ClientFactory, session_region: str | None = None,
                  expected_account: str | None = None, kube_for: KubeFor | None = None) -> list[Check]:
    """Every check, in order. Without working credentials only that FAIL is returned (the rest would repeat it).
    `kube_for`: how to reach an existing cluster's Kubernetes API (default: its endpoint with an EKS token made
    from the same credentials)."""
    assert cfg.platform == "eks" and cfg.region is not None and cfg.cluster is not None
    checks, account = check_identity(client("sts"), cfg, expected_account)
    if account is None:
        return checks
    ec2 = client("ec2")
    checks += check_region(ec2, cfg.region, session_region)
    zone_checks, zones = stack_zones(ec2, cfg)
    checks += zone_checks
    checks += check_offerings(ec2, cfg, zones)
    checks += check_reservations(ec2, cfg)
    checks += check_next_blocks(ec2, cfg)
    checks += check_quotas(ec2, client("service-quotas"), cfg, cfg.region)
    checks += check_kubernetes_version(client("eks"), cfg.cluster.kubernetes_version)
    if cfg.cluster.existing:
        checks += check_existing_cluster(client("eks"), cfg, kube_for or (lambda found: KubeApi(
            found.endpoint, eks_token(client("sts"), found.name), found.certificate_authority, cluster=found.name)),
            client("sagemaker"), stack)
    checks += check_buckets(client("s3"), cfg, stack, account)
    checks += check_registry(client("ecr"), cfg, stack)
    if cfg.storage.fsx_lustre is not None:
        checks += [Check(*row) for row in fsx_rows(client("eks"), client("service-quotas"), client("fsx"),
                                                   cfg.storage.fsx_lustre, cfg.cluster.kubernetes_version, stack,
                                                   cfg.region)]
    return checks


def format_checks(stack: str, region: str, checks: Sequence[Check]) -> str:
    """The table: one row per check, the fix under each FAIL and WARN that has one, then the counts."""
    width = max([len(check.name) for check in checks] + [5])
    lines = [f"preflight of stack {stack} ({region})", "", f"  {'status':<6}  {'check':<{width}}  detail"]
    for check in checks:
        lines.append(f"  {check.status:<6}  {check.name:<{width}}  {check.detail}")
        if check.fix and check.status != PASS:
            lines.append(f"  {'':<6}  {'':<{width}}  fix: {check.fix}")
    counts = {status: sum(1 for c in checks if c.status == status) for status in (FAIL, WARN, PASS)}
    lines += ["", ", ".join(f"{n} {status}" for status, n in counts.items())]
    return "\n".join(lines) + "\n"
