"""The CRDs of the pinned chart packages (the Prometheus operator's from kube-prometheus-stack, JobSet's, Kubeflow
Trainer's), as validators for plan tests."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

from infra.config.controllers import JobSetConfig, TrainerConfig
from infra.config.monitoring import MonitoringConfig

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "charts" / "upstream"
KPS = UPSTREAM / f"kube-prometheus-stack-{MonitoringConfig().chart_version}.tgz"


@functools.cache
def render_charts() -> Any:
    """scripts/render_charts.py as a module (scripts are not a package)."""
    if "render_charts" in sys.modules:
        return sys.modules["render_charts"]
    loaded = importlib.util.spec_from_file_location("render_charts", ROOT / "scripts" / "render_charts.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    sys.modules["render_charts"] = module
    loaded.loader.exec_module(module)
    return module


@functools.cache
def kps_crds() -> dict[tuple[str, str], dict[str, Any]]:
    return render_charts().chart_crds(KPS)


@functools.cache
def controller_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """JobSet's CRD (the chart's crds/) and Kubeflow Trainer's (chart templates, rendered as the stack does)."""
    schemas = dict(render_charts().chart_crds(UPSTREAM / f"jobset-{JobSetConfig().chart_version}.tgz"))
    release = {"inputs": {"chart": "kubeflow-trainer", "version": TrainerConfig().chart_version,
                          "namespace": "kubeflow-system", "values": {"jobset": {"install": False}}}}
    for manifest in render_charts().rendered_objects(release, UPSTREAM):
        if manifest["kind"] == "CustomResourceDefinition":
            schemas.update(render_charts().crd_schemas(manifest))
    return schemas


def validate_custom_resource(manifest: dict[str, Any]) -> list[str] | None:
    """Problems of a monitoring.coreos.com, jobset.x-k8s.io or trainer.kubeflow.org object against the pinned CRDs;
    None for any other kind."""
    key = (str(manifest.get("apiVersion")), str(manifest.get("kind")))
    for crds in (kps_crds(), controller_crds()):
        if key in crds:
            return render_charts().validate_custom(manifest, crds)
    return None
