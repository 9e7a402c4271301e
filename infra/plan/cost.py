"""What a plan costs: $/hour and $/month of a stack at its pools' min, desired and max sizes, and per Job.

Pure functions over a plan document (scripts/plan.py --json) and a table of unit prices, so the same code prices a
plan offline, in CI (base against head) and against live AWS prices. Which prices a plan needs is a list of
`PriceQuery`s; each is answered by a response in the real AWS shape (pricing.get_products for list prices,
ec2.describe_spot_price_history for Spot), read by `parse_get_products` / `parse_spot_history` whether it came from
AWS or from the committed fixture (infra.plan.prices).

The questions and their parsers are infra/plan/pricing.py; what a plan holds (pools, Jobs, claims, teams) is read by
infra/plan/holdings.py; this module prices it and writes the report. What is priced, and how:
- node groups: instances x the type's Linux on-demand hourly rate, or its Spot rate for SPOT pools, at each size;
- node volumes: the launch template's gp3 volumes (or the node group's diskSize) per node, at each size;
- NAT gateways and the EKS control plane: their hourly rate (data processed is usage, not priced);
- EFS: the sum of the PersistentVolumeClaims on EFS storage classes, all in Standard storage (an upper bound:
  lifecycle moves cold files to Infrequent Access);
- FSx for Lustre: each file system's storage capacity (GiB) x the PERSISTENT_2 rate of its throughput tier (the
  tier is in the per-GB rate; backups, and requests to linked S3 buckets, are usage and not priced);
- S3 buckets: the Standard storage rate per GiB-month only: a bucket declares no size, so it adds nothing to totals;
- Jobs: GPU-hours and the cost of the whole nodes they hold for activeDeadlineSeconds (the most a run can bill);
- tenant teams (a Kueue ClusterQueue admitting one namespace labelled `<prefix>/team`): their guaranteed GPUs
  (nominalQuota) and, where a borrowingLimit bounds it, the most they can hold, each GPU at its flavor's dearest
  pool's per-GPU rate, plus their EFS claims. This attributes the pools' cost for charge-back; it is not added to
  the totals (the pools are already there).
Prices are per GB (AWS bills GB-Mo for storage); declared sizes are in GiB, so storage is priced at GiB x 1.0737.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import date
from typing import Any

from infra.config.support import eks_tier
from infra.plan.holdings import (
    BUCKET,
    EFS_FILE_SYSTEM,
    EKS_CLUSTER,
    NAT_GATEWAY,
    JobUse,
    Pool,
    efs_claims,
    efs_gib,
    flavor_pools,
    fsx_lustre_systems,
    jobs_of,
    plan_region,
    pool_query,
    pools_of,
    price_queries,
    resources_of,
    team_namespaces_of,
    team_quotas_of,
)
from infra.plan.partialgang import PartialGang, format_partial_gangs, partial_gangs
from infra.plan.pricing import (
    PriceError,
    PriceQuery,
    efs_query,
    eks_extended_query,
    eks_query,
    fsx_lustre_query,
    gp3_query,
    nat_query,
    s3_query,
)

HOURS_PER_MONTH = 730  # AWS's own convention in its pricing pages and calculator
GB_PER_GIB = 1024**3 / 1000**3
SIZES = ("min", "desired", "max")

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
    partial_gangs: list[PartialGang] = field(default_factory=list)  # worst case of one partial-gang wait per pool

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
    report.partial_gangs = partial_gangs(plan, pools, lambda pool: price(by_key[pool_query(region, pool).key]))
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
    nats = len(resources_of(plan, NAT_GATEWAY))
    if nats:
        rate = price(nat_query(region))
        report.lines.append(CostLine("NAT gateways", f"{nats} x hourly (data processed not included)", rate, "hour",
                                     (rate * nats,) * 3))
    for cluster in resources_of(plan, EKS_CLUSTER):  # one per stack
        version = str(cluster["inputs"].get("version") or "")
        extended = eks_tier(version, today) in ("extended", "ended")
        rate = price(eks_extended_query(region) if extended else eks_query(region))
        tier = f"extended support on {today}" if extended else "standard support"
        report.lines.append(CostLine("EKS control plane", f"Kubernetes {version}, {tier}", rate, "hour",
                                     (rate,) * 3))
    if resources_of(plan, EFS_FILE_SYSTEM):
        rate, gib = price(efs_query(region)), efs_gib(plan)
        efs_hourly = rate * gib * GB_PER_GIB / HOURS_PER_MONTH
        report.lines.append(CostLine("EFS storage", f"{gib:g} GiB claimed, Standard", rate, "GB-month",
                                     (efs_hourly, efs_hourly, efs_hourly)))
    for _name, gib, throughput in fsx_lustre_systems(plan):
        rate = price(fsx_lustre_query(region, throughput))
        fsx_hourly = rate * gib * GB_PER_GIB / HOURS_PER_MONTH
        report.lines.append(CostLine("FSx for Lustre", f"{gib} GiB PERSISTENT_2 SSD, {throughput} MB/s/TiB", rate,
                                     "GB-month", (fsx_hourly, fsx_hourly, fsx_hourly)))
    buckets = resources_of(plan, BUCKET)
    if buckets:
        rate = price(s3_query(region))
        report.lines.append(CostLine("S3 buckets", f"{len(buckets)} bucket(s), Standard; no declared size", rate,
                                     "GB-month", (0.0, 0.0, 0.0), per_gib_month=True))
    report.jobs = [_job_cost(job, pools, lambda pool: price(by_key[pool_query(region, pool).key]))
                   for job in jobs_of(plan)]
    report.teams = _team_costs(plan, pools, lambda pool: price(by_key[pool_query(region, pool).key]),
                               price(efs_query(region)) if resources_of(plan, EFS_FILE_SYSTEM) else None)
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
            "teams": [asdict(team) for team in report.teams], "teamMonthly": report.team_monthly(),
            "partialGangs": [{**asdict(line), "cost": line.cost} for line in report.partial_gangs]}


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
    lines += format_partial_gangs(report.partial_gangs, _money)
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
