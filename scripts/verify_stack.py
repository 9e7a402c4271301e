"""Verify a deployed stack's storage: EFS mount targets and NFS rule, bucket protections (AWS, boto3), storage
classes, GPU/NVMe node labels and a test PVC (Kubernetes). Prints a pass/fail table; exit 1 on a failure.

    verify_stack.py --stack dev                       # runs `pulumi stack output --json -s dev`
    verify_stack.py --outputs outputs.json --skip-kubernetes
    verify_stack.py --stack dev --outputs outputs.json  # outputs from a file, the stack's kubeconfig

The Kubernetes checks use the stack's kubeconfig (~/.kube/ml-<stack>, from `make kubeconfig STACK=<stack>`), or
--kubeconfig, else KUBECONFIG, else ~/.kube/config (workloads.kubeconfig).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.storage.verify import (  # noqa: E402
    Check,
    OutputsError,
    aws_checks,
    check_queues,
    kubernetes_checks,
    list_kueue,
    render_table,
    storage_outputs,
)
from workloads.cli import ArgumentParser  # noqa: E402
from workloads.kubeconfig import KubeconfigError, load_kubernetes_config, resolve_kubeconfig  # noqa: E402
from workloads.submit.errors import RuntimeFailure  # noqa: E402
from workloads.submit.kube import DEFAULT_REQUEST_TIMEOUT_S, custom_objects_api  # noqa: E402


class UsageError(Exception):
    def __init__(self, where: str, why: str):
        self.where, self.why = where, why


def read_outputs(args: argparse.Namespace) -> dict[str, Any]:
    if args.outputs is not None:
        where = args.outputs
        try:
            text = sys.stdin.read() if where == "-" else Path(where).read_text()
        except OSError as exc:
            raise UsageError(where, f"cannot read: {exc.strerror}") from None
    else:
        where = f"pulumi stack output -s {args.stack}"
        try:
            done = subprocess.run(
                ["pulumi", "stack", "output", "--json", "-s", args.stack],
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            raise UsageError("pulumi", "the Pulumi CLI is not installed; pass --outputs FILE") from None
        if done.returncode != 0:
            raise UsageError(where, (done.stderr.strip().splitlines() or ["failed"])[-1])
        text = done.stdout
    try:
        outputs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(where, f"not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(outputs, dict):
        raise UsageError(where, "stack outputs must be a JSON object")
    return outputs


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stack", help="the Pulumi stack: its outputs (unless --outputs) and its kubeconfig")
    parser.add_argument("--outputs", help="read the outputs from this JSON file ('-' for stdin)")
    parser.add_argument("--region", help="AWS region (default: the stack output `region`)")
    parser.add_argument("--endpoint-url", help="send AWS calls here (tests, S3-compatible stores)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the stack's ~/.kube/ml-<stack>, else "
                                             "KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--label-prefix", default="ml-cluster.io", help="node label prefix (%(default)s)")
    parser.add_argument("--pvc-timeout", type=float, default=120.0, help="seconds to wait for the test PVC")
    parser.add_argument("--skip-aws", action="store_true")
    parser.add_argument("--skip-kubernetes", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    if args.stack is None and args.outputs is None:
        parser.error("give --stack or --outputs")
    return args


def run(args: argparse.Namespace) -> list[Check]:
    outputs = read_outputs(args)
    storage_outputs(outputs)
    checks: list[Check] = []
    if not args.skip_aws and outputs.get("platform", "eks") == "eks":
        import boto3

        region = args.region or outputs.get("region")
        if not region:
            raise UsageError("--region", "no region given and no `region` stack output")
        session = boto3.session.Session(region_name=region)
        checks += aws_checks(outputs, lambda service: session.client(service, endpoint_url=args.endpoint_url))
    if not args.skip_kubernetes:
        from kubernetes import client

        try:
            choice = resolve_kubeconfig(args.kubeconfig, args.stack, os.environ, Path.home())
            load_kubernetes_config(choice, args.context)
        except KubeconfigError as exc:
            raise UsageError(exc.where, exc.why) from None
        checks += kubernetes_checks(
            outputs, client.CoreV1Api(), client.StorageV1Api(), args.label_prefix, args.pvc_timeout
        )
        if (outputs.get("jobFacts") or {}).get("kueue"):
            custom = custom_objects_api(DEFAULT_REQUEST_TIMEOUT_S)  # every call, discovery too, within 30 s
            checks += check_queues(outputs, list_kueue(custom, "clusterqueues"), list_kueue(custom, "localqueues"))
    return checks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checks = run(args)
    except UsageError as exc:
        print(f"error: {exc.where}: {exc.why}", file=sys.stderr)
        return 2
    except OutputsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeFailure as exc:  # an API server that did not answer in time: nothing about the input
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps([check.__dict__ for check in checks], indent=1))
    else:
        print(render_table(checks))
    failed = [check for check in checks if check.status == "FAIL"]
    if failed:
        print(f"{len(failed)} of {len(checks)} checks failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
