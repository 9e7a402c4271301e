"""Check an AWS account against a stack before `pulumi up`: credentials, region, zones, instance offerings, vCPU
quotas, the Kubernetes version, bucket names and the image repository (infra.account.preflight).

    python scripts/preflight.py --stack NAME [--config FILE] [--account ID]

Uses the standard AWS credential chain; every call is a read (Describe/Get/Head). Prints a PASS/WARN/FAIL table
(with the fix under each FAIL) and exits 2 with one `error: <check>: <why>` line per FAIL, 0 otherwise; a bad stack
file or an onprem stack is an `error:` line and exit 2 too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.account.preflight import FAIL, format_checks, run_preflight  # noqa: E402
from infra.config import ConfigError  # noqa: E402
from infra.plan.engine import load_stack_file, offline_config  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Check an AWS account against a stack before pulumi up (read-only calls).")
    parser.add_argument("--stack", required=True, help="stack name: dev, staging, prod, ...")
    parser.add_argument("--config", type=Path, help="check this Pulumi.<stack>.yaml instead of stacks/'s")
    parser.add_argument("--account", help="the 12-digit account the credentials must belong to")
    args = parser.parse_args(argv)
    if args.account is not None and not re.fullmatch(r"\d{12}", args.account):
        print(f"error: --account: {args.account!r} is not a 12-digit AWS account id", file=sys.stderr)
        return 2

    from infra.config.schema import decode_config_value, parse_stack_config

    try:
        stack_file = load_stack_file(args.stack, args.config)
        config, secret_keys = offline_config(stack_file)
        cfg = parse_stack_config({key: decode_config_value(value) for key, value in config.items()}, secret_keys)
    except ConfigError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return 2
    if cfg.platform != "eks" or cfg.region is None:
        print(f"error: {stack_file.path}: ml-cluster:platform is {cfg.platform}: preflight checks AWS (eks) stacks "
              "only", file=sys.stderr)
        return 2

    import boto3

    from workloads.awsenv import configured_region

    session = boto3.session.Session()
    region = cfg.region
    checks = run_preflight(cfg, args.stack, lambda service: session.client(service, region_name=region),
                           session_region=configured_region(session), expected_account=args.account)
    print(format_checks(args.stack, region, checks), end="")
    failures = [check for check in checks if check.status == FAIL]
    for check in failures:
        print(f"error: {check.name}: {check.detail}" + (f"; fix: {check.fix}" if check.fix else ""), file=sys.stderr)
    return 2 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
