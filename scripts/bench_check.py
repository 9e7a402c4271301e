"""The data path's regression gate: this checkout (head: its working tree) against a base commit (default HEAD~1)
in the same run, from a throwaway `git worktree` of the base, in rounds that alternate base and head.

    make bench-check [BASE=<ref>]
    .venv/bin/python scripts/bench_check.py [--base HEAD~1] [--cpu-rounds 3] [--rounds 3] [--wall-rows LIST|none]
                                            [--images 512] [--reader-images 256] [--calls-tolerance 0.1]
    .venv/bin/python scripts/bench_check.py --record-small-form     # rewrite benchmarks/baselines.json

Rows (benchmarks/regression.py has the rules): `calls` and `cpu` per reader (decoded, encoded, encoded-kept) from
scripts/bench_reader_cpu.py, one process per checkout under this checkout's harness, alternating; `wall` per row
(decoded, encoded-decode-cache; encoded-redecode and staging-cache40 on request) from scripts/bench_peers.py
--checkouts base=<worktree>. Prints one line per row and a final PASS or FAIL; exit 1 on FAIL, 2 on bad arguments.
Needs no peer library: it runs in the project's venv.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import selectors
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.reader_cost import READERS, small_form_calls  # noqa: E402
from benchmarks.regression import (  # noqa: E402
    BASELINES,
    CALLS_TOLERANCE,
    DEFAULT_WALL,
    FLOORS,
    WALL_ROWS,
    Verdict,
    base_checkout,
    describe_head,
    reader_verdicts,
    uptime,
    wall_verdicts,
    write_recorded,
)

LABEL = "base"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD~1", help="the commit head is compared with (default HEAD~1)")
    parser.add_argument("--cpu-rounds", type=int, default=3, help="alternating rounds of the reader measurements")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of the object-storage harness")
    parser.add_argument("--wall-rows", default=",".join(DEFAULT_WALL),
                        help=f"harness rows, of {', '.join(row.name for row in WALL_ROWS)}; `none` skips them")
    parser.add_argument("--images", type=int, default=512, help="images in the harness")
    parser.add_argument("--epochs", type=int, default=2, help="epochs measured per harness run (>= 2)")
    parser.add_argument("--reader-images", type=int, default=256, help="images the reader measurements pack")
    parser.add_argument("--calls-tolerance", type=float, default=CALLS_TOLERANCE)
    parser.add_argument("--cpu-floor", type=float, default=FLOORS["cpu"])
    parser.add_argument("--wall-floor", type=float, default=FLOORS["wall"])
    parser.add_argument("--timeout", type=float, default=600.0, help="per harness run or reader round, seconds")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--record-small-form", action="store_true",
                        help="measure the fast suite's small form in this tree and record it in baselines.json")
    return parser.parse_args(argv)


def _check(args: argparse.Namespace) -> str | None:
    names = {row.name for row in WALL_ROWS}
    rows = [] if args.wall_rows == "none" else [item for item in args.wall_rows.split(",") if item]
    if any(row not in names for row in rows):
        return f"--wall-rows: unknown {sorted(set(rows) - names)} (known: {', '.join(sorted(names))}, or none)"
    if args.cpu_rounds < 2 or (rows and args.rounds < 2):
        return "--cpu-rounds/--rounds: need at least 2 rounds (the base's spread needs two)"
    if args.images < 128 or args.reader_images < 128 or args.epochs < 2:
        return "--images/--reader-images/--epochs: need images >= 128 and epochs >= 2"
    if min(args.calls_tolerance, args.cpu_floor, args.wall_floor) < 0:
        return "--calls-tolerance/--cpu-floor/--wall-floor: must not be negative"
    return None


def _read_json_line(stream: IO[str], deadline: float) -> dict[str, Any] | None:
    """The next JSON line of a child's stdout before `deadline` (monotonic), or None (EOF or time up)."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                return None
            line = stream.readline()
            if not line:
                return None
            if line.startswith("{"):
                return json.loads(line)
    return None


def _reader_rounds(args: argparse.Namespace, work: Path, roots: dict[str, Path]) -> tuple[dict[str, list], list[str]]:
    """Each checkout's bench_reader_cpu report per round (None where it failed), alternating the order, one serving
    process per checkout; and the problems seen."""
    script = REPO / "scripts" / "bench_reader_cpu.py"
    children: dict[str, subprocess.Popen[str]] = {}
    logs = {label: (work / f"reader-{label}.log").open("w") for label in roots}
    reports: dict[str, list] = {label: [] for label in roots}
    problems = []
    try:
        for label, root in roots.items():
            command = [sys.executable, str(script), "--serve", "--repeat", "5", "--images", str(args.reader_images),
                       "--workdir", str(work / f"reader-{label}"), "--code", str(root)]
            children[label] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=logs[label], text=True, cwd=REPO)
        for label, child in children.items():
            assert child.stdout is not None
            if _read_json_line(child.stdout, time.monotonic() + args.timeout) is None:
                problems.append(f"{label}: the reader did not start (see {work / f'reader-{label}.log'})")
        for round_number in range(args.cpu_rounds):
            order = list(children) if round_number % 2 == 0 else list(reversed(children))
            for label in order:
                child = children[label]
                assert child.stdin is not None and child.stdout is not None
                report = None
                if child.poll() is None:
                    child.stdin.write("measure\n")
                    child.stdin.flush()
                    report = _read_json_line(child.stdout, time.monotonic() + args.timeout)
                reports[label].append(report)
                print(f"reader round {round_number} {label}: {json.dumps(report)}", file=sys.stderr, flush=True)
    finally:
        for child in children.values():
            if child.stdin is not None:
                child.stdin.close()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(timeout=30)
        for log in logs.values():
            log.close()
    for label in roots:
        if None in reports[label]:
            tail = ((work / f"reader-{label}.log").read_text().strip().splitlines() or ["no output"])[-1][:300]
            problems.append(f"{label}: reader failed: {tail}")
    return reports, problems


def _wall(args: argparse.Namespace, work: Path, base: Path) -> tuple[list[Verdict], list[str]]:
    """The harness rows: head's bench_peers with --checkouts base=<worktree>, one run per layout."""
    rows = [row for row in WALL_ROWS if row.name in args.wall_rows.split(",")]
    verdicts, commands = [], []
    for layout in sorted({row.layout for row in rows}):
        chosen = [row for row in rows if row.layout == layout]
        contenders = ",".join(dict.fromkeys(row.contender for row in chosen))
        command = [sys.executable, str(REPO / "scripts" / "bench_peers.py"), "--json", "--layouts", layout,
                   "--contenders", contenders, "--checkouts", f"{LABEL}={base}", "--images", str(args.images),
                   "--epochs", str(args.epochs), "--rounds", str(args.rounds), "--timeout", f"{args.timeout:g}",
                   "--jpegs", str(work / "jpegs"), "--workdir", str(work)]
        commands.append(shlex.join(["scripts/bench_peers.py", *command[2:]]))
        # bench_peers prints progress on stderr (passed through) and the report on stdout.
        result = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=REPO, check=False,
                                timeout=args.timeout * args.rounds * 2 * len(chosen) + 600)
        layouts = json.loads(result.stdout)["layouts"] if result.returncode == 0 else {}
        verdicts += wall_verdicts(layouts, chosen, LABEL, args.wall_floor)
    return verdicts, commands


def _record(args: argparse.Namespace, argv: list[str] | None) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-check-small-", dir=args.workdir) as tmp:
        calls = small_form_calls(Path(tmp))
    command = shlex.join(["scripts/bench_check.py", *(argv if argv is not None else sys.argv[1:])])
    write_recorded(BASELINES, calls, command=command, date=f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"recorded {BASELINES}: {json.dumps(calls)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = _check(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if args.record_small_form:
        return _record(args, argv)
    started = datetime.datetime.now(datetime.UTC)
    load_start = uptime()
    commands: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-check-", dir=args.workdir) as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        try:
            base_name, base_root = stack.enter_context(base_checkout(REPO, args.base, work))
        except ValueError as exc:
            print(f"error: --base: {exc}", file=sys.stderr)
            return 2
        print(f"bench-check {started:%Y-%m-%d %H:%M} UTC\n  head: {describe_head(REPO)}\n"
              f"  base: {base_name} ({args.base})\n  uptime at start: {load_start}", flush=True)
        reports, problems = _reader_rounds(args, work, {"head": REPO, LABEL: base_root})
        verdicts = reader_verdicts(reports[LABEL], reports["head"], readers=READERS,
                                   calls_tolerance=args.calls_tolerance, cpu_floor=args.cpu_floor)
        if args.wall_rows != "none":
            wall, commands = _wall(args, work, base_root)
            verdicts += wall
    print(f"  uptime at end:   {uptime()}")
    for line in [*(f"  ran: {command}" for command in commands), *(f"  problem: {problem}" for problem in problems),
                 *(verdict.line() for verdict in verdicts)]:
        print(line)
    failed = [f"{verdict.kind} {verdict.row}" for verdict in verdicts if not verdict.passed]
    print(f"bench-check: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
