"""One alert rule as data: the PromQL signal it watches, when it fires, and what it tells the reader.

The training alerts (infra/monitoring/alerts.py), the GPU-health alerts (gpu_alerts.py) and the reservation and team
alerts build their rules from it; `to_rule` is the Prometheus rule-file form (also PrometheusRule.spec.groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Runbook sections are linked from every GPU-health alert: the repository's docs, unless a stack hands out its own.
RUNBOOK = "docs/monitoring.md"


@dataclass(frozen=True)
class AlertRule:
    name: str
    signal: str  # the PromQL whose value is compared: the dashboards and tests query it on its own
    comparison: str  # "> 0.3"
    for_minutes: int
    severity: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)
    runbook: str = ""  # the anchor of the runbook section in docs/monitoring.md

    @property
    def expr(self) -> str:
        return f"({self.signal}) {self.comparison}"

    def to_rule(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": f"{self.for_minutes}m",
            "labels": {"severity": self.severity, **self.labels},
            "annotations": {"summary": self.summary, "description": self.description,
                            **({"runbook_url": f"{RUNBOOK}#{self.runbook}"} if self.runbook else {})},
        }
