"""TrainingJobRestarting: gang restarts per hour (failed pods created in the last hour over the Job's parallelism)
above `alerts.restartsPerHour` fire (the default and a stack's own value); a gang at the limit, or failed pods
older than an hour, do not.
Checked with promtool on synthetic kube-state-metrics series."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.monitoring import AlertThresholds
from infra.monitoring.alerts import alert_rules
from tests.monitoring.prom import PROMTOOL

NS = "training"


def _pod(job: str, pod: str, created_s: int, failed_from_min: int | None) -> list[dict[str, str]]:
    """kube-state-metrics series of one pod of `job` (created at `created_s` on promtool's clock, Failed from
    minute `failed_from_min`), over 90 one-minute samples."""
    labels = f'namespace="{NS}", pod="{pod}"'
    failed = "0x89" if failed_from_min is None else f"0x{failed_from_min} 1x{89 - failed_from_min}"
    return [
        {"series": f'kube_pod_created{{{labels}}}', "values": f"{created_s}x89"},
        {"series": f'kube_pod_owner{{{labels}, owner_kind="Job", owner_name="{job}", owner_is_controller="true"}}',
         "values": "1x89"},
        {"series": f'kube_pod_status_phase{{{labels}, phase="Failed"}}', "values": failed},
    ]


def test_the_limit_is_the_alerts_config_key() -> None:
    thresholds = AlertThresholds.model_validate({"restartsPerHour": 5})
    [rule] = [r for r in alert_rules(thresholds, NS) if r.name == "TrainingJobRestarting"]
    assert rule.comparison == "> 5"
    assert AlertThresholds().restarts_per_hour == 3
    with pytest.raises(ValueError, match="restartsPerHour"):
        AlertThresholds.model_validate({"restartsPerHour": 0})


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (make setup puts Debian's in .tools)")
@pytest.mark.parametrize("configured", [None, 1, 5])
def test_a_gang_restarting_more_than_the_limit_in_an_hour_fires(tmp_path: Path, configured: int | None) -> None:
    thresholds = (AlertThresholds() if configured is None
                  else AlertThresholds.model_validate({"restartsPerHour": configured}))
    limit = thresholds.restarts_per_hour
    [rule] = [r.to_rule() for r in alert_rules(thresholds, NS) if r.name == "TrainingJobRestarting"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "t", "rules": [rule]}]}))
    series: list[dict[str, Any]] = []
    for job, parallelism in (("flapping", 2), ("steady", 2)):
        series.append({"series": f'kube_job_spec_parallelism{{namespace="{NS}", job_name="{job}"}}',
                       "values": f"{parallelism}x89"})
    # restart n (2 failed pods each) of either Job: pods created at minute 10 + 10n, failed at minute 12 + 10n.
    # flapping restarts limit + 1 times, steady exactly limit times (at the limit: never fires).
    for job, restarts in (("flapping", limit + 1), ("steady", limit)):
        for number in range(restarts):
            for index in range(2):
                series += _pod(job, f"{job}-{number}-{index}", 600 + number * 600, 12 + number * 10)
    firing = [{"exp_labels": {"alertname": "TrainingJobRestarting", "severity": "warning", "namespace": NS,
                              "owner_name": "flapping"},
               "exp_annotations": {
                   "summary": rule["annotations"]["summary"],
                   "description": rule["annotations"]["description"]
                   .replace("{{ $labels.namespace }}", NS).replace("{{ $labels.owner_name }}", "flapping")
                   .replace("{{ $value }}", str(limit + 1))}}]
    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            # after restart number `limit` of flapping: at the limit
            {"eval_time": f"{10 * limit + 5}m", "alertname": "TrainingJobRestarting", "exp_alerts": []},
            # after restart limit + 1
            {"eval_time": f"{10 * limit + 15}m", "alertname": "TrainingJobRestarting", "exp_alerts": firing},
            # an hour after the first pods were created they no longer count: back to `limit` in the last hour
            {"eval_time": "75m", "alertname": "TrainingJobRestarting", "exp_alerts": []},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run([str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
