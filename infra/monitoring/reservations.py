"""Alerts for reserved capacity: a reservation that ends, and reserved GPUs that sit idle.

The end: a Capacity Block's instances are terminated at the block's end, whatever runs on them. The end is a fact of
the block (capacityReservation.endTime, which preflight compares with EC2's EndDate), so the rule compares the clock
with it and needs no exporter: `vector(time())` is above the threshold from the lead time before the end on.

Idle: a reservation bills every instance it holds, running or not (an ODCR at the On-Demand rate, a block prepaid).
The reserved GPUs are the reservation's instanceCount x the type's GPUs; the GPUs in use are what running pods on
the pool's nodes request (kube-state-metrics: `kube_pod_container_resource_requests{resource="nvidia_com_gpu"}`
joined to `kube_pod_status_phase` and to the nodes' `<prefix>/pool` label in `kube_node_labels`, which
infra/monitoring/component.py allowlists). Reserved GPUs without a node (the pool scaled down, maxSize below the
count) count as idle, as much as a node whose GPUs no pod asked for. The rule holds only while kube-state-metrics
answers, and between the reservation's startTime and endTime when the config states them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from infra.config.nodepools import CapacityReservationConfig
from infra.monitoring.gpu_alerts import ksm_label
from infra.nodes.poolplan import PoolPlan

RESERVATION_GROUP = "ml-cluster-reserved-capacity"
RUNBOOK = "docs/operations.md#reserved-capacity-capacity-blocks-and-on-demand-capacity-reservations"


@dataclass(frozen=True)
class ReservedPool:
    """A pool that launches into a capacity reservation, as the alerts see it."""

    name: str
    reservation: CapacityReservationConfig
    gpus_per_node: int  # 0: a pool without GPUs (no idle-GPU alert)

    @property
    def reserved_gpus(self) -> int:
        return self.reservation.instance_count * self.gpus_per_node


def reserved_pools(plans: Sequence[PoolPlan]) -> tuple[ReservedPool, ...]:
    return tuple(ReservedPool(plan.name, plan.config.capacity_reservation, plan.gpus_per_node)
                 for plan in plans if plan.config.capacity_reservation is not None)


def reservation_end_rules(pools: Sequence[ReservedPool], lead_minutes: int) -> list[dict[str, Any]]:
    """One alert per pool whose reservation has an end time, firing from `lead_minutes` before it."""
    rules = []
    for pool in pools:
        reservation = pool.reservation
        if reservation.end_time is None:
            continue
        end = int(reservation.end_time.timestamp())
        rules.append({
            "alert": "ReservedCapacityEnding",
            "expr": f"vector(time()) > {end - lead_minutes * 60}",
            "labels": {"severity": "warning", "pool": pool.name, "reservation": reservation.id},
            "annotations": {
                "summary": f"{reservation.id} of pool {pool.name} ends at {_utc(reservation.end_time)}",
                "description": f"Its instances are terminated as it ends: Jobs on pool {pool.name} are stopped (a "
                               "last checkpoint on SIGTERM) and resume where capacity is. Move the pool to the "
                               "next block before then.",
                "runbook_url": RUNBOOK,
            },
        })
    return rules


def gpus_in_use(pool: str, label_prefix: str) -> str:
    """GPUs that running pods request on the nodes of `pool` (one unlabelled series; 0 when there are none)."""
    pool_label = ksm_label(f"{label_prefix}/pool")
    running = 'max by (namespace, pod) (kube_pod_status_phase{phase="Running"} == 1)'
    nodes = f'max by (node) (kube_node_labels{{{pool_label}="{pool}"}})'
    return (f'sum(kube_pod_container_resource_requests{{resource="nvidia_com_gpu"}}'
            f" * on (namespace, pod) group_left () {running}"
            f" * on (node) group_left () {nodes}) or vector(0)")


def idle_reserved_gpus(pool: ReservedPool, label_prefix: str) -> str:
    """Reserved GPUs of the pool that no running pod uses, while the reservation is in force."""
    # Only while kube-state-metrics answers: without it nothing would look in use.
    expr = (f"(vector({pool.reserved_gpus}) - ({gpus_in_use(pool.name, label_prefix)})) "
            "and on () group(kube_node_labels)")
    reservation = pool.reservation
    if reservation.start_time is not None:
        expr = f"({expr}) and on () (vector(time()) >= {int(reservation.start_time.timestamp())})"
    if reservation.end_time is not None:
        expr = f"({expr}) and on () (vector(time()) < {int(reservation.end_time.timestamp())})"
    return expr


def reservation_idle_rules(pools: Sequence[ReservedPool], idle_minutes: int, label_prefix: str,
                           ) -> list[dict[str, Any]]:
    """One alert per reserved GPU pool: some of its reserved GPUs ran no pod for `idle_minutes`."""
    rules = []
    for pool in pools:
        if not pool.gpus_per_node:
            continue
        reservation = pool.reservation
        rules.append({
            "alert": "ReservedGpusIdle",
            "expr": f"({idle_reserved_gpus(pool, label_prefix)}) > 0",
            "for": f"{idle_minutes}m",
            "labels": {"severity": "warning", "pool": pool.name, "reservation": reservation.id},
            "annotations": {
                "summary": f"Reserved GPUs of pool {pool.name} idle for {idle_minutes}m",
                "description": f"{{{{ $value }}}} of the {pool.reserved_gpus} GPUs reservation {reservation.id} "
                               f"holds ran no pod for {idle_minutes}m; the reservation bills them anyway. Queue "
                               f"Jobs (Kueue fills flavor reserved-{pool.name} first), or keep the pool's nodes up "
                               "(minSize) and its maxSize at the reserved count.",
                "runbook_url": RUNBOOK,
            },
        })
    return rules


def reservation_groups(pools: Sequence[ReservedPool], lead_minutes: int, idle_minutes: int = 30,
                       label_prefix: str = "ml-cluster.io") -> list[dict[str, Any]]:
    rules = [*reservation_end_rules(pools, lead_minutes),
             *reservation_idle_rules(pools, idle_minutes, label_prefix)]
    return [{"name": RESERVATION_GROUP, "rules": rules}] if rules else []


def _utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")
