"""Plan a stack offline: the real program under the Pulumi SDK mock engine, data sources from fixtures.

    python scripts/plan.py --stack NAME [--config FILE] [--json] [--manifests DIR] [--diff OLD.json]

Exit 0 on success; 2 with `error: <where>: <why>` lines for a bad stack file, a fixture that cannot answer, or bad
arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.config import ConfigError  # noqa: E402
from infra.offline import FixtureError, load_stack_file, placeholders_left, plan_stack  # noqa: E402
from infra.planview import diff, format_diff, summary, write_manifests  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: arguments: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str]) -> int:
    parser = _Parser(description="Render a stack's plan offline (no cloud credentials needed).")
    parser.add_argument("--stack", required=True, help="stack name: dev, staging, prod, onprem, ...")
    parser.add_argument("--config", type=Path, help="plan this Pulumi.<stack>.yaml instead of stacks/'s")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON document")
    parser.add_argument("--manifests", type=Path, metavar="DIR", help="write every Kubernetes object as YAML")
    parser.add_argument("--diff", type=Path, metavar="OLD.json", help="compare with an earlier --json output")
    args = parser.parse_args(argv)

    if args.manifests is not None and args.manifests.exists() and not args.manifests.is_dir():
        print(f"error: {args.manifests}: exists and is not a directory", file=sys.stderr)
        return 2
    old_plan = None
    if args.diff is not None:
        try:
            old_plan = json.loads(args.diff.read_text())
            if not isinstance(old_plan, dict) or not isinstance(old_plan.get("resources"), list):
                raise ValueError("not a plan document (no resources list)")
        except (OSError, ValueError) as exc:
            print(f"error: {args.diff}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return 2
    try:
        plan = plan_stack(args.stack, args.config)
    except ConfigError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return 2
    except FixtureError as exc:
        print(f"error: {exc.fixture}: {exc.why}", file=sys.stderr)
        return 2

    left = placeholders_left(load_stack_file(args.stack, args.config))
    if left:  # the plan is fine offline; say that a real run is not, and where to start
        path, why = left[0]
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        print(f"note: a real preview/up of {args.stack} refuses its placeholders{more}: {path}: {why}",
              file=sys.stderr)
    if args.manifests is not None:
        try:
            written = write_manifests(plan, args.manifests)
        except OSError as exc:
            print(f"error: {args.manifests}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {len(written)} manifests to {args.manifests}", file=sys.stderr)
    if old_plan is not None:
        changes = diff(old_plan, plan)
        print(json.dumps(changes, indent=2) if args.json else format_diff(changes), end="\n" if args.json else "")
    elif args.json:
        print(json.dumps(plan, indent=2, sort_keys=False))
    else:
        print(summary(plan), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
