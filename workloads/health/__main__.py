"""The burn-in's container commands (the health-check DaemonSet, infra/nodes/burnin.py, runs them in this order):

    python -m workloads.health plan   --node NODE --results DIR --label-prefix P
    (dcgm container: dcgmi diag -r L -j > DIR/dcgm.json; gpu container: torchrun ... workloads.health.gpucheck)
    python -m workloads.health efa    --results DIR
    python -m workloads.health report --node NODE --results DIR --label-prefix P --expect-gpus N [--expect-efa M]

`plan` writes DIR/skip when the node already passed, and every later step then does nothing: a DaemonSet pod
that restarts on a node in service never runs a diagnostic on GPUs a Job is using. `report` decides
(workloads.health.verdict), records the verdict on the node and then stays (a DaemonSet pod that exits is
restarted, and would check the node again). Bad arguments: `error: <where>: <why>`, exit 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workloads.cli import ArgumentParser
from workloads.health.dcgm import MAX_DIAG_BYTES, parse_diag
from workloads.health.efa import efa_check
from workloads.health.kube import InCluster, KubeError, record
from workloads.health.verdict import (
    Evidence,
    decide,
    hold_patch,
    node_patch,
    read_efa_check,
    read_gpu_check,
    should_run,
)
from workloads.k8snames import is_dns_subdomain
from workloads.safeio import StateFileError, atomic_write_in, parse_json_object, read_regular

SKIP = "skip"
MAX_RESULT_BYTES = 1024 * 1024


def _node_name(text: str) -> str:
    if not is_dns_subdomain(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a node name")
    return text


def read_result(path: Path, cap: int = MAX_RESULT_BYTES) -> str | None:
    """A result file's text, or None when there is none. Only a regular file is read (a link is not followed, a
    FIFO never blocks); oversized files are refused (StateFileError, a ValueError naming the file)."""
    data, _ = read_regular(path, cap)
    return None if data is None else data.decode("utf-8", "replace")


def _json_result(path: Path) -> dict[str, Any] | None:
    data, _ = read_regular(path, MAX_RESULT_BYTES)
    return None if data is None else parse_json_object(data, path)


def _exit_code(results: Path, name: str) -> int | None:
    text = read_result(results / f"{name}.rc", 64)
    return int(text.strip()) if text is not None and text.strip().lstrip("-").isdigit() else None


def gather(results: Path, expected_gpus: int, expected_efa: int) -> tuple[Evidence, list[str]]:
    """The evidence the checks left in `results`, and the problems reading it (each also a failure)."""
    problems: list[str] = []
    dcgm_text = read_result(results / "dcgm.json", MAX_DIAG_BYTES)
    gpu = efa = None
    try:
        gpu_document = _json_result(results / "gpu.json")
        gpu = read_gpu_check(gpu_document) if gpu_document is not None else None
    except ValueError as exc:
        problems.append(f"gpu: unreadable result: {exc}")
    if expected_efa:
        try:
            efa_document = _json_result(results / "efa.json")
            efa = read_efa_check(efa_document) if efa_document is not None else None
        except ValueError as exc:
            problems.append(f"efa: unreadable result: {exc}")
    evidence = Evidence(expected_gpus=expected_gpus, expected_efa=expected_efa,
                        dcgm=parse_diag(dcgm_text) if dcgm_text is not None else None,
                        dcgm_exit=_exit_code(results, "dcgm"), gpu=gpu, gpu_exit=_exit_code(results, "gpu"),
                        efa=efa, efa_exit=_exit_code(results, "efa"))
    return evidence, problems


def _hold() -> int:
    """Stay until the pod is stopped (SIGTERM): the DaemonSet's pod is the record that this node was checked."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="python -m workloads.health", description="the GPU node burn-in's steps")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    plan = commands.add_parser("plan", help="write RESULTS/skip when the node already passed")
    efa = commands.add_parser("efa", help="count EFA interfaces and ask libfabric for the efa provider")
    report = commands.add_parser("report", help="decide, record the verdict on the node, stay")
    for command in (plan, report):
        command.add_argument("--node", type=_node_name, required=True, help="this pod's node (spec.nodeName)")
        command.add_argument("--label-prefix", required=True, help="e.g. ml-cluster.io")
    for command in (plan, efa, report):
        command.add_argument("--results", type=Path, required=True, help="the checks' shared directory")
    report.add_argument("--expect-gpus", type=int, required=True, help="GPUs of the pool's instance type")
    report.add_argument("--expect-efa", type=int, default=0, help="EFA interfaces of the pool (0: no EFA)")
    report.add_argument("--no-hold", action="store_true", help="exit after recording (for a one-off run)")
    args = parser.parse_args(argv)
    if args.command == "efa":
        if (args.results / SKIP).exists():
            return 0
        try:
            atomic_write_in(args.results, "efa.json", json.dumps(efa_check(), sort_keys=True).encode(),
                            create_dir=False)
        except (StateFileError, OSError) as exc:
            print(f"error: {args.results}: cannot write efa.json ({exc})", file=sys.stderr)
            return 1
        return 0
    try:
        client = InCluster()
        if args.command == "plan":
            node = client.get_node(args.node)
            if not should_run(node, args.label_prefix):
                atomic_write_in(args.results, SKIP, b"the node already passed\n", create_dir=False)
                print(f"{args.node}: already passed; the checks are skipped")
                return 0
            record(client, args.node, lambda node: hold_patch(node, args.label_prefix))
            print(f"{args.node}: checking; cluster-autoscaler holds the node until the verdict")
            return 0
        if args.expect_gpus < 1 or args.expect_efa < 0:
            print("error: arguments: --expect-gpus must be >= 1 and --expect-efa >= 0", file=sys.stderr)
            return 2
        if (args.results / SKIP).exists():
            print(f"{args.node}: already passed; nothing to record")
            return 0 if args.no_hold else _hold()
        evidence, problems = gather(args.results, args.expect_gpus, args.expect_efa)
        verdict = decide(evidence)
        if problems:
            verdict = type(verdict)(False, (*problems, *verdict.reasons))
        checked_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        print(f"{args.node}: {verdict.summary()}")
        record(client, args.node, lambda node: node_patch(node, verdict, args.label_prefix, checked_at))
        print(f"{args.node}: labelled {args.label_prefix}/gpu-health={verdict.value}")
    except (KubeError, ValueError, OSError) as exc:
        print(f"error: {getattr(args, 'node', 'node')}: {exc}", file=sys.stderr)
        return 1
    return 0 if args.no_hold else _hold()


if __name__ == "__main__":
    raise SystemExit(main())
