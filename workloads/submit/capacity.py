"""A gang waiting for capacity: Kueue admitted it on quota, some of its pods hold nodes, the others have none yet
(the autoscaler is adding nodes, or EC2 has none to give). Kueue evicts it when `waitForPodsReady.timeout` has
passed since its admission (kubernetes-sigs/kueue v0.19.2 pkg/controller/core/workload_controller.go:1662-1675),
so the line says what the wait holds and how long it has left. Pure: API JSON shapes in, a line out."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any


def _unscheduled(pod: dict[str, Any]) -> dict[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return condition
    return None


def _seconds(timestamp: str) -> float | None:
    try:
        return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def admitted_at(workload: dict[str, Any] | None) -> str | None:
    for condition in ((workload or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Admitted" and condition.get("status") == "True":
            return str(condition.get("lastTransitionTime") or "") or None
    return None


def waiting_for_capacity(active: Sequence[dict[str, Any]], gang: int, workload: dict[str, Any] | None,
                         now: float | None = None, gang_timeout_s: int | None = None) -> str | None:
    """The detail of an admitted gang some of whose pods cannot be scheduled; None when every pod has a node."""
    waiting = [condition for pod in active if (condition := _unscheduled(pod)) is not None]
    if not waiting:
        return None
    nodes = sorted({str(node) for pod in active if (node := (pod.get("spec") or {}).get("nodeName"))})
    why = str(waiting[0].get("message") or waiting[0].get("reason") or "unschedulable")
    line = (f"waiting for capacity: holds {len(nodes)} node(s)" + (f" ({', '.join(nodes)})" if nodes else "")
            + f", {len(waiting)} of {gang} pod(s) without a node ({why})")
    since = admitted_at(workload)
    start = _seconds(since) if since else None
    if gang_timeout_s is None or start is None or now is None:
        return line + "; Kueue evicts and requeues it at kueue.waitForPodsReady.timeout after its admission"
    left = max(gang_timeout_s - (now - start), 0.0) / 60
    return (line + f"; Kueue evicts and requeues it in {left:.1f} min (waitForPodsReady {gang_timeout_s / 60:g}m "
            f"from admission at {since})")
