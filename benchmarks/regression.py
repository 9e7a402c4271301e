"""The data path's regression guard (scripts/bench_check.py, `make bench-check`): a short fixed set of our contenders
against LitData in the same run of the peer benchmark, each ratio compared with the last recorded one.

A check is one of our rows over one peer row of the same layout, by 20-epoch total (scripts/bench_peers.py: convert
+ cold epoch + 19 x median warm epoch); lower is better. A ratio worse than its baseline by more than the tolerance
(relative: ratio > baseline x (1 + tolerance)) is a FAIL naming the check, as is a row that did not run. The
baselines file (benchmarks/baselines.json) records the ratios with the command, the date and the `uptime` load of
the run that produced them; `--record` rewrites it from a run.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.data.format.manifest import atomic_write_bytes

BASELINES = Path(__file__).resolve().parent / "baselines.json"
TOLERANCE = 0.3  # the machine this runs on is shared: a third more than the baseline is noise, not a regression


@dataclass(frozen=True)
class Check:
    name: str
    layout: str  # bench_peers --layouts
    ours: str  # our contender (bench_peers --contenders)
    peer: str  # the peer it is divided by


CHECKS = (
    Check("decoded", "decoded", "ours", "litdata"),
    Check("encoded-decode-cache", "encoded", "ours", "litdata"),
    Check("encoded-redecode", "encoded", "ours-redecode", "litdata"),
    Check("staging-cache40", "encoded", "ours-cache40", "litdata-cache40"),
)


def contenders(layout: str) -> list[str]:
    """The bench_peers contenders one layout's checks need, ours first."""
    names: list[str] = []
    for check in CHECKS:
        if check.layout == layout:
            names += [name for name in (check.ours, check.peer) if name not in names]
    return sorted(names, key=lambda name: not name.startswith("ours"))


def ratios(layouts: dict[str, dict[str, Any]]) -> dict[str, float | str]:
    """Each check's ratio from bench_peers' JSON `layouts` (layout -> contender -> row); a string says why a check
    has no ratio (a row that failed, is missing or is not installed)."""
    out: dict[str, float | str] = {}
    for check in CHECKS:
        rows = layouts.get(check.layout, {})
        problems = [f"{name}: {rows[name]['status']} {rows[name].get('reason', '')}".strip() if name in rows
                    else f"{name}: not run" for name in (check.ours, check.peer)
                    if name not in rows or rows[name]["status"] != "ok"]
        out[check.name] = ("; ".join(problems) if problems
                           else rows[check.ours]["total_20_s"] / rows[check.peer]["total_20_s"])
    return out


def compare(measured: dict[str, float | str], baselines: dict[str, Any], tolerance: float) -> tuple[list[str], bool]:
    """The report's lines (ratio, baseline, limit, PASS/FAIL per check) and whether every check passed. A check
    without a recorded baseline is NEW (it passes: there is nothing to regress from)."""
    recorded = baselines.get("ratios", {})
    lines = [f"{'check':<22}{'ours / peer':<44}{'ratio':>7}{'baseline':>10}{'limit':>8}  result"]
    passed = True
    for check in CHECKS:
        ratio = measured.get(check.name, "not measured")
        base = recorded.get(check.name)
        pair = f"{check.ours} / {check.peer} ({check.layout})"
        base_text = f"{base:.2f}" if isinstance(base, (int, float)) else "-"
        if isinstance(ratio, str):
            passed = False
            lines.append(f"{check.name:<22}{pair:<44}{'-':>7}{base_text:>10}{'-':>8}  FAIL {check.name}: {ratio}")
            continue
        if not isinstance(base, (int, float)):
            lines.append(f"{check.name:<22}{pair:<44}{ratio:>7.2f}{base_text:>10}{'-':>8}  NEW (no baseline)")
            continue
        limit = base * (1 + tolerance)
        ok = ratio <= limit
        passed = passed and ok
        verdict = "PASS" if ok else f"FAIL {check.name}: {ratio:.2f} > {limit:.2f} ({base:.2f} + {tolerance:.0%})"
        lines.append(f"{check.name:<22}{pair:<44}{ratio:>7.2f}{base_text:>10}{limit:>8.2f}  {verdict}")
    return lines, passed


def load_baselines(path: Path) -> dict[str, Any]:
    """The recorded baselines ({} when the file does not exist); ValueError names the file when it is not ours."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a baselines file: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("ratios", {}), dict) or not all(
            isinstance(value, (int, float)) for value in document.get("ratios", {}).values()):
        raise ValueError(f"{path}: not a baselines file: expected {{'ratios': {{check: number}}, ...}}")
    return document


def uptime() -> str:
    """`uptime`'s line (the load averages), or the load averages alone where the command is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def write_baselines(path: Path, measured: dict[str, float | str], *, command: str, date: str, load: str,
                    tolerance: float) -> None:
    """Record a run's ratios (temp file, fsync, rename: never half written). Every check must have a ratio."""
    missing = [name for name, ratio in measured.items() if isinstance(ratio, str)]
    if missing:
        raise ValueError(f"{path}: not recorded: no ratio for {', '.join(missing)}")
    document = {"command": command, "date": date, "uptime": load, "tolerance": tolerance,
                "ratios": {name: round(float(ratio), 3) for name, ratio in measured.items()}}
    atomic_write_bytes(path, (json.dumps(document, indent=2) + "\n").encode())
