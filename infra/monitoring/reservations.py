"""Alerts for reserved capacity that ends: a Capacity Block's instances are terminated at the block's end, whatever
runs on them. The end is a fact of the block (capacityReservation.endTime, which preflight compares with EC2's
EndDate), so the rule compares the clock with it and needs no exporter: `vector(time())` is above the threshold
from the lead time before the end on."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from infra.config.nodepools import NodePoolConfig

RESERVATION_GROUP = "ml-cluster-reserved-capacity"
RUNBOOK = "docs/operations.md#reserved-capacity-capacity-blocks-and-on-demand-capacity-reservations"


def reservation_end_rules(pools: Sequence[NodePoolConfig], lead_minutes: int) -> list[dict[str, Any]]:
    """One alert per pool whose reservation has an end time, firing from `lead_minutes` before it."""
    rules = []
    for pool in pools:
        reservation = pool.capacity_reservation
        if reservation is None or reservation.end_time is None:
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


def reservation_groups(pools: Sequence[NodePoolConfig], lead_minutes: int) -> list[dict[str, Any]]:
    rules = reservation_end_rules(pools, lead_minutes)
    return [{"name": RESERVATION_GROUP, "rules": rules}] if rules else []


def _utc(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC")
