"""Write stacks/Pulumi.<stack>.yaml for a new AWS stack from the account's facts (infra.account.newstack).

    python scripts/new_stack.py --stack team --admin-role-arn arn:aws:iam::<account>:role/<admins>
    python scripts/new_stack.py --stack team --admin-role-arn ARN --account 210987654321 --region eu-west-1 \\
        --zones eu-west-1a,eu-west-1b,eu-west-1c        # offline: no AWS call
    aws eks describe-cluster --name shared > shared.json
    python scripts/new_stack.py --stack team --from-cluster shared.json    # onto an existing EKS cluster, offline
    python scripts/new_stack.py --stack team --cluster shared --region eu-west-1   # the same, read live

Without --account / --region / --zones they come from the current AWS credentials (sts get-caller-identity, the
configured region, ec2 describe-availability-zones). The file is validated by the stack schema and written
atomically; an existing file is kept unless --force. Exit 2 with `error: <where>: <why>` on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
DEFAULT_STACKS_DIR = Path(os.path.relpath(Path(__file__).resolve().parent.parent / "stacks"))

from infra.account.newstack import (  # noqa: E402
    ExistingStackFacts,
    NewStackFacts,
    cluster_releases,
    render_existing_stack_file,
    render_stack_file,
)
from infra.config import ConfigError  # noqa: E402
from infra.existing_cluster import ClusterAnswerError, found_from_describe  # noqa: E402
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


# `make new-stack` passes extra flags through one variable (docs/operations.md)
_THROUGH_MAKE = (" (through make: NEW_STACK_ARGS='--account 123456789012 --region us-west-2 --zones "
                 "us-west-2a,us-west-2b,us-west-2c')")


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
                                         f"aws configure){_THROUGH_MAKE}")])
    try:
        if not account:
            account = session.client("sts").get_caller_identity()["Account"]
        if not zones:
            answer = session.client("ec2", region_name=region).describe_availability_zones(Filters=[
                {"Name": "state", "Values": ["available"]}, {"Name": "zone-type", "Values": ["availability-zone"]}])
            zones = sorted(zone["ZoneName"] for zone in answer["AvailabilityZones"])
    except (BotoCoreError, ClientError) as exc:
        raise ConfigError([("aws", f"{str(exc).splitlines()[0]}: log in (aws sso login / aws configure) or "
                                   f"pass --account, --region and --zones{_THROUGH_MAKE}")]) from None
    return str(account), str(region), zones


MAX_DESCRIBE_BYTES = 1 << 20  # a DescribeCluster answer is a few KiB


def _described(path: Path) -> tuple[Any, str]:
    """The `cluster` object of a saved `aws eks describe-cluster --name X` (ConfigError naming the file)."""
    where = str(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_DESCRIBE_BYTES + 1)
    except OSError as exc:  # missing, a directory, no permission
        raise ConfigError([(where, f"cannot read: {exc.strerror or exc}")]) from None
    if len(data) > MAX_DESCRIBE_BYTES:
        raise ConfigError([(where, f"over {MAX_DESCRIBE_BYTES} bytes: not a DescribeCluster answer")])
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError([(where, f"not UTF-8 text (byte {exc.start})")]) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError([(where, f"not JSON: {str(exc).splitlines()[0]}")]) from None
    if not isinstance(document, dict) or "cluster" not in document:
        raise ConfigError([(where, "not the output of aws eks describe-cluster --name <cluster> (a JSON object "
                                   "with a \"cluster\" object)")])
    return document["cluster"], where


def _live_cluster(name: str, region: str | None) -> tuple[Any, frozenset[str], str]:
    """DescribeCluster through boto3, and which of its subnets map public IPs (EC2 DescribeSubnets)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from workloads.awsenv import configured_region

    region = region or configured_region()
    if not region:
        raise ConfigError([("arguments", "--region not given and no AWS region configured (AWS_REGION, "
                                         f"aws configure){_THROUGH_MAKE}")])
    session: Any = boto3.session.Session(region_name=region)
    try:
        cluster = session.client("eks").describe_cluster(name=name).get("cluster")
        subnets = ((cluster or {}).get("resourcesVpcConfig") or {}).get("subnetIds") or []
        answer = session.client("ec2").describe_subnets(SubnetIds=list(subnets))["Subnets"] if subnets else []
    except (BotoCoreError, ClientError) as exc:
        raise ConfigError([("aws", f"{str(exc).splitlines()[0]}: log in (aws sso login / aws configure) or pass "
                                   "--from-cluster with a saved aws eks describe-cluster")]) from None
    public = frozenset(str(s.get("SubnetId")) for s in answer if s.get("MapPublicIpOnLaunch") is True)
    return cluster, public, f"DescribeCluster in {region}"


def _live_releases(found: Any, region: str | None) -> tuple[tuple[Any, ...], str]:
    """The Helm releases the cluster runs, through its Kubernetes API (TLS against its CA, an EKS token made from the
    same credentials, as preflight reads them); () and a comment line when they cannot be read."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from infra.account.kubeapi import KubeApi, eks_token
    from workloads.awsenv import configured_region

    try:
        sts = boto3.session.Session(region_name=region or configured_region()).client("sts")
        token = eks_token(sts, found.name)
    except (BotoCoreError, ClientError) as exc:
        return (), f"  # Helm releases not read (no EKS token: {str(exc).splitlines()[0]}): run `make preflight`\n"
    return cluster_releases(KubeApi(found.endpoint, token, found.certificate_authority, cluster=found.name))


def _existing(args: argparse.Namespace) -> str:
    """The stack file's text for --from-cluster FILE or --cluster NAME."""
    public: frozenset[str] = frozenset()
    if args.from_cluster is not None:
        answer, source = _described(args.from_cluster)
    else:
        answer, public, source = _live_cluster(args.cluster, args.region)
    try:
        found = found_from_describe(answer, asked=args.cluster)
    except ClusterAnswerError as exc:
        raise ConfigError([(source, str(exc))]) from None
    releases, note = _live_releases(found, args.region) if args.from_cluster is None else ((), "")
    return render_existing_stack_file(ExistingStackFacts(
        stack=args.stack, cluster=found, public_subnet_ids=public, admin_role_arn=args.admin_role_arn,
        researcher_role_arn=args.researcher_role_arn, source=source, releases=releases, releases_note=note))


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Write a new stack file from the account's facts.")
    parser.add_argument("--stack", required=True, help="the new stack's name (lower-case, digits, '-')")
    parser.add_argument("--admin-role-arn", help="IAM role that administers the cluster (required for a new "
                                                 "cluster; on an existing one, an access entry for it)")
    parser.add_argument("--researcher-role-arn", help="IAM role that may edit the training namespace")
    parser.add_argument("--account", help="AWS account id (default: aws sts get-caller-identity)")
    parser.add_argument("--region", help="AWS region (default: the configured region)")
    parser.add_argument("--zones", help="availability zones, comma-separated (default: the region's first 3)")
    parser.add_argument("--public-access-cidr", action="append", dest="cidrs",
                        help="a network allowed to reach the API server (repeat; default 0.0.0.0/0)")
    parser.add_argument("--runner-labels", help="self-hosted deploy runner labels, comma-separated "
                                                "(default: GitHub-hosted)")
    parser.add_argument("--from-cluster", type=Path, metavar="FILE",
                        help="lay the stack onto an existing EKS cluster: FILE is `aws eks describe-cluster --name X` "
                             "output (offline)")
    parser.add_argument("--cluster", help="lay the stack onto this existing EKS cluster, read live (DescribeCluster, "
                                          "DescribeSubnets)")
    parser.add_argument("--stacks-dir", type=Path, default=DEFAULT_STACKS_DIR)
    parser.add_argument("--force", action="store_true", help="replace an existing stack file")
    args = parser.parse_args(argv)
    path = args.stacks_dir / f"Pulumi.{args.stack}.yaml"
    try:
        if path.exists() and not args.force:
            raise ConfigError([(str(path), "exists: pick another --stack, or --force to replace it")])
        if args.from_cluster is not None or args.cluster is not None:
            text = _existing(args)
            done = f"wrote {path} (on EKS cluster {args.cluster or 'from ' + str(args.from_cluster)})"
            return _write(path, text, f"{done}: check it with make plan STACK={args.stack} (offline: add the "
                                      "cluster and its subnets to stacks/fixtures/), then make preflight")
        if not args.admin_role_arn:
            raise ConfigError([("--admin-role-arn", "required for a new cluster (or give --from-cluster / "
                                                    "--cluster for an existing one)")])
        account, region, zones = _from_aws(args)
        text = render_stack_file(NewStackFacts(
            stack=args.stack, account_id=account, region=region, availability_zones=tuple(zones),
            admin_role_arn=args.admin_role_arn, researcher_role_arn=args.researcher_role_arn,
            public_access_cidrs=tuple(args.cidrs or ("0.0.0.0/0",)),
            deploy_runner_labels=tuple(_csv(args.runner_labels, "--runner-labels"))))
    except ConfigError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return 2
    return _write(path, text, f"wrote {path} (account {account}, {region}, zones {', '.join(zones[:3])}): "
                              f"check it with make plan STACK={args.stack}")


def _write(path: Path, text: str, done: str) -> int:
    try:
        atomic_write_bytes(path, text.encode())
    except OSError as exc:  # --stacks-dir a file, a directory in the file's place, no permission, disk full
        print(f"error: {path}: cannot write: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(done)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
