"""The data path's regression gate (scripts/bench_check.py, `make bench-check`): this checkout (head) against a base
commit in the same run, on the same machine at the same load, in rounds that alternate the two.

Three kinds of rows, one verdict each:

- `calls`: Python calls per sample of each reader (benchmarks/reader_cost.py, cProfile). They do not depend on the
  load, so the rule is a plain limit: FAIL when head > base x (1 + calls tolerance, default 10%).
- `cpu`: CPU microseconds per sample of each reader (process_time, one process, best of 5 passes a round).
- `wall`: the 20-epoch totals of our rows in the object-storage harness (scripts/bench_peers.py --checkouts).

For `cpu` and `wall` the base's own run-to-run spread is the noise: spread = base's worst round / base's best - 1.
A row FAILs only when head's best round is slower than base's best by more than that spread (and by more than a
floor, 10% cpu, 25% wall): head best > base best x (1 + max(spread, floor)), i.e. head's best round is slower
than every base round. A row that did not run for either checkout FAILs with the reason.

The fast suite holds the small form of the calls (a few hundred tiny images, `reader_cost.small_form_calls`) to the
figures recorded in benchmarks/baselines.json (`scripts/bench_check.py --record-small-form` rewrites them).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.data.format.manifest import atomic_write_bytes

BASELINES = Path(__file__).resolve().parent / "baselines.json"
CALLS_TOLERANCE = 0.10  # calls per sample are exact: 10% more is added per-sample work, never noise
FLOORS = {"cpu": 0.10, "wall": 0.25}  # the least slowdown a timing row may FAIL on, however steady the base was
GIT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class WallRow:
    name: str
    layout: str  # bench_peers --layouts
    contender: str  # bench_peers --contenders


WALL_ROWS = (
    WallRow("decoded", "decoded", "ours"),
    WallRow("encoded-decode-cache", "encoded", "ours"),
    WallRow("encoded-redecode", "encoded", "ours-redecode"),
    WallRow("staging-cache40", "encoded", "ours-cache40"),
)
DEFAULT_WALL = ("decoded", "encoded-decode-cache")  # the decode itself is the cpu `encoded` row


@dataclass(frozen=True)
class Verdict:
    kind: str  # calls, cpu, wall
    row: str
    base: tuple[float, ...]
    head: tuple[float, ...]
    limit: float | None  # the most head may be (head best for timings), None when a row did not run
    passed: bool
    note: str = ""

    def line(self) -> str:
        def figures(values: tuple[float, ...]) -> str:
            return "/".join(f"{value:.4g}" for value in values) or "-"

        head = min(self.head) if self.head else None
        base = min(self.base) if self.base else None
        ratio = f"{head / base:.2f}x" if head is not None and base else "-"
        limit = f"{self.limit:.4g}" if self.limit is not None else "-"
        return (f"{self.kind:<6}{self.row:<22} base {figures(self.base):<24} head {figures(self.head):<24} "
                f"head/base {ratio:>6}  limit {limit:>7}  {'PASS' if self.passed else 'FAIL'}"
                + (f"  {self.note}" if self.note else ""))


def timing_verdict(kind: str, row: str, base: list[float | None], head: list[float | None],
                   floor: float) -> Verdict:
    """A cpu or wall row: FAIL when head's best is over base's best x (1 + max(base's spread, floor))."""
    got_base, got_head = tuple(v for v in base if v is not None), tuple(v for v in head if v is not None)
    if len(got_base) < 2 or not got_head:
        return Verdict(kind, row, got_base, got_head, None, False,
                       f"not measured: base {len(got_base)} of {len(base)} rounds, head {len(got_head)} of "
                       f"{len(head)} (need 2 base rounds for a spread)")
    best, worst = min(got_base), max(got_base)
    spread = worst / best - 1
    allowed = max(spread, floor)
    limit = best * (1 + allowed)
    passed = min(got_head) <= limit
    source = f"base spread {spread:.0%}" if spread >= floor else f"floor {floor:.0%} (base spread {spread:.0%})"
    return Verdict(kind, row, got_base, got_head, limit, passed, f"limit = base best + {source}")


def calls_verdict(row: str, base: list[float | None], head: list[float | None], tolerance: float) -> Verdict:
    """A calls row: FAIL when head's calls per sample exceed base's by more than the tolerance."""
    got_base, got_head = tuple(v for v in base if v is not None), tuple(v for v in head if v is not None)
    if not got_base or not got_head:
        return Verdict("calls", row, got_base, got_head, None, False, "not measured")
    limit = max(got_base) * (1 + tolerance)
    note = f"limit = base + {tolerance:.0%}"
    if len(set(got_base)) > 1 or len(set(got_head)) > 1:
        note += "; counts differed between rounds"
    return Verdict("calls", row, got_base, got_head, limit, max(got_head) <= limit, note)


def reader_verdicts(base: list[dict[str, float] | None], head: list[dict[str, float] | None], *,
                    readers: tuple[str, ...], calls_tolerance: float, cpu_floor: float) -> list[Verdict]:
    """calls and cpu rows from each round's bench_reader_cpu report (None for a round that failed)."""
    def series(reports: list[dict[str, float] | None], key: str) -> list[float | None]:
        return [report.get(key) if report else None for report in reports]

    calls = [calls_verdict(name, series(base, f"{name} calls/sample"), series(head, f"{name} calls/sample"),
                           calls_tolerance) for name in readers]
    cpu = [timing_verdict("cpu", name, series(base, f"{name} us/sample"), series(head, f"{name} us/sample"),
                          cpu_floor) for name in readers]
    return calls + cpu


def wall_verdicts(layouts: dict[str, dict[str, Any]], rows: list[WallRow], label: str, floor: float) -> list[Verdict]:
    """wall rows from bench_peers' JSON `layouts`: this checkout's row NAME against the base's NAME@label."""
    out = []
    for row in rows:
        entries = layouts.get(row.layout, {})
        base = entries.get(f"{row.contender}@{label}", {}).get("round_totals_s", [])
        head = entries.get(row.contender, {}).get("round_totals_s", [])
        verdict = timing_verdict("wall", row.name, base, head, floor)
        if not verdict.passed and verdict.limit is None:
            reasons = [f"{who}: {entry.get('status')} {entry.get('reason', '')}".strip()
                       for who, entry in ((f"{row.contender}@{label}", entries.get(f"{row.contender}@{label}", {})),
                                          (row.contender, entries.get(row.contender, {})))
                       if entry.get("status") != "ok"]
            if reasons:
                verdict = Verdict("wall", row.name, verdict.base, verdict.head, None, False,
                                  verdict.note + "; " + "; ".join(reasons))
        out.append(verdict)
    return out


def _git(repo: Path, *args: str) -> str:
    result = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                            check=False)
    if result.returncode != 0:
        raise ValueError((result.stderr.strip().splitlines() or [f"git {args[0]}: exit {result.returncode}"])[-1])
    return result.stdout.strip()


def describe_head(repo: Path) -> str:
    """HEAD's short hash and subject, and whether the working tree differs from it (the gate measures the tree)."""
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return _git(repo, "log", "-1", "--format=%h %s", "HEAD")[:80] + (" + uncommitted changes" if dirty else "")


@contextlib.contextmanager
def base_checkout(repo: Path, ref: str, parent: Path) -> Iterator[tuple[str, Path]]:
    """A throwaway `git worktree` of `ref` under `parent`, removed afterwards; yields (short hash and subject, path).
    ValueError names the ref when it is not a commit of `repo`."""
    try:
        sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except ValueError as exc:
        raise ValueError(f"{ref!r}: not a commit in {repo}") from exc
    path = parent / "base"
    _git(repo, "worktree", "add", "--detach", "--quiet", str(path), sha)
    try:
        yield _git(repo, "log", "-1", "--format=%h %s", sha)[:80], path
    finally:
        with contextlib.suppress(ValueError, subprocess.TimeoutExpired):
            _git(repo, "worktree", "remove", "--force", str(path))
        with contextlib.suppress(ValueError, subprocess.TimeoutExpired):
            _git(repo, "worktree", "prune")


def uptime() -> str:
    """`uptime`'s line (the load averages), or the load averages alone where the command is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def load_recorded(path: Path) -> dict[str, Any]:
    """The recorded small-form figures; ValueError names the file when it is missing or not ours."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a baselines file: {exc}") from exc
    calls = document.get("small_form_calls") if isinstance(document, dict) else None
    if not isinstance(calls, dict) or not calls or not all(
            isinstance(value, (int, float)) for value in calls.values()):
        raise ValueError(f"{path}: not a baselines file: expected {{'small_form_calls': {{reader: number}}, ...}}")
    return document


def write_recorded(path: Path, calls: dict[str, float], *, command: str, date: str) -> None:
    """Record the small form's calls per sample (temp file, fsync, rename: never half written)."""
    document = {"command": command, "date": date, "tolerance": CALLS_TOLERANCE,
                "note": "calls per sample of benchmarks/reader_cost.small_form_calls; "
                        "tests/train/test_bench_scripts.py "
                        "holds this tree to them (+tolerance)",
                "small_form_calls": {name: round(float(value), 2) for name, value in calls.items()}}
    atomic_write_bytes(path, (json.dumps(document, indent=2) + "\n").encode())
