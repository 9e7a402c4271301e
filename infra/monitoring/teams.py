"""What the tenant teams use of the GPUs, for charge-back: a recording rule of the GPUs each team namespace holds.

dcgm-exporter labels a GPU's series with the `namespace` and `pod` of the workload holding it (pod mapping, scraped
with honorLabels), so counting `DCGM_FI_DEV_GPU_UTIL` series per namespace counts the GPUs held there. A team
holding none would have no series at all, and an average over time would skip those stretches; the rule adds 0
for each team namespace kube-state-metrics knows (`kube_namespace_created`). GPU-hours over a window W are then
`avg_over_time(ml_cluster:team_gpus_held[W])` x the hours of W (docs/tenancy.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from infra.monitoring.alerts import namespace_match

TEAM_GROUP = "ml-cluster-teams"
TEAM_GPUS_HELD = "ml_cluster:team_gpus_held"


def team_gpus_held(team_namespaces: Sequence[str]) -> str:
    match = namespace_match(team_namespaces)
    return (f"count by (namespace) (DCGM_FI_DEV_GPU_UTIL{{{match}}})"
            f" or on (namespace) (0 * group by (namespace) (kube_namespace_created{{{match}}}))")


def team_rule_groups(team_namespaces: Sequence[str]) -> list[dict[str, Any]]:
    """The recording group, or none for a stack without tenant teams."""
    if not team_namespaces:
        return []
    return [{"name": TEAM_GROUP, "rules": [{"record": TEAM_GPUS_HELD, "expr": team_gpus_held(team_namespaces)}]}]
