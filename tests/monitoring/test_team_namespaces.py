"""Tenant teams' Jobs are watched like the training namespace's: the PodMonitor scrapes their namespaces, and the
training alerts match them (and no other namespace). promtool on synthetic kube-state-metrics and DCGM series."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.monitoring import AlertThresholds, MonitoringConfig
from infra.monitoring.alerts import alert_rules, namespace_match
from infra.monitoring.component import monitoring_manifests
from infra.monitoring.teams import TEAM_GPUS_HELD, team_rule_groups
from tests.monitoring.prom import PROMTOOL

TEAMS = ("team-language", "team-vision")


def test_one_namespace_renders_as_before_and_several_as_one_matcher() -> None:
    assert namespace_match("training") == 'namespace="training"'
    assert namespace_match(("training",)) == 'namespace="training"'
    assert namespace_match(("training", *TEAMS)) == 'namespace=~"training|team-language|team-vision"'
    plain = [rule.expr for rule in alert_rules(AlertThresholds(), "training")]
    assert plain == [rule.expr for rule in alert_rules(AlertThresholds(), "training", ())]
    assert all("team-" not in expr for expr in plain)


def test_the_pod_monitor_scrapes_the_team_namespaces() -> None:
    cfg = MonitoringConfig.model_validate({"enabled": True})
    monitor = next(m for m in monitoring_manifests(cfg, "prod", "ml-cluster.io", "training", 8,
                                                   team_namespaces=TEAMS) if m["kind"] == "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["training", *TEAMS]}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (make setup puts Debian's in .tools)")
def test_a_team_pod_stuck_pending_fires_and_a_pod_of_another_namespace_does_not(tmp_path: Path) -> None:
    thresholds = AlertThresholds()
    rules = [r.to_rule() for r in alert_rules(thresholds, "training", TEAMS)
             if r.name in ("TrainingJobStuckPending", "TrainingGpuIdle")]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "t", "rules": rules}]}))
    minutes = thresholds.pending_minutes + 5
    series: list[dict[str, Any]] = []
    for namespace in ("team-vision", "kube-system"):
        series.append({"series": f'kube_pod_status_phase{{namespace="{namespace}", pod="p", phase="Pending"}}',
                       "values": f"1x{minutes}"})
        # a GPU at 0% held by a trainer that has not finished
        series.append({"series": f'DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}", pod="g", gpu="0"}}',
                       "values": f"0x{minutes}"})
        series.append({"series": f'ml_train_done{{namespace="{namespace}", pod="g"}}', "values": f"0x{minutes}"})
    pending = next(r for r in rules if r["alert"] == "TrainingJobStuckPending")
    idle = next(r for r in rules if r["alert"] == "TrainingGpuIdle")

    def expected(rule: dict[str, Any], pod: str, value: str) -> dict[str, Any]:
        description = (rule["annotations"]["description"].replace("{{ $labels.namespace }}", "team-vision")
                       .replace("{{ $labels.pod }}", pod).replace("{{ $value | humanizePercentage }}", value))
        return {"exp_labels": {"alertname": rule["alert"], "severity": "warning", "namespace": "team-vision",
                               "pod": pod},
                "exp_annotations": {"summary": rule["annotations"]["summary"], "description": description}}

    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "alert_rule_test": [
            {"eval_time": f"{minutes}m", "alertname": "TrainingJobStuckPending",
             "exp_alerts": [expected(pending, "p", "")]},
            {"eval_time": f"{minutes}m", "alertname": "TrainingGpuIdle", "exp_alerts": [expected(idle, "g", "0%")]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run([str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_stack_without_teams_records_nothing_per_team() -> None:
    assert team_rule_groups(()) == []
    cfg = MonitoringConfig.model_validate({"enabled": True})
    [rule] = [m for m in monitoring_manifests(cfg, "dev", "ml-cluster.io", "training", 1)
              if m["kind"] == "PrometheusRule"]
    assert "ml-cluster-teams" not in [group["name"] for group in rule["spec"]["groups"]]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (make setup puts Debian's in .tools)")
def test_gpus_held_per_team_average_to_gpu_hours_zero_included(tmp_path: Path) -> None:
    """Over an hour: team-vision holds 2 GPUs for the first 30 minutes, then none (no DCGM series with its
    namespace); team-language none at all; a GPU in `training` is no team's. The average over the hour is 1 GPU
    for vision (1 GPU-hour), 0 for language (not absent, so it counts in an average)."""
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": team_rule_groups(TEAMS)}))
    series: list[dict[str, Any]] = [
        *[{"series": f'DCGM_FI_DEV_GPU_UTIL{{namespace="team-vision", pod="v", gpu="{gpu}"}}',
           "values": "90x29 stale"} for gpu in (0, 1)],  # released at minute 30: the scrape marks it stale
        {"series": 'DCGM_FI_DEV_GPU_UTIL{namespace="training", pod="t", gpu="0"}', "values": "50x60"},
        *[{"series": f'kube_namespace_created{{namespace="{namespace}"}}', "values": "1x60"}
          for namespace in (*TEAMS, "training")],
    ]
    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": TEAM_GPUS_HELD, "eval_time": "10m", "exp_samples": [
                {"labels": f'{TEAM_GPUS_HELD}{{namespace="team-language"}}', "value": 0},
                {"labels": f'{TEAM_GPUS_HELD}{{namespace="team-vision"}}', "value": 2}]},
            {"expr": TEAM_GPUS_HELD, "eval_time": "40m", "exp_samples": [
                {"labels": f'{TEAM_GPUS_HELD}{{namespace="team-language"}}', "value": 0},
                {"labels": f'{TEAM_GPUS_HELD}{{namespace="team-vision"}}', "value": 0}]},
            # [59m] at minute 59 holds the 60 one-minute evaluations 0..59 (both ends included): one hour
            {"expr": f"avg_over_time({TEAM_GPUS_HELD}[59m])", "eval_time": "59m", "exp_samples": [
                {"labels": '{namespace="team-language"}', "value": 0},
                {"labels": '{namespace="team-vision"}', "value": 1}]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run([str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
