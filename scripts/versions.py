"""What the stacks pin against what is current: every Helm chart the stacks release (pinned vs the newest in its
repository) and every stack's Kubernetes minor against the support calendar.

    python scripts/versions.py [--online] [--fail-behind] [--today YYYY-MM-DD] [--stacks dev,prod,...]

Offline (the default, as CI runs it) the newest chart versions are not known and only the calendar is read.
--online reads each chart repository's index.yaml (OCI charts are listed as not checked). --fail-behind exits 1
when a chart is behind its repository's newest release or a stack's minor leaves (standard) support within the
calendar's warning window: the scheduled versions workflow turns that into an issue.
Exit 0, 1 (behind, with --fail-behind) or 2 with `error: <where>: <why>`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.config import ConfigError  # noqa: E402
from infra.config.support import WARN_DAYS, calendar  # noqa: E402
from infra.plan.engine import STACKS_DIR, FixtureError, plan_stack  # noqa: E402
from workloads.cli import ArgumentParser, parse_day  # noqa: E402

RELEASE = "kubernetes:helm.sh/v3:Release"
INDEX_TIMEOUT_S = 30
MAX_INDEX_BYTES = 64 * 1024 * 1024
_SEMVER = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)$")  # releases only: no -rc, -beta


@dataclass(frozen=True)
class Chart:
    name: str
    repo: str
    pinned: str
    stacks: tuple[str, ...]


def pinned_charts(plans: Iterable[dict[str, Any]]) -> list[Chart]:
    found: dict[tuple[str, str, str], list[str]] = {}
    for plan in plans:
        for resource in plan["resources"]:
            if resource["type"] == RELEASE:
                inputs = resource["inputs"]
                repo = (inputs.get("repositoryOpts") or {}).get("repo") or inputs["chart"]
                name = str(inputs["chart"]).rsplit("/", 1)[-1]
                found.setdefault((name, str(repo), str(inputs.get("version"))), []).append(str(plan["stack"]))
    return [Chart(n, r, v, tuple(sorted(set(s)))) for (n, r, v), s in sorted(found.items())]


def newest_release(index: dict[str, Any], chart: str) -> str | None:
    """The highest release version of `chart` in a Helm repository index (pre-releases left out)."""
    entries = (index.get("entries") or {}).get(chart) or []
    versions = [str(e.get("version")) for e in entries if isinstance(e, dict) and _SEMVER.match(str(e.get("version")))]
    return max(versions, key=_key) if versions else None


def _key(version: str) -> tuple[int, int, int]:
    match = _SEMVER.match(version)
    assert match is not None
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def fetch_index(repo: str) -> dict[str, Any]:
    """A repository's index.yaml over HTTPS, with a deadline and a size cap. Raises OSError / ValueError."""
    import requests
    import yaml

    url = repo.rstrip("/") + "/index.yaml"
    with requests.get(url, timeout=INDEX_TIMEOUT_S, stream=True) as response:
        response.raise_for_status()
        body = bytearray()
        for chunk in response.iter_content(1 << 20):
            body += chunk
            if len(body) > MAX_INDEX_BYTES:
                raise ValueError(f"{url}: larger than {MAX_INDEX_BYTES} bytes")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    document = yaml.load(bytes(body), Loader=loader)  # noqa: S506 (a safe loader)
    if not isinstance(document, dict):
        raise ValueError(f"{url}: not a Helm repository index")
    return document


def report(plans: list[dict[str, Any]], today: date, online: bool,
           index_of: Callable[[str], dict[str, Any]] = fetch_index) -> tuple[list[str], list[str]]:
    """The report's lines, and what is behind (for --fail-behind)."""
    lines, behind = [f"versions on {today}", "", "charts (pinned / newest in its repository):"], []
    for chart in pinned_charts(plans):
        newest = "not checked (offline)"
        if online and chart.repo.startswith("oci://"):
            newest = "not checked (OCI registry: see the chart's releases)"
        elif online:
            try:
                newest = newest_release(index_of(chart.repo), chart.name) or "not in the index"
            except (OSError, ValueError) as exc:
                newest = f"unreadable ({str(exc).splitlines()[0][:120]})"
            if _SEMVER.match(newest) and _key(newest) > _key(chart.pinned):
                behind.append(f"chart {chart.name} {chart.pinned} is behind {newest}")
        lines.append(f"  {chart.name:28} {chart.pinned:10} {newest:12} {', '.join(chart.stacks)}")
    lines += ["", "Kubernetes (stack: minor, tier today, end of (standard) support):"]
    for plan in plans:
        outputs = plan.get("outputs") or {}
        version, platform = str(outputs.get("kubernetesVersion")), str(outputs.get("platform"))
        releases = calendar().eks if platform == "eks" else calendar().upstream
        release = releases.get(version)
        if release is None:
            lines.append(f"  {plan['stack']:10} {version:6} not in the support calendar")
            behind.append(f"stack {plan['stack']}: Kubernetes {version} is not in the support calendar")
            continue
        days = (release.end_of_standard - today).days
        lines.append(f"  {plan['stack']:10} {version:6} {release.tier(today):10} {release.end_of_standard} "
                     f"({days} days; {'EKS' if platform == 'eks' else 'upstream'})")
        if days <= WARN_DAYS:
            behind.append(f"stack {plan['stack']}: Kubernetes {version} leaves support on {release.end_of_standard}")
    return lines, behind



def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Pinned chart and Kubernetes versions against what is current.")
    parser.add_argument("--online", action="store_true", help="read the chart repositories' index.yaml")
    parser.add_argument("--fail-behind", action="store_true", help="exit 1 when something is behind")
    parser.add_argument("--today", type=parse_day, default=datetime.now(UTC).date(), metavar="YYYY-MM-DD")
    parser.add_argument("--stacks", help="comma-separated stacks (default: every stacks/Pulumi.<stack>.yaml)")
    args = parser.parse_args(argv)
    stacks = args.stacks.split(",") if args.stacks else sorted(
        p.name.removeprefix("Pulumi.").removesuffix(".yaml") for p in STACKS_DIR.glob("Pulumi.*.yaml"))
    plans = []
    for stack in stacks:
        try:
            plans.append(plan_stack(stack))
        except ConfigError as exc:
            print("\n".join(exc.lines()), file=sys.stderr)
            return 2
        except FixtureError as exc:
            print(f"error: {exc.fixture}: {exc.why}", file=sys.stderr)
            return 2
    lines, behind = report(plans, args.today, args.online)
    print("\n".join(lines))
    if behind:
        print("\nbehind:\n" + "\n".join(f"  {item}" for item in behind))
    return 1 if behind and args.fail_behind else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
