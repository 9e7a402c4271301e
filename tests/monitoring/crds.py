"""The Prometheus operator's CRDs from the pinned kube-prometheus-stack package, as validators for plan tests."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

from infra.config.monitoring import MonitoringConfig

ROOT = Path(__file__).resolve().parents[2]
KPS = ROOT / "tests" / "charts" / "upstream" / f"kube-prometheus-stack-{MonitoringConfig().chart_version}.tgz"


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


def validate_custom_resource(manifest: dict[str, Any]) -> list[str] | None:
    """Problems of a monitoring.coreos.com object against the pinned CRDs; None for any other kind."""
    key = (str(manifest.get("apiVersion")), str(manifest.get("kind")))
    if key not in kps_crds():
        return None
    return render_charts().validate_custom(manifest, kps_crds())
