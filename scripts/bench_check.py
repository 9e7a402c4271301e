"""The data path's regression guard: a short fixed set of our contenders against LitData in the same run, each ratio
compared with the last recorded one (benchmarks/baselines.json; see benchmarks/regression.py).

Checks (20-epoch totals of scripts/bench_peers.py, ours over the peer; lower is better):

    decoded               ours (decoded shards)                 / litdata
    encoded-decode-cache  ours (encoded, decode cache)          / litdata
    encoded-redecode      ours-redecode (decoding every epoch)  / litdata
    staging-cache40       ours-cache40 (staging cache, 40%)     / litdata-cache40

Prints each ratio, its baseline and the limit (baseline x (1 + tolerance)), then PASS or FAIL per check; exits 1
when any check fails (a worse ratio, or a row that did not run), 2 on bad arguments. `--record` writes the run's
ratios as the new baselines with the command, the date and `uptime`'s load. Runs in the benchmark venv:

    make bench-check
    .venv-bench/bin/python scripts/bench_check.py [--images 512] [--epochs 2] [--rounds 1] [--tolerance 0.3]
                                                  [--baselines benchmarks/baselines.json] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.regression import (  # noqa: E402
    BASELINES,
    CHECKS,
    TOLERANCE,
    compare,
    contenders,
    load_baselines,
    ratios,
    uptime,
    write_baselines,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2, help="epochs measured per contender (>= 2)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; each row keeps its best")
    parser.add_argument("--tolerance", type=float, default=None,
                        help=f"relative slack over a baseline (default: the file's, else {TOLERANCE})")
    parser.add_argument("--baselines", type=Path, default=BASELINES)
    parser.add_argument("--record", action="store_true", help="write this run's ratios as the new baselines")
    parser.add_argument("--timeout", type=float, default=600.0, help="per contender run, seconds")
    parser.add_argument("--workdir", type=Path, default=None)
    return parser.parse_args(argv)


def _peers(args: argparse.Namespace, layout: str) -> tuple[list[str], dict[str, dict]]:
    command = [sys.executable, str(REPO / "scripts" / "bench_peers.py"), "--json", "--layouts", layout,
               "--contenders", ",".join(contenders(layout)), "--images", str(args.images),
               "--epochs", str(args.epochs), "--rounds", str(args.rounds), "--timeout", f"{args.timeout:g}"]
    if args.workdir is not None:
        command += ["--workdir", str(args.workdir)]
    # bench_peers prints progress on stderr (passed through) and the report on stdout.
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=REPO, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{shlex.join(command[1:])}: exit {result.returncode}")
    return command, json.loads(result.stdout)["layouts"]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.epochs < 2 or args.images < 128 or args.rounds < 1 or (args.tolerance is not None and args.tolerance < 0):
        print("error: --epochs/--images/--rounds/--tolerance: need epochs >= 2, images >= 128, rounds >= 1, "
              "tolerance >= 0", file=sys.stderr)
        return 2
    try:
        baselines = load_baselines(args.baselines)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tolerance = args.tolerance if args.tolerance is not None else float(baselines.get("tolerance", TOLERANCE))
    started, load_start = datetime.datetime.now(datetime.UTC), uptime()
    layouts: dict[str, dict] = {}
    commands = []
    for layout in sorted({check.layout for check in CHECKS}):
        try:
            command, rows = _peers(args, layout)
        except (RuntimeError, ValueError, KeyError) as exc:
            print(f"error: bench_peers: {exc}", file=sys.stderr)
            return 1
        commands.append(shlex.join(["scripts/bench_peers.py", *command[2:]]))
        layouts.update(rows)
    measured = ratios(layouts)
    lines, passed = compare(measured, baselines, tolerance)
    load_end = uptime()
    print(f"bench-check {started:%Y-%m-%d %H:%M} UTC; uptime at start: {load_start}\n  at end: {load_end}")
    print("\n".join(f"ran: {command}" for command in commands))
    print("\n".join(lines))
    if baselines:
        print(f"baselines: {args.baselines.name} of {baselines.get('date', '?')} ({baselines.get('command', '?')}; "
              f"{baselines.get('uptime', '?')})")
    print(f"tolerance {tolerance:.0%}: {'PASS' if passed else 'FAIL'}")
    if args.record:
        own = shlex.join(["scripts/bench_check.py", *(argv if argv is not None else sys.argv[1:])])
        try:
            write_baselines(args.baselines, measured, command=own, date=f"{started:%Y-%m-%d %H:%M} UTC",
                            load=f"start: {load_start} | end: {load_end}", tolerance=tolerance)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"recorded {args.baselines}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
