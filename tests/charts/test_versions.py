"""Every version the program pins (code defaults, driver charts, stack files) is in docs/versions.md, and the chart
packages the render check uses are exactly those versions."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from infra.config.controllers import JobSetConfig, TrainerConfig
from infra.config.monitoring import MonitoringConfig
from infra.config.nodepools import DcgmExporterConfig, DevicePluginConfig, EfaDevicePluginConfig
from infra.config.nodes import AutoscalerConfig
from infra.config.queueing import KueueConfig
from infra.storage.drivers import CSI_S3_CHART, IBM_COS_CHART, NFS_CHART

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = Path(__file__).parent / "upstream"


def table_rows() -> set[tuple[str, str]]:
    rows = set()
    for line in (ROOT / "docs" / "versions.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 5 and not set(cells[0]) <= {"-"}:
            rows.add((cells[0], cells[1]))
    return rows


def pinned() -> set[tuple[str, str]]:
    versions = {
        ("nvidia-device-plugin", DevicePluginConfig().chart_version),
        ("dcgm-exporter", DcgmExporterConfig().chart_version),
        ("cluster-autoscaler", AutoscalerConfig().chart_version),
        ("aws-efa-k8s-device-plugin", EfaDevicePluginConfig().chart_version),
        ("kube-prometheus-stack", MonitoringConfig().chart_version),
        ("kueue", KueueConfig().chart_version),
        ("jobset", JobSetConfig().chart_version),
        ("kubeflow-trainer", TrainerConfig().chart_version),
        *((chart.chart, chart.version) for chart in (IBM_COS_CHART, CSI_S3_CHART, NFS_CHART)),
    }
    charts = {
        "devicePlugin": "nvidia-device-plugin",
        "dcgmExporter": "dcgm-exporter",
        "autoscaler": "cluster-autoscaler",
    }
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        config = yaml.safe_load(path.read_text())["config"]
        for key, chart in charts.items():
            version = ((config.get("ml-cluster:gpu") or {}).get(key) or {}).get("chartVersion")
            if version:
                versions.add((chart, str(version)))
        version = (config.get("ml-cluster:monitoring") or {}).get("chartVersion")
        if version:
            versions.add(("kube-prometheus-stack", str(version)))
        kueue_version = (config.get("ml-cluster:kueue") or {}).get("chartVersion")
        if kueue_version:
            versions.add(("kueue", str(kueue_version)))
        controllers = config.get("ml-cluster:jobControllers") or {}
        for key, chart in (("jobset", "jobset"), ("trainer", "kubeflow-trainer")):
            version = (controllers.get(key) or {}).get("chartVersion")
            if version:
                versions.add((chart, str(version)))
        for addon, version in ((config.get("ml-cluster:storage") or {}).get("addonVersions") or {}).items():
            versions.add((addon, str(version)))
    return versions


def test_every_pinned_version_is_in_the_versions_table() -> None:
    rows = table_rows()
    assert len(rows) >= 6
    missing = sorted(item for item in pinned() if item not in rows)
    assert not missing, f"add these to docs/versions.md: {missing}"


def test_the_render_check_packages_are_the_pinned_charts() -> None:
    packages = set()
    for path in UPSTREAM.glob("*.tgz"):
        match = re.fullmatch(r"(.+)-(v?\d+\.\d+\.\d+)\.tgz", path.name)
        assert match, path.name
        packages.add((match.group(1), match.group(2)))
    assert packages == {item for item in pinned() if "-eksbuild." not in item[1]}  # EKS add-ons are not charts
