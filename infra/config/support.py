"""The support calendar of Kubernetes minors (support_calendar.json) and what it says of a stack on a given day.

EKS: a minor is in standard support for about 14 months after EKS ships it, then in extended support for 12 more
at a higher control-plane rate, then EKS upgrades the cluster itself. A cluster whose upgrade policy is STANDARD
never enters extended support: EKS upgrades it at the end of standard support (EKS User Guide, "View current
cluster upgrade policy"); the API's default policy is EXTENDED, so the stack always sets one. Other clusters
(onprem) follow the upstream project's end of life. The calendar is data with its sources; the functions here are
pure (the day is an argument), so the boundaries are tested with fixed dates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from functools import cache
from pathlib import Path
from typing import Literal

CALENDAR_FILE = Path(__file__).with_name("support_calendar.json")
# The minor new EKS stacks get (scripts/new_stack.py) and the committed ones run: the newest in standard support
# for which cluster-autoscaler publishes a chart of the same minor (docs/versions.md).
EKS_DEFAULT_VERSION = "1.35"
# A plan says a stack's minor is about to leave (standard) support this many days ahead: enough for the
# one-minor-at-a-time upgrade path (docs/operations.md) with a test stack first.
WARN_DAYS = 90

Tier = Literal["unreleased", "standard", "extended", "ended"]
Level = Literal["note", "error"]


@dataclass(frozen=True)
class Release:
    version: str
    released: date
    end_of_standard: date  # upstream: end of life
    end_of_extended: date  # upstream: the same day as end_of_standard (no extended support)

    def tier(self, today: date) -> Tier:
        if today < self.released:
            return "unreleased"
        if today < self.end_of_standard:
            return "standard"
        return "extended" if today < self.end_of_extended else "ended"


@dataclass(frozen=True)
class Calendar:
    eks: dict[str, Release]
    upstream: dict[str, Release]


def minor(version: str) -> tuple[int, int]:
    """ "1.36" -> (1, 36)."""
    major, _, rest = version.partition(".")
    return int(major), int(rest)


@cache
def calendar(path: Path = CALENDAR_FILE) -> Calendar:
    document = json.loads(path.read_text())

    def day(row: dict[str, str], key: str) -> date:
        return date.fromisoformat(row[key])

    eks = {row["version"]: Release(row["version"], day(row, "released"), day(row, "endOfStandardSupport"),
                                   day(row, "endOfExtendedSupport")) for row in document["eks"]}
    upstream = {row["version"]: Release(row["version"], day(row, "released"), day(row, "endOfLife"),
                                        day(row, "endOfLife")) for row in document["upstream"]}
    return Calendar(eks, upstream)


def supported_on(releases: dict[str, Release], today: date) -> list[str]:
    """The minors in (standard) support on `today`, oldest first."""
    return sorted((v for v, r in releases.items() if r.tier(today) == "standard"), key=minor)


def eks_tier(version: str, today: date) -> Tier:
    """The EKS support tier of `version` on `today` (the control plane's rate follows it)."""
    release = calendar().eks.get(version)
    return release.tier(today) if release is not None else "unreleased"


def _days(count: int) -> str:
    return f"{count} day" if count == 1 else f"{count} days"


def support_notes(version: str, platform: str, upgrade_policy: str, today: date,
                  warn_days: int = WARN_DAYS) -> list[tuple[Level, str]]:
    """What a plan says of a stack's Kubernetes minor on `today`: nothing while it is comfortably supported, a note
    when its (standard) support ends within `warn_days`, an error-level note once it has ended."""
    eks = platform == "eks"
    releases = calendar().eks if eks else calendar().upstream
    release = releases.get(version)
    current = supported_on(releases, today)
    upgrade = f"upgrade one minor at a time toward {current[-1]} (docs/operations.md)" if current else \
        "no minor in the calendar is supported today: add the current ones to infra/config/support_calendar.json"
    where = "EKS" if eks else "the Kubernetes project"
    if release is None:
        return [("error", f"Kubernetes {version} is not in the support calendar of {where}; {upgrade}")]
    tier = release.tier(today)
    if tier == "unreleased":
        return [("error", f"Kubernetes {version} is not released by {where} until {release.released}")]
    if not eks:
        if tier == "standard":
            days = (release.end_of_standard - today).days
            return [("note", f"Kubernetes {version} reaches its end of life on {release.end_of_standard} (in "
                             f"{_days(days)}): {upgrade}")] if days <= warn_days else []
        return [("error", f"Kubernetes {version} reached its end of life on {release.end_of_standard}: no more "
                          f"security patches; {upgrade}")]
    if tier == "standard":
        days = (release.end_of_standard - today).days
        if days > warn_days:
            return []
        after = ("EKS then upgrades the cluster itself (upgradePolicy: standard)" if upgrade_policy == "standard"
                 else "the control plane then bills at the extended-support rate")
        return [("note", f"Kubernetes {version} leaves EKS standard support on {release.end_of_standard} (in "
                         f"{_days(days)}); {after}: {upgrade}")]
    if tier == "extended":
        why = ("with upgradePolicy standard EKS upgrades such a cluster to the next minor itself"
               if upgrade_policy == "standard" else "the control plane bills at the extended-support rate")
        return [("error", f"Kubernetes {version} left EKS standard support on {release.end_of_standard} (extended "
                          f"support ends {release.end_of_extended}): {why}; {upgrade}")]
    return [("error", f"Kubernetes {version} left EKS extended support on {release.end_of_extended}: EKS neither "
                      f"creates it nor keeps it; {upgrade}")]
