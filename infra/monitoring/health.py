"""What to do with a GPU node, decided from its history: node conditions (the EKS node monitoring agent's) and the
XIDs its GPUs raised. Pure: a timeline in, an action out; the runbook and any controller apply it.

Built so that no pattern starves it:
- a condition that flaps (unhealthy, healthy, unhealthy...) never stays unhealthy for EKS's repair wait, so repair
  never acts on it; here `flap_limit` transitions into unhealthy within `window_minutes` drain the node whatever its
  state at the moment;
- a reset that does not help (the same reset-class XID `reset_limit` times in the window) escalates to replace;
- several faults at once: the strongest action wins and every reason is reported;
- healthy observations after a fatal XID do not clear it within the window (the GPU may simply have vanished).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from infra.monitoring.xid import ACTION_ORDER, BY_CODE, XidAction, action_of
from infra.nodes.repair import ACCELERATED_CONDITION, ACCELERATED_OVERRIDES

REPAIR_TO_ACTION: dict[str, XidAction] = {"Replace": "replace", "Reboot": "reset", "NoAction": "ignore"}
OVERRIDE_ACTIONS = {override.reason: REPAIR_TO_ACTION[override.action] for override in ACCELERATED_OVERRIDES}


@dataclass(frozen=True)
class Observation:
    minute: float
    # unhealthy conditions at this moment: condition type -> the agent's reason (absent: healthy)
    conditions: dict[str, str] = field(default_factory=dict)
    xids: tuple[int, ...] = ()  # XIDs raised since the previous observation


@dataclass(frozen=True)
class Decision:
    action: XidAction
    reasons: tuple[str, ...]


def _stronger(a: XidAction, b: XidAction) -> XidAction:
    return a if ACTION_ORDER[a] >= ACTION_ORDER[b] else b


def decide(history: Sequence[Observation], now: float, window_minutes: float = 60, flap_limit: int = 3,
           reset_limit: int = 2, app_limit: int = 5) -> Decision:
    recent = sorted((o for o in history if now - window_minutes <= o.minute <= now), key=lambda o: o.minute)
    action: XidAction = "ignore"
    reasons: list[str] = []

    def raise_to(new: XidAction, why: str) -> None:
        nonlocal action
        action = _stronger(action, new)
        if new != "ignore":
            reasons.append(f"{why}: {new}")

    counts: dict[int, int] = {}
    for observation in recent:
        for code in observation.xids:
            counts[code] = counts.get(code, 0) + 1
    for code, count in sorted(counts.items()):
        xid_action = action_of(code)
        known = code in BY_CODE
        if xid_action == "ignore":
            if count >= app_limit:
                raise_to("drain", f"XID {code} x{count} (application-class, frequent)")
        elif xid_action == "reset" and count >= reset_limit:
            raise_to("replace", f"XID {code} x{count} (reset did not help)")
        else:
            raise_to(xid_action, f"XID {code}" + ("" if known else " (not in the table)"))

    current = recent[-1].conditions if recent else {}
    for condition, reason in sorted(current.items()):
        if condition == ACCELERATED_CONDITION:
            raise_to(OVERRIDE_ACTIONS.get(reason, "drain"), f"{condition}/{reason}")
        else:
            raise_to("drain", f"{condition}/{reason}")

    previous: dict[str, str] = {}
    flaps: dict[str, int] = {}
    for observation in recent:
        for condition in observation.conditions:
            if condition not in previous:
                flaps[condition] = flaps.get(condition, 0) + 1
        previous = observation.conditions
    for condition, count in sorted(flaps.items()):
        if count >= flap_limit:
            raise_to("drain", f"{condition} flapped x{count}")
    return Decision(action, tuple(reasons))
