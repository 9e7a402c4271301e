"""Write stacks/Pulumi.<stack>.yaml for a new AWS stack from the account's facts (infra.account.newstack).

    python scripts/new_stack.py --stack team --admin-role-arn arn:aws:iam::<account>:role/<admins>
    python scripts/new_stack.py --stack team --admin-role-arn ARN --account 210987654321 --region eu-west-1 \\
        --zones eu-west-1a,eu-west-1b,eu-west-1c        # offline: no AWS call

Without --account / --region / --zones they come from the current AWS credentials (sts get-caller-identity, the
configured region, ec2 describe-availability-zones). The file is validated by the stack schema and written
atomically; an existing file is kept unless --force. Exit 2 with `error: <where>: <why>` on bad input.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
DEFAULT_STACKS_DIR = Path(os.path.relpath(Path(__file__).resolve().parent.parent / "stacks"))

from infra.account.newstack import NewStackFacts, render_stack_file  # noqa: E402
from infra.config import ConfigError  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402
from workloads.data.format.manifest import atomic_write_bytes  # noqa: E402


def _csv(text: str | None, flag: str) -> list[str]:
    """A comma-separated flag's items; a flag given with an empty item (`,,,`, `a,,b`) is an error, never read as
    the flag's absence (an empty --runner-labels would silently mean a GitHub-hosted runner)."""
    if text is None:
        return []
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise ConfigError([(flag, f"{text!r} has an empty item: give comma-separated values, e.g. a,b")])
    return items


def _from_aws(args: argparse.Namespace) -> tuple[str, str, list[str]]:
    """(account, region, zones): the flags, else the current credentials' answers."""
    account, region, zones = args.account, args.region, _csv(args.zones, "--zones")
    if account and region and zones:
        return account, region, zones
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from workloads.awsenv import configured_region

    region = region or configured_region()  # AWS_REGION, then AWS_DEFAULT_REGION or the profile's region
    session: Any = boto3.session.Session(region_name=region)
    if not region:
        raise ConfigError([("arguments", "--region not given and no AWS region configured (AWS_REGION, "
                                         "aws configure)")])
    try:
        if not account:
            account = session.client("sts").get_caller_identity()["Account"]
        if not zones:
            answer = session.client("ec2", region_name=region).describe_availability_zones(Filters=[
                {"Name": "state", "Values": ["available"]}, {"Name": "zone-type", "Values": ["availability-zone"]}])
            zones = sorted(zone["ZoneName"] for zone in answer["AvailabilityZones"])
    except (BotoCoreError, ClientError) as exc:
        raise ConfigError([("aws", f"{str(exc).splitlines()[0]}: log in (aws sso login / aws configure) or "
                                   "pass --account, --region and --zones")]) from None
    return str(account), str(region), zones


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Write a new stack file from the account's facts.")
    parser.add_argument("--stack", required=True, help="the new stack's name (lower-case, digits, '-')")
    parser.add_argument("--admin-role-arn", required=True, help="IAM role that administers the cluster")
    parser.add_argument("--researcher-role-arn", help="IAM role that may edit the training namespace")
    parser.add_argument("--account", help="AWS account id (default: aws sts get-caller-identity)")
    parser.add_argument("--region", help="AWS region (default: the configured region)")
    parser.add_argument("--zones", help="availability zones, comma-separated (default: the region's first 3)")
    parser.add_argument("--public-access-cidr", action="append", dest="cidrs",
                        help="a network allowed to reach the API server (repeat; default 0.0.0.0/0)")
    parser.add_argument("--runner-labels", help="self-hosted deploy runner labels, comma-separated "
                                                "(default: GitHub-hosted)")
    parser.add_argument("--stacks-dir", type=Path, default=DEFAULT_STACKS_DIR)
    parser.add_argument("--force", action="store_true", help="replace an existing stack file")
    args = parser.parse_args(argv)
    path = args.stacks_dir / f"Pulumi.{args.stack}.yaml"
    try:
        if path.exists() and not args.force:
            raise ConfigError([(str(path), "exists: pick another --stack, or --force to replace it")])
        account, region, zones = _from_aws(args)
        text = render_stack_file(NewStackFacts(
            stack=args.stack, account_id=account, region=region, availability_zones=tuple(zones),
            admin_role_arn=args.admin_role_arn, researcher_role_arn=args.researcher_role_arn,
            public_access_cidrs=tuple(args.cidrs or ("0.0.0.0/0",)),
            deploy_runner_labels=tuple(_csv(args.runner_labels, "--runner-labels"))))
    except ConfigError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return 2
    try:
        atomic_write_bytes(path, text.encode())
    except OSError as exc:  # --stacks-dir a file, a directory in the file's place, no permission, disk full
        print(f"error: {path}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} (account {account}, {region}, zones {', '.join(zones[:3])}): "
          f"check it with make plan STACK={args.stack}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
