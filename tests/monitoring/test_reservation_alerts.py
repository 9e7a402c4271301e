"""Reserved-capacity alerts, checked with promtool on a clock that starts at the Unix epoch and on the real
Prometheus: the end alert is quiet until its lead time before the reservation's endTime and fires from then on; the
idle alert fires when reserved GPUs ran no pod for its threshold (GPUs on nodes no pod asked for, and reserved GPUs
with no node at all), only between the reservation's start and end, and never counts pending pods or other pools'
nodes. The stack's PrometheusRule carries them only for reserved pools."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.monitoring import MonitoringConfig
from infra.config.nodepools import CapacityReservationConfig
from infra.monitoring.component import kps_values, monitoring_manifests
from infra.monitoring.reservations import RESERVATION_GROUP, ReservedPool, idle_reserved_gpus, reservation_groups
from tests.monitoring.prom import PROMETHEUS, PROMTOOL, prometheus, static_exporter

START = datetime(1970, 1, 1, 1, 0, tzinfo=UTC)  # promtool's clock starts at 0: the block runs from 1h
END = datetime(1970, 1, 1, 4, 0, tzinfo=UTC)  # to 4h
LABELS = {"severity": "warning", "pool": "h100-block", "reservation": "cr-0123456789abcdef0"}
needs_promtool = pytest.mark.skipif(PROMTOOL is None,
                                    reason="promtool not on PATH (make setup puts Debian's in .tools)")


def pool(end: datetime | None, start: datetime | None = None, gpus_per_node: int = 8) -> ReservedPool:
    """A Capacity Block of 2 p5.48xlarge: 16 GPUs."""
    reservation = CapacityReservationConfig.model_validate({
        "id": "cr-0123456789abcdef0", "availabilityZone": "us-east-1b", "instanceCount": 2,
        **({"endTime": end.isoformat()} if end else {}), **({"startTime": start.isoformat()} if start else {})})
    return ReservedPool("h100-block", reservation, gpus_per_node)


def promtool_test(tmp_path: Path, groups: list[dict[str, Any]], series: list[dict[str, str]],
                  checks: list[dict[str, Any]]) -> None:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series, "alert_rule_test": checks}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run([str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_end_alert_fires_from_its_lead_time_before_the_end(tmp_path: Path) -> None:
    groups = reservation_groups([pool(END, gpus_per_node=0)], 60)
    [rule] = groups[0]["rules"]
    assert rule["alert"] == "ReservedCapacityEnding"

    def at(minutes: int, firing: bool) -> dict[str, Any]:
        return {"eval_time": f"{minutes}m", "alertname": "ReservedCapacityEnding",
                "exp_alerts": [{"exp_labels": LABELS, "exp_annotations": rule["annotations"]}] if firing else []}

    promtool_test(tmp_path, groups, [], [at(120, False), at(179, False), at(181, True), at(240, True)])


def _ksm(metric: str, values: str, **labels: str) -> dict[str, str]:
    return {"series": metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


# kube-state-metrics over 5 hours, one sample a minute (promtool: `_xN` is N missing samples, `vxN` N+1 of v).
# node-a (pool h100-block) runs pod a (8 GPUs) throughout; node-b joins at 120m and runs pod b (8 GPUs) from 120m
# to 180m; pod c is Pending (no node), pod done has finished on node-a (its requests are still exported until it is
# deleted); node-z of another pool runs pod z.
KSM_SERIES = [
    _ksm("kube_node_labels", "1x300", node="node-a", label_ml_cluster_io_pool="h100-block"),
    _ksm("kube_node_labels", "_x120 1x180", node="node-b", label_ml_cluster_io_pool="h100-block"),
    _ksm("kube_node_labels", "1x300", node="node-z", label_ml_cluster_io_pool="gpu-h100"),
    _ksm("kube_pod_status_phase", "1x300", namespace="training", pod="a", phase="Running"),
    _ksm("kube_pod_status_phase", "_x120 1x60", namespace="training", pod="b", phase="Running"),
    _ksm("kube_pod_status_phase", "0x300", namespace="training", pod="c", phase="Running"),
    _ksm("kube_pod_status_phase", "1x300", namespace="training", pod="c", phase="Pending"),
    _ksm("kube_pod_status_phase", "1x300", namespace="training", pod="z", phase="Running"),
    _ksm("kube_pod_status_phase", "0x300", namespace="training", pod="done", phase="Running"),
    _ksm("kube_pod_status_phase", "1x300", namespace="training", pod="done", phase="Succeeded"),
    _ksm("kube_pod_container_resource_requests", "8x300", namespace="training", pod="a", container="train",
         node="node-a", resource="nvidia_com_gpu", unit="integer"),
    _ksm("kube_pod_container_resource_requests", "_x120 8x60", namespace="training", pod="b", container="train",
         node="node-b", resource="nvidia_com_gpu", unit="integer"),
    _ksm("kube_pod_container_resource_requests", "8x300", namespace="training", pod="c", container="train",
         node="", resource="nvidia_com_gpu", unit="integer"),
    _ksm("kube_pod_container_resource_requests", "8x300", namespace="training", pod="done", container="train",
         node="node-a", resource="nvidia_com_gpu", unit="integer"),
    _ksm("kube_pod_container_resource_requests", "8x300", namespace="training", pod="z", container="train",
         node="node-z", resource="nvidia_com_gpu", unit="integer"),
]


@needs_promtool
def test_the_idle_alert_fires_for_reserved_gpus_no_pod_uses_within_the_reservation(tmp_path: Path) -> None:
    groups = reservation_groups([pool(END, START)], 60, idle_minutes=30)
    [rule] = [r for r in groups[0]["rules"] if r["alert"] == "ReservedGpusIdle"]
    assert rule["for"] == "30m"

    def at(minutes: int, idle: int | None) -> dict[str, Any]:
        annotations = {**rule["annotations"],
                       "description": rule["annotations"]["description"].replace("{{ $value }}", str(idle))}
        return {"eval_time": f"{minutes}m", "alertname": "ReservedGpusIdle",
                "exp_alerts": [{"exp_labels": LABELS, "exp_annotations": annotations}] if idle else []}

    promtool_test(tmp_path, groups, KSM_SERIES, [
        at(50, None),  # 8 idle (node-b missing) since 0m, but the block starts at 60m
        at(85, None),  # idle since the start: pending for 25m of its 30m
        at(95, 8),  # 35m: the GPUs of the node that never came; pods c (Pending) and done (Succeeded) use none
        at(130, None),  # node-b runs pod b: all 16 in use
        at(230, 8),  # pod b ended at 180m (gone from the lookback at ~185m): idle again for 45m
        at(245, None),  # the block ended at 240m
    ])


def test_the_signal_counts_the_reservation_and_the_pools_nodes() -> None:
    expr = idle_reserved_gpus(pool(None), "ml-cluster.io")
    assert expr.startswith("(vector(16) - (sum(kube_pod_container_resource_requests{resource=\"nvidia_com_gpu\"}")
    assert expr.endswith(") and on () group(kube_node_labels)")  # kube-state-metrics down: no answer, not 16
    assert 'kube_node_labels{label_ml_cluster_io_pool="h100-block"}' in expr
    assert "time()" not in expr  # no start or end: always in force
    bounded = idle_reserved_gpus(pool(END, START), "ml-cluster.io")
    assert bounded.endswith(f"and on () (vector(time()) >= {int(START.timestamp())})) "
                            f"and on () (vector(time()) < {int(END.timestamp())})")


@pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None, reason="Debian's prometheus package is not installed")
def test_the_real_prometheus_evaluates_the_idle_alert(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": reservation_groups([pool(None)], 60, idle_minutes=30)}))
    checked = subprocess.run([str(PROMTOOL), "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0 and "SUCCESS: 1 rules found" in checked.stdout, checked.stdout + checked.stderr
    # the first minute of the promtool series: node-a runs pod a, node-b has not come, pod c pends, pod z elsewhere
    lines = []
    for entry in KSM_SERIES:
        first = entry["values"].split()[0]
        if not first.startswith("_"):
            lines.append(f"{entry['series']} {first.split('x')[0]}")
    with static_exporter("\n".join(lines) + "\n") as port:
        targets = [{"job_name": "kube-state-metrics", "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
        with prometheus(tmp_path / "prom", targets, [rules]) as server:
            # before the first scrape there is no kube-state-metrics, and no answer (not 16 idle)
            server.wait_for(idle_reserved_gpus(pool(None), "ml-cluster.io"),
                            lambda result: len(result) == 1 and result[0]["value"][1] == "8")
            [alert] = server.wait_for('ALERTS{alertname="ReservedGpusIdle"}', lambda result: len(result) == 1)
            assert alert["metric"]["alertstate"] == "pending" and alert["metric"]["pool"] == "h100-block"


def test_only_reserved_pools_get_the_alerts_and_their_pool_label_is_exported() -> None:
    assert reservation_groups([], 60) == []
    assert [r["alert"] for r in reservation_groups([pool(None)], 60)[0]["rules"]] == ["ReservedGpusIdle"]
    assert reservation_groups([pool(None, gpus_per_node=0)], 60) == []  # a CPU pool without an end: nothing
    cfg = MonitoringConfig.model_validate({"enabled": True, "alerts": {"reservedIdleMinutes": 45}})
    [rule_object] = [m for m in monitoring_manifests(cfg, "prod", "ml-cluster.io", "training", 8, [pool(END)])
                     if m["kind"] == "PrometheusRule"]
    [group] = [g for g in rule_object["spec"]["groups"] if g["name"] == RESERVATION_GROUP]
    end, idle = group["rules"]
    assert end["expr"] == f"vector(time()) > {int(END.timestamp()) - 3600}"
    assert idle["for"] == "45m"
    for rule in (end, idle):
        assert rule["annotations"]["runbook_url"].endswith("#reserved-capacity-capacity-blocks-and-on-demand-"
                                                           "capacity-reservations")
    allow = kps_values(cfg, "ml-cluster.io", reserved=True)["kube-state-metrics"]["metricLabelsAllowlist"]
    assert allow == ["nodes=[ml-cluster.io/gpu-count,ml-cluster.io/gpu-health,ml-cluster.io/pool]",
                     "pods=[app.kubernetes.io/instance]"]
    assert kps_values(cfg)["kube-state-metrics"]["metricLabelsAllowlist"] == [
        "nodes=[ml-cluster.io/gpu-count,ml-cluster.io/gpu-health]", "pods=[app.kubernetes.io/instance]"]


def test_a_reservation_that_ends_before_it_starts_is_a_config_error() -> None:
    with pytest.raises(ValueError, match="startTime must be before endTime"):
        pool(START, END)
