"""scripts/versions.py: pinned charts against their repositories' newest releases, and the stacks' Kubernetes
minors against the calendar, with a fixed day and index documents served from memory."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

from scripts import versions
from scripts.versions import newest_release, pinned_charts, report

INDEX = {"entries": {
    "cluster-autoscaler": [{"version": "9.59.0"}, {"version": "9.60.1"}, {"version": "9.61.0-rc.1"},
                           {"version": "9.9.9"}],
    "nvidia-device-plugin": [{"version": "0.20.0"}, {"version": "0.19.3"}],
}}


def test_newest_release_orders_numerically_and_skips_pre_releases() -> None:
    assert newest_release(INDEX, "cluster-autoscaler") == "9.60.1"
    assert newest_release(INDEX, "absent") is None
    assert newest_release({"entries": {"x": [{"version": None}, "junk"]}}, "x") is None


def test_report_flags_what_is_behind(stack_plan: Any) -> None:
    plans = [stack_plan("dev"), stack_plan("onprem")]
    asked: list[str] = []

    def index_of(repo: str) -> dict[str, Any]:
        asked.append(repo)
        if "autoscaler" in repo or "k8s-device-plugin" in repo:
            return INDEX
        raise OSError("connection refused")

    lines, behind = report(plans, date(2027, 1, 1), online=True, index_of=index_of)
    text = "\n".join(lines)
    assert "chart cluster-autoscaler 9.59.0 is behind 9.60.1" in behind
    assert not any("nvidia-device-plugin" in item for item in behind)
    assert "not checked (OCI registry" in text and "unreadable (connection refused)" in text
    assert not any(repo.startswith("oci://") for repo in asked)
    # 1.35 leaves EKS standard support on 2027-03-27: within 90 days of 2027-01-01
    assert "stack dev: Kubernetes 1.35 leaves support on 2027-03-27" in behind
    assert not any(item.startswith("stack onprem") for item in behind)
    assert {c.name for c in pinned_charts(plans)} >= {"cluster-autoscaler", "kueue", "ibm-object-storage-plugin"}


def test_offline_cli_reports_without_failing(capsys: pytest.CaptureFixture[str]) -> None:
    assert versions.main(["--stacks", "dev", "--today", "2026-11-24", "--fail-behind"]) == 0
    out = capsys.readouterr().out
    assert "not checked (offline)" in out and "dev        1.35   standard   2027-03-27 (123 days; EKS)" in out
    assert versions.main(["--stacks", "dev", "--today", "2027-03-01", "--fail-behind"]) == 1
    assert "behind:" in capsys.readouterr().out
    assert versions.main(["--stacks", "nope"]) == 2
