"""The Job controller's side of a gang, for the chaos harness and the rendering tests: what a rendered Job's
podFailurePolicy does with one failed pod.

Kubernetes 1.35 semantics (pkg/controller/job/pod_failure_policy.go): the rules are tried in order and the first
that matches decides; onExitCodes looks at the named container's terminated state and never matches exit code 0;
onPodConditions matches a condition of that type and status on the pod; a failed pod that matches no rule counts
against backoffLimit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

IGNORE, COUNT, FAIL_JOB, FAIL_INDEX = "Ignore", "Count", "FailJob", "FailIndex"


def pod_failure_action(job: dict[str, Any], container: str, exit_code: int | None,
                       conditions: Iterable[str] = ()) -> str:
    """The action for a pod whose `container` exited with `exit_code` (None: it never ran or has no exit code,
    e.g. its node vanished) and that carries the pod conditions `conditions` (types with status True)."""
    held = set(conditions)
    for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        codes = rule.get("onExitCodes")
        if codes is not None:
            if codes.get("containerName", container) != container or not exit_code:
                continue
            inside = exit_code in codes["values"]
            if inside == (codes["operator"] == "In"):
                return str(rule["action"])
            continue
        wanted = rule.get("onPodConditions", [])
        if any(item["type"] in held and item.get("status", "True") == "True" for item in wanted):
            return str(rule["action"])
    return COUNT
