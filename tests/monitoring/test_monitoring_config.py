"""`ml-cluster:monitoring` in the stack config: every bad value is one `path: why` problem, found before any
resource is registered."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, parse_stack_config
from tests.conftest import stack_values


def _problems(monitoring: dict) -> dict[str, str]:
    values = stack_values("dev")
    values["ml-cluster:monitoring"] = monitoring
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(values, ())
    return dict(caught.value.problems)


def test_bad_monitoring_values_name_their_field() -> None:
    found = _problems({"enabled": True, "retention": "two weeks", "scrapeInterval": "15",
                       "storageSize": "lots", "namespace": "Monitoring",
                       "alerts": {"dataWaitShare": 1.5}})
    assert set(found) == {"monitoring.retention", "monitoring.scrapeInterval", "monitoring.storageSize",
                          "monitoring.namespace", "monitoring.alerts.dataWaitShare"}
    assert "Prometheus duration" in found["monitoring.retention"]


def test_remote_write_needs_an_https_target() -> None:
    assert "remoteWrite.url" in _problems({"enabled": True, "mode": "remote-write"})["monitoring"]
    found = _problems({"enabled": True, "mode": "remote-write", "remoteWrite": {"url": "http://amp.example"}})
    assert "https" in found["monitoring.remoteWrite.url"]


def test_a_chart_version_storage_class_or_zero_duration_that_cannot_deploy_is_refused() -> None:
    found = _problems({"enabled": True, "chartVersion": "../x", "storageClass": "Bad_Name/..",
                       "scrapeInterval": "0s", "retention": "0d0h"})
    assert set(found) == {"monitoring.chartVersion", "monitoring.storageClass", "monitoring.scrapeInterval",
                          "monitoring.retention"}
    assert "longer than 0" in found["monitoring.scrapeInterval"]
    assert "latest" not in stack_values("dev").get("ml-cluster:monitoring", {}).get("chartVersion", "")
    assert set(_problems({"enabled": True, "chartVersion": "latest"})) == {"monitoring.chartVersion"}
