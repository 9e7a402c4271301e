"""`--cost`: the worst case of one partial-gang wait per GPU pool (all nodes but one came up), by hand: idle nodes x
the node's hourly price x the minutes that bound the wait (Kueue's gang timeout, or on a topology flavor the
autoscaler's 10-minute booking plus its scale-down-unneeded-time)."""

from __future__ import annotations

from infra.plan.holdings import Pool
from infra.plan.partialgang import format_partial_gangs, partial_gangs

H100 = Pool("gpu-h100", "p5.48xlarge", "ON_DEMAND", (0, 0, 16), ("us-east-1a",), 8, {})
A100 = Pool("gpu-a100", "p4d.24xlarge", "SPOT", (0, 0, 8), ("us-east-1a",), 8, {})
BLOCK = Pool("h100-block", "p5.48xlarge", "CAPACITY_BLOCK", (0, 0, 2), ("us-east-1a",), 8, {}, reserved=2)
SOLO = Pool("gpu-solo", "g5.xlarge", "ON_DEMAND", (0, 0, 1), ("us-east-1a",), 1, {})
PRICES = {"gpu-h100": 55.04, "gpu-a100": 11.07, "h100-block": 31.46, "gpu-solo": 1.0}


def row(pool: str, topology: bool) -> dict[str, str]:
    return {"pool": pool, "timedFrom": "admission after Ready nodes" if topology else "admission on quota"}


def test_one_wait_per_gpu_pool_costs_idle_nodes_times_price_times_its_bound() -> None:
    plan = {"outputs": {"coldStart": {"timeout": "20m", "scaleDownUnneededTime": "20m", "pools": [
        row("gpu-h100", True), row("gpu-a100", False), row("h100-block", False), row("gpu-solo", False)]}}}
    lines = partial_gangs(plan, [H100, A100, BLOCK, SOLO], lambda pool: PRICES[pool.name])
    # the Capacity Block is prepaid and a one-node pool has no partial gang
    assert [line.pool for line in lines] == ["gpu-h100", "gpu-a100"]
    h100, a100 = lines
    assert (h100.idle_nodes, h100.minutes, h100.bounded_by) == (15, 30, "booking 10m + scale-down 20m")
    assert h100.cost == 412.80  # 15 x $55.04 x 0.5 h
    assert (a100.idle_nodes, a100.minutes, a100.bounded_by) == (7, 20, "waitForPodsReady 20m")
    assert a100.cost == 25.83  # 7 x $11.07 x 20/60 h = 25.83
    text = format_partial_gangs(lines, lambda value: f"${value:,.2f}")
    assert text[4].split() == ["gpu-a100", "7", "$11.07", "20", "waitForPodsReady", "20m", "$25.83"]
    # no Kueue: nothing bounds the wait, no line
    plan["outputs"]["coldStart"]["timeout"] = None
    assert [line.pool for line in partial_gangs(plan, [A100], lambda pool: 1.0)] == []
