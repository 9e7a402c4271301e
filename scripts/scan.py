"""Run checkov, the scanner platform teams gate IaC on, over what this project ships; fail on unexplained findings.

Scanned: the Kubernetes objects of every stack's offline plan (`scripts/plan.py --manifests`), the training
image's Dockerfile and the GitHub workflows. A finding passes only if a line of the skip file names its check,
the object (a glob on checkov's resource name) and why. A skip line that matches nothing is an error too, so the
file never outlives what it excuses; scanning other stacks than the committed ones (`make scan STACK=mine`), such a
line is a `note:` (the file excuses the committed stacks' findings).

    .venv/bin/python scripts/scan.py [--checkov PATH] [--skips scripts/checkov-skips.txt] [--stacks dev,prod]

Exit 0: every finding fixed or explained; 2: an unexplained finding, a stale skip, or a scanner that did not run
(each printed as `error: <where>: <why>`).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STACKS = ("dev", "staging", "prod", "onprem")
DEFAULT_SKIPS = REPO / "scripts" / "checkov-skips.txt"


@dataclass(frozen=True)
class Skip:
    check_id: str
    resource_glob: str
    why: str
    line: int


@dataclass(frozen=True)
class Finding:
    framework: str
    check_id: str
    check_name: str
    resource: str
    file: str


class ScanError(Exception):
    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")


def load_skips(path: Path) -> list[Skip]:
    """`CHECK_ID  RESOURCE_GLOB  why...` per line (whitespace-separated); lines starting with `#` are comments."""
    skips = []
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 3 or not parts[0].startswith("CKV"):
            raise ScanError(f"{path}:{number}", "expected `CHECK_ID RESOURCE_GLOB why`")
        skips.append(Skip(parts[0], parts[1], parts[2], number))
    return skips


def findings_of(report: Any) -> list[Finding]:
    """Failed checks from checkov's JSON output (one report object, or a list of them, one per framework)."""
    reports = report if isinstance(report, list) else [report]
    found = []
    for one in reports:
        if not isinstance(one, dict):
            continue
        for check in one.get("results", {}).get("failed_checks", []):
            found.append(Finding(one.get("check_type", "?"), check["check_id"], check.get("check_name", ""),
                                 check["resource"], check.get("file_path", "")))
    return found


def passed_count(report: Any) -> int:
    reports = report if isinstance(report, list) else [report]
    return sum(one.get("summary", {}).get("passed", 0) for one in reports if isinstance(one, dict))


def judge(findings: list[Finding], skips: list[Skip]) -> tuple[list[Finding], list[tuple[Finding, Skip]], list[Skip]]:
    """(unexplained findings, explained findings with their skip, skips that matched nothing)."""
    unexplained, explained, used = [], [], set()
    for finding in findings:
        skip = next((s for s in skips if s.check_id == finding.check_id
                     and fnmatch.fnmatchcase(finding.resource, s.resource_glob)), None)
        if skip is None:
            unexplained.append(finding)
        else:
            explained.append((finding, skip))
            used.add(skip.line)
    return unexplained, explained, [s for s in skips if s.line not in used]


def _checkov(checkov: str, framework: str, target: list[str]) -> Any:
    command = [checkov, *target, "--framework", framework, "--compact", "--quiet", "-o", "json",
               "--skip-download"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if result.returncode not in (0, 1):  # 1: findings; anything else: the scanner failed
        raise ScanError(f"checkov {framework}", (result.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(result.stdout) if result.stdout.strip() else {}


def _render(stacks: list[str], out: Path) -> None:
    for stack in stacks:
        result = subprocess.run([sys.executable, "scripts/plan.py", "--stack", stack, "--manifests",
                                 str(out / stack)], capture_output=True, text=True, cwd=REPO)
        if result.returncode != 0:
            raise ScanError(f"stack {stack}", (result.stderr.strip().splitlines() or ["plan failed"])[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkov", default=shutil.which("checkov") or "checkov")
    parser.add_argument("--skips", type=Path, default=DEFAULT_SKIPS)
    parser.add_argument("--stacks", default=",".join(STACKS))
    args = parser.parse_args(argv)
    stacks = [stack for stack in args.stacks.split(",") if stack]
    try:
        skips = load_skips(args.skips)
        with tempfile.TemporaryDirectory(prefix="scan-") as scratch:
            manifests = Path(scratch) / "manifests"
            _render(stacks, manifests)
            reports = {
                "kubernetes": _checkov(args.checkov, "kubernetes", ["-d", str(manifests)]),
                "dockerfile": _checkov(args.checkov, "dockerfile", ["-f", "workloads/Dockerfile"]),
                "github_actions": _checkov(args.checkov, "github_actions", ["-d", ".github/workflows"]),
            }
    except (ScanError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    findings = [finding for report in reports.values() for finding in findings_of(report)]
    unexplained, explained, stale = judge(findings, skips)
    for framework, report in reports.items():
        failed = [f for f in findings if f.framework == framework]
        print(f"{framework:15} passed {passed_count(report):4}  failed {len(failed):3}  "
              f"explained {sum(1 for f, _ in explained if f.framework == framework):3}")
    for finding, skip in explained:
        print(f"skipped {finding.check_id} {finding.resource}: {skip.why}")
    for finding in unexplained:
        print(f"error: {finding.file}: {finding.check_id} {finding.resource}: {finding.check_name}", file=sys.stderr)
    # The skip file is written for the committed stacks: scanning others (your own), a line that matches none of
    # their findings is not stale, only unused here.
    committed = set(stacks) == set(STACKS)
    for skip in stale:
        print(f"{'error' if committed else 'note'}: {args.skips}:{skip.line}: {skip.check_id} {skip.resource_glob} "
              f"matches no finding{'' if committed else ' of ' + ','.join(stacks)}", file=sys.stderr)
    return 2 if unexplained or (stale and committed) else 0


if __name__ == "__main__":
    sys.exit(main())
