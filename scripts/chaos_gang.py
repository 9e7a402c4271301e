"""python scripts/chaos_gang.py [--trials 50] [--seed 0] [--checkpoint-every 3] [--elastic] [--goodput]
[--script SCRIPT [ARGS]]:
chaos trials on a 2-node training gang on 127.0.0.1 (benchmarks/chaos_gang.py): SIGKILL or SIGTERM a random node at
a random step (--elastic: or DROP one for good, the gang continuing on 1 node and sometimes growing back); prints
each trial, then the distribution of time-to-resume and steps lost as JSON and a table. Exit 1 when a trial fails
its checks. --script: your own training script (e.g. examples/train_plain.py) instead of the bundled trainer,
rendered through the same Job spec (`command: [python, SCRIPT]`); arguments the harness does not know go to it
(--tokens: token sequences for a language model, e.g. examples/train_fsdp.py --vocab-size 64).
--goodput: measured vs predicted goodput of the trials (benchmarks/chaos_goodput.py). --summarize WORKDIR: no trials;
the goodput table of those an earlier run kept in its --workdir (each trial's outcome.json), e.g. to compare models
on the same trials."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chaos_gang import Outcome, run_trials  # noqa: E402
from benchmarks.chaos_goodput import goodput_table, kind_rows, trials_goodput  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402


def _refuse(where: str, why: str) -> NoReturn:
    print(f"error: {where}: {why}", file=sys.stderr)
    raise SystemExit(2)


def _summarize(workdir: str, checkpoint_every: int) -> int:
    """The goodput table of the outcomes a run kept in `workdir` (straight/ and trialNNN/outcome.json)."""
    def load(path: Path) -> Outcome:
        try:
            return Outcome(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            _refuse("--summarize", f"{path}: not a kept outcome ({exc})")

    root = Path(workdir)
    straight = load(root / "straight" / "outcome.json")
    trials = [load(path) for path in sorted(root.glob("trial*/outcome.json"))]
    summary = trials_goodput(straight, trials, checkpoint_every)
    print("\n".join(goodput_table(summary)) if summary else "goodput: not measured (the run reported no step events)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=3)
    parser.add_argument("--rank-restarts", type=int, default=None,
                        help="torchrun --max-restarts (default: what the rendered Job sets)")
    parser.add_argument("--elastic", action="store_true",
                        help="render the Job with minNodes 1 (--global-batch-size) and DROP a node in a third of the "
                             "trials: the gang continues on 1 node, and in half of those grows back to 2")
    parser.add_argument("--workdir", default=None, help="keep the trials' files here (default: a temp dir)")
    parser.add_argument("--script", default=None,
                        help="a training script on the data API (it takes --data, --checkpoint-dir, "
                             "--checkpoint-every, --epochs, --batch-size, --workers, --seed); default: the bundled "
                             "trainer")
    parser.add_argument("--goodput", action="store_true",
                        help="also print measured vs predicted goodput per kill kind (benchmarks/chaos_goodput.py)")
    parser.add_argument("--tokens", action="store_true",
                        help="with --script: the samples as token sequences (a `tokens` field of 17 ids below 64) for "
                             "a language-model script, e.g. --script examples/train_fsdp.py --tokens --vocab-size 64")
    parser.add_argument("--summarize", metavar="WORKDIR", default=None,
                        help="run no trials: print the goodput table of the ones kept in WORKDIR by an earlier run's "
                             "--workdir (with its --checkpoint-every)")
    args, rest = parser.parse_known_args(argv)
    if args.summarize is not None:
        return _summarize(args.summarize, args.checkpoint_every)
    if rest and args.script is None:
        _refuse("arguments", f"unrecognized arguments: {' '.join(rest)} (arguments for a script need --script)")
    if args.script is not None and not Path(args.script).is_file():
        _refuse("--script", f"{args.script}: not a file")
    for flag, value, least in (("--trials", args.trials, 1), ("--checkpoint-every", args.checkpoint_every, 1),
                               ("--rank-restarts", args.rank_restarts, 0)):
        if value is not None and value < least:
            _refuse(flag, f"{value}: must be {least} or more")
    if args.workdir is not None:
        if Path(args.workdir).exists() and not Path(args.workdir).is_dir():
            _refuse("--workdir", f"{args.workdir}: exists and is not a directory")
        try:
            Path(args.workdir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _refuse("--workdir", f"{args.workdir}: cannot make it a directory ({exc.strerror or exc})")
    script = None if args.script is None else [args.script, *rest]

    def progress(number: int, outcome: Outcome) -> None:
        resume = f"{outcome.time_to_resume_s:.2f}s" if outcome.time_to_resume_s is not None else "-"
        skips = f" ({outcome.saves_skipped} saves skipped)" if outcome.saves_skipped else ""
        grow = (f", grew back in {outcome.grow_time_s:.2f}s lost {outcome.grow_steps_lost}"
                if outcome.grow_time_s is not None else "")
        print(f"trial {number:3d} {outcome.kill} node{outcome.node} at step {outcome.kill_step:2d}: resume {resume}, "
              f"lost {outcome.steps_lost}{skips}, at {outcome.world_after} nodes{grow}, "
              f"actions {' '.join(outcome.actions) or '-'}, "
              f"{'ok' if outcome.ok else 'FAILED: ' + '; '.join(outcome.problems)}", flush=True)

    with tempfile.TemporaryDirectory(prefix="chaos-gang-") as temp:
        root = Path(args.workdir) if args.workdir else Path(temp)
        summary = run_trials(root, args.trials, args.seed, args.checkpoint_every, progress, args.rank_restarts,
                             elastic=args.elastic, script=script, tokens=args.tokens)
    print(json.dumps(summary, indent=2))
    print(f"{'kill':8} {'trials':>6} {'resume median':>14} {'p95':>7} {'max':>7} {'lost median':>12} {'p95':>5} "
          f"{'max':>5} {'counted':>8}")
    for kind, row in kind_rows(summary):
        t, lost = row["time_to_resume_s"], row["steps_lost"]

        def fmt(value: float | None, unit: str = "") -> str:
            return "-" if value is None else f"{value:.2f}{unit}" if unit else f"{value:g}"

        print(f"{kind:8} {row['trials']:6d} {fmt(t['median'], 's'):>14} {fmt(t['p95'], 's'):>7} "
              f"{fmt(t['max'], 's'):>7} {fmt(lost['median']):>12} {fmt(lost['p95']):>5} {fmt(lost['max']):>5} "
              f"{row['counted_failures']:8d}")
        grow = row.get("grow_back")
        if grow and grow["trials"]:
            t, lost = grow["time_to_grow_s"], grow["steps_lost"]
            print(f"{'  grow':8} {grow['trials']:6d} {fmt(t['median'], 's'):>14} {fmt(t['p95'], 's'):>7} "
                  f"{fmt(t['max'], 's'):>7} {fmt(lost['median']):>12} {fmt(lost['p95']):>5} {fmt(lost['max']):>5}")
    if args.goodput:
        if summary.get("goodput") is None:
            print("goodput: not measured (the run reported no step events)")
        else:
            print("\n".join(goodput_table(summary["goodput"])))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
