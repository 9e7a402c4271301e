"""Plan a stack offline: the real program under the Pulumi SDK mock engine, data sources from fixtures.

    python scripts/plan.py --stack NAME [--config FILE] [--json] [--manifests DIR] [--facts FILE] [--diff OLD.json]
                           [--cost [--prices fixture|aws]] [--today YYYY-MM-DD]

--cost prints what the stack costs per hour and month at its pools' min, desired and max sizes, and each Job's
GPU-hours and cost at its deadline (infra.plan.cost); with --diff, the cost of the old plan against this one. Prices
come from stacks/fixtures/prices.json (offline, the default) or, with --prices aws, from the AWS Price List API and the
Spot price history (needs AWS credentials).

The stack's Kubernetes minor is read against the support calendar (infra/config/support.py) on --today (default:
today, UTC): a `note:` when its support ends within 90 days, a `warning:` once it has ended; the cost estimate
prices the control plane by its tier that day. --diff refuses a control plane that moves more than one minor, and a
node group ahead of its control plane (EKS upgrades one minor at a time: control plane, then nodes).

Exit 0 on success; 2 with `error: <where>: <why>` lines for a bad stack file, a fixture that cannot answer, or bad
arguments.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.plan.cost import estimate, format_cost_diff, format_report, report_document  # noqa: E402
from infra.plan.engine import (  # noqa: E402
    PlanStopped,
    load_stack_file,
    offline_account,
    placeholders_left,
    plan_error_lines,
    plan_stack,
)
from infra.plan.goodput import goodput_diff_lines, goodput_lines, goodput_notes, job_predictions  # noqa: E402
from infra.plan.holdings import PlanValueError  # noqa: E402
from infra.plan.pricing import PriceError  # noqa: E402
from infra.plan.view import (  # noqa: E402
    PlanDocumentError,
    diff,
    format_diff,
    load_plan_document,
    plan_job_notes,
    plan_support_notes,
    summary,
    upgrade_problems,
    write_manifests,
)
from workloads.cli import ArgumentParser, parse_day  # noqa: E402
from workloads.data.format.manifest import atomic_write_bytes  # noqa: E402


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Render a stack's plan offline (no cloud credentials needed).")
    parser.add_argument("--stack", required=True, help="stack name: dev, staging, prod, onprem, ...")
    parser.add_argument("--config", type=Path, help="plan this Pulumi.<stack>.yaml instead of stacks/'s")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON document")
    parser.add_argument("--manifests", type=Path, metavar="DIR", help="write every Kubernetes object as YAML")
    parser.add_argument("--facts", type=Path, metavar="FILE",
                        help="write the stack's job facts (ClusterFacts JSON) for rendering Jobs without a cluster")
    parser.add_argument("--diff", type=Path, metavar="OLD.json", help="compare with an earlier --json output")
    parser.add_argument("--cost", action="store_true",
                        help="print the cost estimate (with --diff: the cost diff; with --json: as JSON)")
    parser.add_argument("--goodput", action="store_true",
                        help="print each Job's predicted goodput (with --diff: base -> head)")
    parser.add_argument("--prices", choices=("fixture", "aws"), default="fixture",
                        help="where --cost gets prices: the offline fixture (default) or AWS (credentials needed)")
    parser.add_argument("--today", type=parse_day, default=datetime.now(UTC).date(), metavar="YYYY-MM-DD",
                        help="the day the support calendar and the control plane's rate are read for (default: today)")
    args = parser.parse_args(argv)

    if args.manifests is not None and args.manifests.exists() and not args.manifests.is_dir():
        print(f"error: {args.manifests}: exists and is not a directory", file=sys.stderr)
        return 2
    old_plan = None
    if args.diff is not None:
        try:
            old_plan = load_plan_document(args.diff, args.stack)
        except PlanDocumentError as exc:
            print(f"error: {args.diff}: {exc}", file=sys.stderr)
            return 2
    try:
        plan = plan_stack(args.stack, args.config)
    except PlanStopped as exc:
        print("\n".join(plan_error_lines(exc)), file=sys.stderr)
        return 2

    if old_plan is not None:
        problems = upgrade_problems(old_plan, plan)
        if problems:
            print("\n".join(f"error: {where}: {why}" for where, why in problems), file=sys.stderr)
            return 2
    for level, text in plan_support_notes(plan, args.today):
        print(f"{'note' if level == 'note' else 'warning'}: {text}", file=sys.stderr)
    stack_file = load_stack_file(args.stack, args.config)
    for text in goodput_notes(job_predictions(plan)):
        print(f"note: {text}", file=sys.stderr)
    for text in plan_job_notes(plan):
        print(f"note: {text}", file=sys.stderr)
    account_note = offline_account(stack_file)[1]
    if account_note:
        print(f"note: {account_note}", file=sys.stderr)
    left = placeholders_left(stack_file)
    if left:  # the plan is fine offline; say that a real run is not, and where to start
        path, why = left[0]
        more = f" (and {len(left) - 1} more)" if len(left) > 1 else ""
        print(f"note: a real preview/up of {args.stack} refuses its placeholders{more}: {path}: {why}",
              file=sys.stderr)
    if args.manifests is not None:
        try:
            written = write_manifests(plan, args.manifests)
        except OSError as exc:
            print(f"error: {exc.filename or args.manifests}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {len(written)} manifests to {args.manifests}", file=sys.stderr)
    if args.facts is not None:
        try:  # what `pulumi stack output jobFacts` holds after `up`, for `workloads.submit render --facts`
            atomic_write_bytes(args.facts, (json.dumps(plan["outputs"]["jobFacts"], indent=2) + "\n").encode())
        except OSError as exc:
            print(f"error: {exc.filename or args.facts}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote the stack's job facts to {args.facts} (python -m workloads.submit render SPEC --facts "
              f"{args.facts})", file=sys.stderr)
    if args.goodput:  # the plan's predicted goodput per Job; with --diff, the base's beside it
        lines = (goodput_diff_lines(job_predictions(old_plan), job_predictions(plan)) if old_plan is not None
                 else goodput_lines(job_predictions(plan))[1:])
        print("\n".join(lines or ["no stack Jobs"]))
    elif args.cost:
        try:
            text = cost_text(plan, old_plan, args.prices, args.today, as_json=args.json)
        except PriceError as exc:
            print(f"error: {exc.where}: {exc.why}", file=sys.stderr)
            return 2
        except PlanValueError as exc:  # the head plan is this program's; a hand-edited one is the --diff file
            print(f"error: {args.diff or args.stack}: {exc}", file=sys.stderr)
            return 2
        print(text, end="")
    elif old_plan is not None:
        changes = diff(old_plan, plan)
        print(json.dumps(changes, indent=2) if args.json else format_diff(changes), end="\n" if args.json else "")
    elif args.json:
        print(json.dumps(plan, indent=2, sort_keys=False))
    else:
        print(summary(plan), end="")
    return 0


def cost_text(plan: dict[str, Any], old_plan: dict[str, Any] | None, source: str, today: date,
              as_json: bool = False) -> str:
    """The cost table of `plan` (or its JSON document), or the cost diff from `old_plan` to it, both priced from one
    source (with --json, the two documents as {"base": ..., "head": ...})."""
    from infra.plan.prices import prices_for

    client = None
    if source == "aws":
        import boto3

        session = boto3.session.Session()  # its own credential chain, not boto3's process-wide default session
        client = lambda service, region: session.client(service, region_name=region)  # noqa: E731
    prices, label = prices_for([plan] + ([old_plan] if old_plan is not None else []), client)
    report = estimate(plan, prices, label, today)
    old_report = estimate(old_plan, prices, label, today) if old_plan is not None else None
    if as_json:
        document = report_document(report)
        if old_report is not None:
            document = {"base": report_document(old_report), "head": document}
        return json.dumps(document, indent=2) + "\n"
    if old_report is None:
        return format_report(report)
    return format_cost_diff(old_report, report)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
