"""GPU-health alerts: `promtool test rules` on synthetic DCGM and kube-state-metrics series (fatal XIDs fire after
their `for`, application XIDs below the threshold stay quiet), the real Prometheus evaluating them, and every alert's
runbook section and XID row present in docs/monitoring.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.monitoring import AlertThresholds
from infra.monitoring.alerts import GPU_HEALTH_GROUP, rule_groups
from infra.monitoring.gpu_alerts import gpu_health_rules
from infra.monitoring.xid import XIDS
from infra.nodes.dcgm_metrics import exported_names
from tests.monitoring.prom import PROMETHEUS, PROMTOOL, prometheus, static_exporter

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "monitoring.md").read_text()
RULES = {rule.name: rule for rule in gpu_health_rules(AlertThresholds())}
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                      reason="prometheus/promtool not on PATH (make setup puts Debian's in .tools)")


def _anchors(markdown: str) -> set[str]:
    return {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_every_alert_links_a_runbook_section_that_exists() -> None:
    anchors = _anchors(DOCS)
    for rule in RULES.values():
        assert rule.runbook in anchors, (rule.name, rule.runbook)


def test_the_docs_table_is_the_xid_table() -> None:
    for xid in XIDS:
        assert re.search(rf"^\| {xid.code} \| `{xid.mnemonic}` \|.*\| {xid.nvidia_action} \| \*\*{xid.action}\*\* \|",
                         DOCS, re.M), xid.code


def test_every_series_the_alerts_read_from_dcgm_is_exported() -> None:
    read = set()
    for rule in RULES.values():
        read |= set(re.findall(r"\bDCGM_\w+", rule.expr))
    assert read <= exported_names(), read - exported_names()


def _render(template: str, labels: dict[str, str], value: float) -> str:
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    return text.replace("{{ $value }}", f"{value:g}")


def _expect(name: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    rule = RULES[name].to_rule()
    return {"exp_labels": {**labels, **rule["labels"]},
            "exp_annotations": {key: _render(text, labels, value) for key, text in rule["annotations"].items()}}


GPU = {f"g{i}": {"Hostname": "node-a", "gpu": str(i), "UUID": f"GPU-{i}"} for i in range(8)}


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def _unit_test() -> dict[str, Any]:
    count = 'label_ml_cluster_io_gpu_count'
    series = [
        _series("DCGM_FI_DEV_XID_ERRORS", GPU["g0"], "0 0 0 79x30"),  # fatal: replace
        _series("DCGM_FI_DEV_XID_ERRORS", GPU["g1"], "13x33"),  # the application's: quiet
        _series("DCGM_FI_DEV_XID_ERRORS", GPU["g2"], "0 48 45x31"),  # 48, then 45 overwrites it: still 48
        _series("DCGM_FI_DEV_XID_ERRORS", GPU["g3"], "0 0 119x31"),  # reset
        _series("DCGM_FI_DEV_XID_ERRORS", GPU["g4"], "0 0 999x31"),  # not in the table
        _series("DCGM_EXP_XID_ERRORS_COUNT", {**GPU["g1"], "xid": "13"}, "2x33"),  # below the threshold: quiet
        _series("DCGM_EXP_XID_ERRORS_COUNT", {**GPU["g5"], "xid": "31"}, "9x33"),  # above it
        _series("DCGM_FI_DEV_ROW_REMAP_FAILURE", GPU["g6"], "0 0 1x31"),
        _series("DCGM_FI_DEV_ROW_REMAP_FAILURE", GPU["g7"], "0x33"),
        _series("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", GPU["g7"], "0 0 0 5x30"),
        _series("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", GPU["g7"], "0x33"),
        # an 8-GPU node offering 7, one offering 8, a 4-GPU node whose device plugin offers nothing
        _series("kube_node_labels", {"node": "node-b", count: "8"}, "1x33"),
        _series("kube_node_status_allocatable", {"node": "node-b", "resource": "nvidia_com_gpu"}, "8 8 7x31"),
        _series("kube_node_labels", {"node": "node-c", count: "8"}, "1x33"),
        _series("kube_node_status_allocatable", {"node": "node-c", "resource": "nvidia_com_gpu"}, "8x33"),
        _series("kube_node_labels", {"node": "node-d", count: "4"}, "1x33"),
    ]
    g2_48 = _expect("GpuXid48", GPU["g2"], 1)
    alerts = [
        {"eval_time": "3m", "alertname": "GpuXid79", "exp_alerts": []},  # pending, not yet for 1m
        {"eval_time": "5m", "alertname": "GpuXid79", "exp_alerts": [_expect("GpuXid79", GPU["g0"], 1)]},
        {"eval_time": "30m", "alertname": "GpuXid13", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "GpuXid48", "exp_alerts": [g2_48]},
        {"eval_time": "3m", "alertname": "GpuXid119", "exp_alerts": []},
        {"eval_time": "5m", "alertname": "GpuXid119", "exp_alerts": [_expect("GpuXid119", GPU["g3"], 1)]},
        {"eval_time": "5m", "alertname": "GpuXidUnknown", "exp_alerts": [_expect("GpuXidUnknown", GPU["g4"], 999)]},
        {"eval_time": "4m", "alertname": "GpuApplicationXidsFrequent", "exp_alerts": []},
        {"eval_time": "8m", "alertname": "GpuApplicationXidsFrequent",
         "exp_alerts": [_expect("GpuApplicationXidsFrequent", {**GPU["g5"], "xid": "31"}, 9)]},
        {"eval_time": "5m", "alertname": "GpuRowRemapFailure", "exp_alerts": [_expect("GpuRowRemapFailure",
                                                                                      GPU["g6"], 1)]},
        {"eval_time": "2m", "alertname": "GpuNvlinkErrors", "exp_alerts": []},
        {"eval_time": "3m", "alertname": "GpuMissingFromAllocatable", "exp_alerts": []},
        {"eval_time": "13m", "alertname": "GpuMissingFromAllocatable", "exp_alerts": [
            _expect("GpuMissingFromAllocatable", {"node": "node-b"}, 7),
            _expect("GpuMissingFromAllocatable", {"node": "node-d"}, 0)]},
    ]
    return {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}]}


@needs_prometheus
def test_promtool_fires_fatal_xids_after_their_for_and_keeps_benign_ones_quiet(tmp_path: Path) -> None:
    groups = [group for group in rule_groups(AlertThresholds(), "training") if group["name"] == GPU_HEALTH_GROUP]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    (tmp_path / "test.yml").write_text(yaml.safe_dump(_unit_test(), sort_keys=False))
    result = subprocess.run([str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


DCGM_TEXT = """\
DCGM_FI_DEV_XID_ERRORS{Hostname="node-a",gpu="0",UUID="GPU-0"} 79
DCGM_FI_DEV_XID_ERRORS{Hostname="node-a",gpu="1",UUID="GPU-1"} 13
DCGM_FI_DEV_XID_ERRORS{Hostname="node-a",gpu="2",UUID="GPU-2"} 0
DCGM_EXP_XID_ERRORS_COUNT{Hostname="node-a",gpu="1",UUID="GPU-1",xid="13"} 2
"""


@needs_prometheus
def test_the_real_prometheus_evaluates_them(tmp_path: Path) -> None:
    groups = [group for group in rule_groups(AlertThresholds(), "training") if group["name"] == GPU_HEALTH_GROUP]
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    with static_exporter(DCGM_TEXT) as port:
        targets = [{"job_name": "dcgm", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
        with prometheus(tmp_path / "prom", targets, [rules]) as server:
            pending = server.wait_for('ALERTS{alertname=~"GpuXid.*"}', lambda result: len(result) > 0)
            assert {(a["metric"]["alertname"], a["metric"]["gpu"]) for a in pending} == {("GpuXid79", "0")}
            assert server.query('ALERTS{alertname="GpuApplicationXidsFrequent"}')["data"]["result"] == []
