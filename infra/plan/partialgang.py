"""The worst-case cost of one partial-gang wait per GPU pool: a gang that got all its nodes but one, the others idle
until the wait ends. Quota is not EC2 capacity, and cluster-autoscaler's atomic scale-up is not implemented for AWS
(cloudprovider/aws/aws_cloud_provider.go:288-291 at cluster-autoscaler-1.35.2), so a 16-node gang can get 15.

What bounds the wait (kubernetes-sigs/kueue v0.19.2 and cluster-autoscaler 1.35.2, read, not run):
- a flavor without a topology: Kueue admitted the gang, its pods hold the nodes that came up, and
  `waitForPodsReady.timeout` evicts it (then the requeue backoff): idle nodes x price x timeout;
- a topology flavor: Kueue waits to place the gang (second pass, quota reserved, no pods), the autoscaler's booking of
  the ProvisioningRequest's nodes ends after 10 minutes (FAQ.md:657-663) and unneeded nodes go after
  `scale-down-unneeded-time`: idle nodes x price x (10 minutes + that time). Kueue itself sets no deadline there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.plan.holdings import Pool

BOOKING_MINUTES = 10  # cluster-autoscaler's ProvisioningRequest booking (FAQ.md:657-663 at cluster-autoscaler-1.35.2)


@dataclass(frozen=True)
class PartialGang:
    pool: str
    idle_nodes: int  # the pool's maxSize less one: the largest gang short of one node
    node_hour_price: float
    minutes: float
    bounded_by: str

    @property
    def cost(self) -> float:
        return round(self.idle_nodes * self.node_hour_price * self.minutes / 60, 2)


def _minutes(duration: str) -> float:
    return int(duration[:-1]) * {"s": 1 / 60, "m": 1.0, "h": 60.0}[duration[-1]]


def partial_gangs(plan: Mapping[str, Any], pools: Sequence[Pool],
                  rate_of: Callable[[Pool], float]) -> list[PartialGang]:
    """One line per GPU pool of the plan's cold-start output that can run a gang of two nodes or more. Capacity
    Block pools are left out: their instances are prepaid whatever runs."""
    cold = (plan.get("outputs") or {}).get("coldStart") or {}
    timeout = cold.get("timeout")
    by_name = {pool.name: pool for pool in pools}
    lines = []
    for row in cold.get("pools", []):
        pool = by_name.get(row["pool"])
        if pool is None or pool.capacity_type == "CAPACITY_BLOCK" or pool.sizes[2] < 2:
            continue
        if row["timedFrom"].startswith("admission after"):
            unneeded = cold.get("scaleDownUnneededTime") or "10m"
            minutes, bound = BOOKING_MINUTES + _minutes(unneeded), f"booking 10m + scale-down {unneeded}"
        elif timeout:
            minutes, bound = _minutes(timeout), f"waitForPodsReady {timeout}"
        else:
            continue  # no Kueue: nothing admits a gang whole, nothing bounds its wait
        lines.append(PartialGang(pool.name, pool.sizes[2] - 1, rate_of(pool), minutes, bound))
    return lines


def format_partial_gangs(lines: Sequence[PartialGang], money: Callable[[float], str]) -> list[str]:
    if not lines:
        return []
    out = ["", "  partial gang: worst case of one wait per GPU pool (all nodes but one came up; not in the totals)",
           f"  {'pool':<16} {'idle nodes':>10} {'$/node-h':>10} {'minutes':>8} {'bounded by':<32} {'cost':>12}"]
    for line in lines:
        out.append(f"  {line.pool:<16} {line.idle_nodes:>10} {money(line.node_hour_price):>10} {line.minutes:>8g} "
                   f"{line.bounded_by:<32} {money(line.cost):>12}")
    return out
