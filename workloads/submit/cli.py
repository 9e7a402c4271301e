"""The `submit` command line: arguments, the command that runs, one-line errors and exit codes (2: the input,
1: the cluster or the run)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import workloads.submit
from workloads.cli import ArgumentParser
from workloads.cluster_facts import FACTS_CONFIG_MAP
from workloads.jobspec import TRAIN_CONTAINER, JobSpecError
from workloads.kubeconfig import KubeconfigError, check_stack_name
from workloads.manifest_yaml import dump_manifests
from workloads.submit.commands import delete_run, show_logs, start_run
from workloads.submit.errors import RuntimeFailure, UsageError
from workloads.submit.facts import cluster_facts, gang_timeout
from workloads.submit.inputs import render_pack, render_spec_file
from workloads.submit.kube import CONNECT_TIMEOUT_S, DEFAULT_REQUEST_TIMEOUT_S, apis, create_manifests
from workloads.submit.observe import DEFAULT_WATCH_TIMEOUT_S, show_status, watch_run


def build_parser() -> argparse.ArgumentParser:
    summary = (workloads.submit.__doc__ or "").splitlines()[0]
    parser = ArgumentParser(prog="python -m workloads.submit", description=summary)
    parser.add_argument("--stack", help="the stack's kubeconfig (make kubeconfig STACK=S; default: the current "
                                        "kubeconfig context), and its jobFacts output where the cluster has no facts")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: the stack's, else KUBECONFIG, else "
                                             "~/.kube/config)")
    parser.add_argument("--context", help="kubeconfig context (default: current)")
    parser.add_argument("--namespace", "-n", default="training",
                        help="the run's namespace (a team's Jobs run in the team's namespace)")
    parser.add_argument("--request-timeout", type=_request_timeout, default=DEFAULT_REQUEST_TIMEOUT_S,
                        metavar="SECONDS", help="the longest wait for any answer of the API server (default "
                        f"{DEFAULT_REQUEST_TIMEOUT_S:g}; connecting: at most {CONNECT_TIMEOUT_S:g}); then exit 1")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in ("render", "submit"):
        sub = commands.add_parser(command, help=f"{command} the Jobs of a spec file")
        sub.add_argument("job_file", help="YAML spec file, e.g. workloads/jobs/resnet50-s3-copy.yaml")
        sub.add_argument("--facts", help="ClusterFacts JSON (pulumi stack output jobFacts --json); default: the "
                                         f"cluster's ConfigMap {FACTS_CONFIG_MAP} in -n")
    pack = commands.add_parser("pack", help="pack a dataset on the cluster: an Indexed Job of --slices slices (CPU "
                                            "pools, Kueue's cpu flavor) and its publish Job")
    pack.add_argument("source", help="s3://BUCKET/PREFIX of class folders, or s3://BUCKET/PATH/LIST.csv|.jsonl")
    pack.add_argument("dest", help="s3://BUCKET/PREFIX the dataset is packed into (manifest published last)")
    pack.add_argument("--slices", type=int, required=True, help="pods packing at once (completions = parallelism)")
    pack.add_argument("--name", default="dataset", help="the Jobs' name: pack-<name>-<hash>[-publish]")
    pack.add_argument("--image", help="container image (default: <the stack's repository>:--image-tag)")
    pack.add_argument("--image-tag", help="tag of the stack's own registry (jobFacts image_repository)")
    pack.add_argument("--layout", choices=["decoded", "encoded", "records"], default="decoded",
                      help="records: SOURCE holds Parquet / Arrow IPC / JSONL / npy tables (pack-tables)")
    pack.add_argument("--fields", help="records: the fields, a JSON list (pack-tables --fields)")
    pack.add_argument("--map", dest="map_hook", metavar="MODULE:FUNCTION",
                      help="records: a function record -> record | None in the image (pack-tables --map)")
    pack.add_argument("--image-column", action="append", default=[], metavar="COLUMN",
                      help="records: a column naming an image under --images (repeatable)")
    pack.add_argument("--images", help="records: s3:// prefix of the images (default: SOURCE)")
    pack.add_argument("--shard-rows", type=int, default=4096, help="records: rows per shard")
    pack.add_argument("--size", type=int, default=256, help="decoded image side in pixels")
    pack.add_argument("--shard-size", default="1GiB")
    pack.add_argument("--cpu", type=int, default=4, help="CPUs per slice pod (its decoding processes)")
    pack.add_argument("--memory", default="8GiB", help="memory per slice pod")
    pack.add_argument("--queue", help="Kueue LocalQueue (default: the stack's)")
    pack.add_argument("--facts", help=f"ClusterFacts JSON; default: the cluster's ConfigMap {FACTS_CONFIG_MAP}")
    pack.add_argument("--render", action="store_true", help="print the manifests instead of creating them")
    start = commands.add_parser("start", help="start a suspended run (the stack creates its Jobs suspended)")
    start.add_argument("name")
    status = commands.add_parser("status", help="phase and progress of a submitted run")
    status.add_argument("name")
    status.add_argument("--json", action="store_true")
    watch = commands.add_parser("watch", help="status every --interval seconds until the run ends")
    watch.add_argument("name")
    watch.add_argument("--interval", type=_interval, default=10.0, metavar="SECONDS")
    watch.add_argument("--timeout", type=_watch_timeout, default=DEFAULT_WATCH_TIMEOUT_S, metavar="SECONDS",
                       help="give up (exit 1) when the run has not ended after this long (default: 7 days)")
    logs = commands.add_parser("logs", help="logs of a run's pod")
    logs.add_argument("name")
    logs.add_argument("--container", default=TRAIN_CONTAINER)
    logs.add_argument("--index", type=int, default=0, help="completion index (multi-node)")
    logs.add_argument("--follow", "-f", action="store_true")
    delete = commands.add_parser("delete", help="delete a run (its pods, Service and NetworkPolicy too)")
    delete.add_argument("name")
    return parser


def _seconds(text: str, low: float, high: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not low <= value <= high:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"must be {low:g}-{high:g} seconds, got {text}")
    return value


def _request_timeout(text: str) -> float:
    return _seconds(text, 0.1, 3600)


def _watch_timeout(text: str) -> float:
    return _seconds(text, 1, 365 * 24 * 3600)


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be 1-3600 seconds, got {text}")
    return value


def run_command(args: argparse.Namespace) -> int:
    if args.command == "pack":
        manifests = render_pack(args, cluster_facts(args))
        if args.render:
            sys.stdout.write(dump_manifests(manifests))
            return 0
        batch, core, networking = apis(args)
        print("\n".join(create_manifests(manifests, batch, core, networking)))
        print(f"watch: python -m workloads.submit -n {manifests[0]['metadata']['namespace']} watch "
              f"{manifests[0]['metadata']['name']}")
        return 0
    if args.command in ("render", "submit"):
        manifests = render_spec_file(args.job_file, cluster_facts(args))
        if args.command == "render":
            sys.stdout.write(dump_manifests(manifests))
            return 0
        batch, core, networking = apis(args)
        print("\n".join(create_manifests(manifests, batch, core, networking)))
        return 0
    batch, core, networking = apis(args)
    if args.command == "status":
        return show_status(batch, core, args.namespace, args.name, args.json, gang_timeout=lambda: gang_timeout(args))
    if args.command == "watch":
        try:
            return watch_run(batch, core, args.namespace, args.name, args.interval, timeout=args.timeout)
        except KeyboardInterrupt:
            return 130
    if args.command == "start":
        return start_run(batch, args.namespace, args.name)
    if args.command == "logs":
        return show_logs(batch, core, args.namespace, args.name, args.container, args.index, args.follow)
    return delete_run(batch, core, networking, args.namespace, args.name)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.stack is not None:  # it names files (~/.kube/ml-<stack>) and the Pulumi stack read for facts
            check_stack_name(args.stack)
        return run_command(args)
    except (JobSpecError, UsageError, KubeconfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # API and connection errors: one line, no traceback
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        if isinstance(exc, ApiException):
            print(f"error: kubernetes API: {exc.status} {exc.reason}", file=sys.stderr)
            # Refused (401/403/404/409/422...): the input or the credentials; the server failing (5xx): runtime.
            return 1 if not exc.status or exc.status >= 500 or exc.status == 429 else 2
        if isinstance(exc, HTTPError):
            print(f"error: kubernetes API: unreachable ({type(exc).__name__})", file=sys.stderr)
            return 1
        raise
