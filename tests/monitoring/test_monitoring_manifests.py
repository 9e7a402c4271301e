"""The objects the Monitoring component applies beside kube-prometheus-stack, checked against the CRDs of the
pinned chart (tests/charts/upstream) strictly, and against what the Job renderer declares."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.config.monitoring import MonitoringConfig, RemoteWriteConfig
from infra.monitoring.alerts import alert_rules
from infra.monitoring.component import kps_values, monitoring_manifests
from infra.monitoring.dashboard import DASHBOARD_UID, panel_queries
from tests.jobs.facts import prod_facts
from tests.jobs.jobrules import validate_strict
from tests.jobs.test_jobspec import S3_COPY, spec
from tests.monitoring.crds import kps_crds, render_charts
from workloads.jobspec import render_job


def _crds() -> dict:
    return kps_crds()


def _manifests(**config: Any) -> dict[str, dict]:
    cfg = MonitoringConfig(enabled=True, **config)
    return {m["kind"]: m for m in monitoring_manifests(cfg, "prod", "ml-cluster.io", "training", 8)}


def test_monitors_and_rules_are_valid_for_the_pinned_operator() -> None:
    manifests = _manifests()
    assert set(manifests) == {"PodMonitor", "PrometheusRule", "ConfigMap"}
    for kind in ("PodMonitor", "PrometheusRule"):
        assert render_charts().validate_custom(manifests[kind], _crds()) == [], kind
    validate_strict(manifests["ConfigMap"])
    typo = json.loads(json.dumps(manifests["PodMonitor"]))
    typo["spec"]["podMetricsEndpoints"][0]["relabellings"] = []
    assert render_charts().validate_custom(typo, _crds()) == [
        "spec.podMetricsEndpoints.0: Additional properties are not allowed ('relabellings' was unexpected)"]


def test_pod_monitor_scrapes_every_metrics_port_a_training_pod_declares() -> None:
    job, *_ = render_job(spec(gpus=8, gpuType="h100", nodes=2, dataset=S3_COPY), prod_facts())
    template = job["spec"]["template"]
    pod = template["spec"]
    declared = {p["name"] for c in pod["containers"] + pod["initContainers"] for p in c.get("ports", [])
                if p["name"].startswith("metrics-")}
    monitor = _manifests()["PodMonitor"]["spec"]
    assert {endpoint["port"] for endpoint in monitor["podMetricsEndpoints"]} == declared
    assert monitor["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert monitor["namespaceSelector"] == {"matchNames": [job["metadata"]["namespace"]]}
    targets = {r["targetLabel"] for r in monitor["podMetricsEndpoints"][0]["relabelings"]}
    assert targets == {"job_name", "node"}  # the labels the dashboard and the alerts group by


def test_rule_and_dashboard_carry_every_alert_and_query() -> None:
    manifests = _manifests(alerts={"dataWaitShare": 0.2})
    rules = manifests["PrometheusRule"]["spec"]["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [r.name for r in alert_rules(MonitoringConfig().alerts, "training")]
    starved = next(r for r in rules if r["alert"] == "TrainingDataStarved")
    assert starved["expr"].endswith("> 0.2") and starved["for"] == "10m"
    config_map = manifests["ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(next(iter(config_map["data"].values())))
    assert dashboard["uid"] == DASHBOARD_UID
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets") or []]
    assert exprs == panel_queries() and len(exprs) >= 10


def test_remote_write_mode_sends_samples_out_and_drops_grafana() -> None:
    cfg = MonitoringConfig(enabled=True, mode="remote-write", remote_write=RemoteWriteConfig(
        url="https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-1/api/v1/remote_write",
        sigv4_region="us-west-2"))
    values = kps_values(cfg)
    assert values["prometheus"]["prometheusSpec"]["remoteWrite"] == [{
        "url": cfg.remote_write.url, "sigv4": {"region": "us-west-2"}}]  # type: ignore[union-attr]
    assert values["grafana"] == {"enabled": False}
    kinds = {m["kind"] for m in monitoring_manifests(cfg, "prod", "ml-cluster.io", "training", 1)}
    assert kinds == {"PodMonitor", "PrometheusRule"}


@pytest.mark.parametrize("stack", ["staging", "prod"])
def test_stack_plans_install_monitoring_in_order(stack: str, stack_plan: Any) -> None:
    """The operator's CRDs (the release) before the objects of their kinds and before dcgm-exporter's ServiceMonitor;
    storage sized by config; the training namespace open to the monitoring namespace on the metrics ports."""
    resources = {r["name"]: r for r in stack_plan(stack)["resources"]}
    release = resources[f"mlc-{stack}-monitoring-kps"]
    assert release["inputs"]["chart"] == "kube-prometheus-stack"
    claim = release["inputs"]["values"]["prometheus"]["prometheusSpec"]["storageSpec"]["volumeClaimTemplate"]["spec"]
    assert claim["storageClassName"] == "gp3"
    for kind in ("PodMonitor", "PrometheusRule"):
        monitor = next(r for r in resources.values() if r["type"] == f"kubernetes:monitoring.coreos.com/v1:{kind}")
        assert release["name"] in monitor["options"]["dependsOn"]
        assert render_charts().validate_custom(monitor["inputs"], _crds()) == [], kind
    dcgm = resources[f"mlc-{stack}-gpu-dcgm-exporter"]
    assert dcgm["inputs"]["values"]["serviceMonitor"] == {"enabled": True, "honorLabels": True}
    assert release["name"] in dcgm["options"]["dependsOn"]
    scrape = resources[f"mlc-{stack}-jobs-netpol-allow-metrics-scrape"]["inputs"]["spec"]["ingress"][0]
    assert scrape["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}


def test_remote_write_to_amp_gets_a_role_scoped_to_the_workspace(plan_config: Any) -> None:
    """dev with monitoring in remote-write mode to an AMP workspace: Prometheus' named service account gets a Pod
    Identity role that may only RemoteWrite to that workspace, in place before the release starts Prometheus."""
    url = "https://aps-workspaces.us-west-2.amazonaws.com/workspaces/ws-0123abcd/api/v1/remote_write"
    plan = plan_config("dev", {"ml-cluster:monitoring": {
        "enabled": True, "mode": "remote-write", "remoteWrite": {"url": url, "sigv4Region": "us-west-2"}}})
    resources = {r["name"]: r for r in plan["resources"]}
    policy = json.loads(resources["mlc-dev-monitoring-remote-write"]["inputs"]["policy"])
    assert policy["Statement"] == [{"Sid": "RemoteWrite", "Effect": "Allow", "Action": ["aps:RemoteWrite"],
                                    "Resource": "arn:aws:aps:us-west-2:111122223333:workspace/ws-0123abcd"}]
    association = resources["mlc-dev-monitoring-remote-write-identity"]["inputs"]
    release = resources["mlc-dev-monitoring-kps"]
    assert (association["namespace"], association["serviceAccount"]) == (
        "monitoring", release["inputs"]["values"]["prometheus"]["serviceAccount"]["name"])
    assert "mlc-dev-monitoring-remote-write-identity" in release["options"]["dependsOn"]
    assert release["inputs"]["values"]["prometheus"]["prometheusSpec"]["remoteWrite"] == [
        {"url": url, "sigv4": {"region": "us-west-2"}}]
    assert not any(r["type"] == "kubernetes:core/v1:ConfigMap" and "dashboard" in r["name"] for r in resources.values())
