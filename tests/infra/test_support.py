"""The support calendar: what a plan says of a stack's Kubernetes minor on a given day, at the boundaries; the
committed stacks are in support today; --diff refuses what EKS refuses in an upgrade."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.support import WARN_DAYS, calendar, eks_tier, support_notes, supported_on
from infra.plan.engine import STACKS_DIR
from infra.plan.view import plan_support_notes, upgrade_problems
from scripts import plan as plan_cli

END_133 = date(2026, 7, 29)  # 1.33's end of EKS standard support
END_EXT_133 = date(2027, 7, 29)


@pytest.mark.parametrize(("day", "tier"), [
    (date(2025, 5, 28), "unreleased"), (date(2025, 5, 29), "standard"), (END_133 - timedelta(days=1), "standard"),
    (END_133, "extended"), (END_EXT_133 - timedelta(days=1), "extended"), (END_EXT_133, "ended"),
])
def test_tiers_change_on_the_calendars_days(day: date, tier: str) -> None:
    assert eks_tier("1.33", day) == tier


def test_notes_at_the_boundaries() -> None:
    quiet = END_133 - timedelta(days=WARN_DAYS + 1)
    assert support_notes("1.33", "eks", "standard", quiet) == []
    [(level, text)] = support_notes("1.33", "eks", "standard", END_133 - timedelta(days=WARN_DAYS))
    assert level == "note" and f"in {WARN_DAYS} days" in text and "upgrades the cluster itself" in text
    [(level, text)] = support_notes("1.33", "eks", "extended", END_133 - timedelta(days=1))
    assert level == "note" and "in 1 day)" in text and "extended-support rate" in text
    [(level, text)] = support_notes("1.33", "eks", "extended", END_133)
    assert level == "error" and "left EKS standard support on 2026-07-29" in text and "toward 1.36" in text
    [(level, text)] = support_notes("1.33", "eks", "standard", END_133)
    assert level == "error" and "upgrades such a cluster to the next minor itself" in text
    [(level, text)] = support_notes("1.33", "eks", "extended", END_EXT_133)
    assert level == "error" and "left EKS extended support on 2027-07-29" in text
    # not EKS: the upstream project's end of life, no extended support
    assert support_notes("1.35", "onprem", "standard", date(2027, 2, 28) - timedelta(days=WARN_DAYS + 1)) == []
    [(level, text)] = support_notes("1.35", "onprem", "standard", date(2027, 2, 28))
    assert level == "error" and "end of life on 2027-02-28" in text
    [(level, _)] = support_notes("1.29", "onprem", "standard", date(2026, 11, 24))  # not in the upstream rows
    assert level == "error"


def test_the_calendar_is_ordered_and_consistent() -> None:
    for releases in (calendar().eks, calendar().upstream):
        for release in releases.values():
            assert release.released < release.end_of_standard <= release.end_of_extended, release
    assert supported_on(calendar().eks, date(2026, 11, 24)) == ["1.34", "1.35", "1.36"]


def _months_later(day: date, months: int) -> date:
    year, month = divmod(day.month - 1 + months, 12)
    return day.replace(year=day.year + year, month=month + 1)


def test_eks_rows_follow_the_user_guides_14_and_12_month_rule() -> None:
    """EKS: standard support for 14 months after the EKS release, extended support for 12 more (EKS User Guide,
    "Understand the Kubernetes version lifecycle on EKS"). Release dates taken from elsewhere (the general
    availability posts, a scrape) broke it for 1.32-1.34 by one to four days. 1.35's published end of standard
    support is a day short of the rule (2027-03-27 for a 2026-01-28 release), kept as published."""
    published_exceptions = {"1.35": date(2027, 3, 27)}
    for version, release in calendar().eks.items():
        expected = published_exceptions.get(version, _months_later(release.released, 14))
        assert release.end_of_standard == expected, version
        assert release.end_of_extended == _months_later(release.end_of_standard, 12), version


def _stack_versions() -> list[tuple[str, str, str]]:
    rows = []
    for path in sorted(STACKS_DIR.glob("Pulumi.*.yaml")):
        config = yaml.safe_load(path.read_text())["config"]
        cluster, onprem = config.get("ml-cluster:cluster"), config.get("ml-cluster:onprem")
        platform, section = ("eks", cluster) if cluster else ("onprem", onprem)
        version = section["kubernetesVersion"]
        rows.append((path.name, platform, str(version)))
    return rows


@pytest.mark.parametrize(("stack_file", "platform", "version"), _stack_versions())
def test_every_committed_stack_is_in_standard_support_today(stack_file: str, platform: str, version: str) -> None:
    """A currency check that fails on the day a committed stack's minor leaves (standard) support: move the stack
    one minor up (docs/operations.md, upgrades) and add the calendar's new rows."""
    today = datetime.now(UTC).date()
    releases = calendar().eks if platform == "eks" else calendar().upstream
    assert version in supported_on(releases, today), f"{stack_file}: Kubernetes {version} on {today}"


def _plan(version: str, node_version: str | None = None) -> dict[str, Any]:
    resources: list[dict[str, Any]] = [{"type": "aws:eks/cluster:Cluster", "name": "c", "options": {},
                                        "inputs": {"version": version, "upgradePolicy": {"supportType": "STANDARD"}}}]
    if node_version is not None:
        resources.append({"type": "aws:eks/nodeGroup:NodeGroup", "name": "ng", "options": {},
                          "inputs": {"version": node_version}})
    return {"stack": "dev", "resources": resources, "outputs": {"kubernetesVersion": version, "platform": "eks"}}


def test_upgrades_move_one_minor_at_a_time_control_plane_first() -> None:
    assert upgrade_problems(_plan("1.33"), _plan("1.34", "1.34")) == []
    [(where, why)] = upgrade_problems(_plan("1.33"), _plan("1.35", "1.35"))
    assert where == "ml-cluster:cluster.kubernetesVersion"
    assert why.startswith("1.33 -> 1.35 skips a minor") and "deploy 1.34, then 1.35" in why
    [(_, why)] = upgrade_problems(_plan("1.35"), _plan("1.34"))
    assert "cannot be downgraded" in why
    [(where, why)] = upgrade_problems(_plan("1.34"), _plan("1.34", "1.35"))
    assert where == "ng" and "ahead of its control plane (1.34)" in why
    assert plan_support_notes(_plan("1.33"), date(2026, 11, 24))[0][0] == "error"


def test_cli_diff_refuses_a_jump_of_two_minors(stack_plan: Any, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    old = json.loads(json.dumps(stack_plan("dev")))
    for resource in old["resources"]:
        if resource["type"] in ("aws:eks/cluster:Cluster", "aws:eks/nodeGroup:NodeGroup"):
            resource["inputs"]["version"] = "1.33"
    old["outputs"]["kubernetesVersion"] = "1.33"
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert plan_cli.main(["--stack", "dev", "--diff", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ml-cluster:cluster.kubernetesVersion: 1.33 -> 1.35 skips a minor")
    assert "deploy 1.34, then 1.35" in err


def test_cli_prints_the_calendars_note_for_the_day(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_cli.main(["--stack", "dev", "--today", "2027-01-01"]) == 0
    assert "note: Kubernetes 1.35 leaves EKS standard support on 2027-03-27 (in 85 days)" in capsys.readouterr().err
    assert plan_cli.main(["--stack", "dev", "--today", "2027-03-27"]) == 0
    assert "warning: Kubernetes 1.35 left EKS standard support on 2027-03-27" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        plan_cli.main(["--stack", "dev", "--today", "tomorrow"])
    assert exited.value.code == 2 and "'tomorrow' is not a day" in capsys.readouterr().err
