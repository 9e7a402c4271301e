"""The reserved-capacity end alert: quiet until its lead time before the reservation's endTime, firing from then on,
checked with promtool on a clock that starts at the Unix epoch; the stack's PrometheusRule carries it only for
reserved pools with an end time."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.monitoring import MonitoringConfig
from infra.config.nodepools import NodePoolConfig
from infra.monitoring.component import monitoring_manifests
from infra.monitoring.reservations import RESERVATION_GROUP, reservation_groups
from tests.monitoring.prom import PROMTOOL

END = datetime(1970, 1, 1, 3, 0, tzinfo=UTC)  # promtool's clock starts at 0: the block ends at 3h


def pool(end: datetime | None) -> NodePoolConfig:
    return NodePoolConfig.model_validate({
        "name": "h100-block", "instanceTypes": ["p5.48xlarge"], "gpu": True, "capacityType": "CAPACITY_BLOCK",
        "maxSize": 2, "capacityReservation": {"id": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b",
                                              "instanceCount": 2, **({"endTime": end.isoformat()} if end else {})}})


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (make setup puts Debian's in .tools)")
def test_the_alert_fires_from_its_lead_time_before_the_end(tmp_path: Path) -> None:
    groups = reservation_groups([pool(END)], 60)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    annotations = groups[0]["rules"][0]["annotations"]
    labels = {"alertname": "ReservedCapacityEnding", "severity": "warning", "pool": "h100-block",
              "reservation": "cr-0123456789abcdef0"}

    def at(minutes: int, firing: bool) -> dict[str, Any]:
        return {"eval_time": f"{minutes}m", "alertname": "ReservedCapacityEnding",
                "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}] if firing else []}

    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": [],
        "alert_rule_test": [at(60, False), at(119, False), at(121, True), at(180, True)]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run([str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_reserved_pools_with_an_end_get_the_alert() -> None:
    assert reservation_groups([pool(None)], 60) == []
    cfg = MonitoringConfig(enabled=True)
    [rule_object] = [m for m in monitoring_manifests(cfg, "prod", "ml-cluster.io", "training", 8, [pool(END)])
                     if m["kind"] == "PrometheusRule"]
    [group] = [g for g in rule_object["spec"]["groups"] if g["name"] == RESERVATION_GROUP]
    [rule] = group["rules"]
    assert rule["expr"] == f"vector(time()) > {int(END.timestamp()) - 3600}"
    assert rule["annotations"]["runbook_url"].endswith("#reserved-capacity-capacity-blocks-and-on-demand-capacity-"
                                                       "reservations")
