"""`submit status` of a gang Kueue admitted that is still waiting for nodes: the line names the nodes it holds, the
pods that have none and the minutes left before Kueue evicts it (the gang timeout read from the job facts), against
the stand-in API server the submit tests use."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.facts import dev_facts
from tests.jobs.kubeapi import fake_api_server
from workloads.cluster_facts import facts_config_map
from workloads.jobspec import KUEUE_QUEUE_LABEL
from workloads.submit import cli as submit
from workloads.submit.capacity import waiting_for_capacity
from workloads.submit.kueue import JOB_UID_LABEL

NAMESPACE = "training"


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def gang_pod(index: int, node: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Running" if node else "Pending"}
    if node is None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu; pod triggered "
                                            "scale-up: [eks-gpu-h100 3->4 (max: 4)]"}]
    else:
        status["containerStatuses"] = [{"name": "train", "state": {"running": {}}, "image": "train:0.1.0",
                                        "imageID": "", "ready": True, "restartCount": 0}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"gang-{index}-abcde", "namespace": NAMESPACE, "creationTimestamp": "2026-11-26T12:00:00Z",
        "labels": {"job-name": "gang", "batch.kubernetes.io/job-completion-index": str(index)}},
        "spec": {"containers": [{"name": "train", "image": "train:0.1.0"}], **({"nodeName": node} if node else {})},
        "status": status}


def admitted_workload(admitted: float) -> dict[str, Any]:
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {
        "name": "job-gang-1a2b3", "namespace": NAMESPACE, "labels": {JOB_UID_LABEL: "uid-gang"},
        "creationTimestamp": "2026-11-26T12:00:00Z"}, "status": {"conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": _iso(admitted)},
            {"type": "PodsReady", "status": "False", "reason": "WaitForStart",
             "message": "Not all pods are ready or succeeded"}]}}


def test_status_names_the_nodes_a_waiting_gang_holds_and_the_minutes_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with fake_api_server() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
        monkeypatch.setenv("HOME", str(tmp_path))
        server.add(facts_config_map(replace(dev_facts(), gang_timeout_seconds=1200), NAMESPACE))
        server.add({"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": "gang", "namespace": NAMESPACE, "uid": "uid-gang", "labels": {KUEUE_QUEUE_LABEL: "training"}},
            "spec": {"parallelism": 4, "completions": 4, "suspend": False, "template": {"spec": {
                "restartPolicy": "Never", "containers": [{"name": "train", "image": "train:0.1.0"}]}}},
            "status": {"active": 4}})
        server.add(admitted_workload(time.time() - 5 * 60))  # admitted five minutes ago
        for index, node in enumerate(["ip-10-1-0-11", "ip-10-1-0-12", "ip-10-1-0-13", None]):
            server.add(gang_pod(index, node))
        assert submit.main(["status", "gang"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("gang") and "Pending (WaitingForCapacity)" in line
    assert "holds 3 node(s) (ip-10-1-0-11, ip-10-1-0-12, ip-10-1-0-13), 1 of 4 pod(s) without a node" in line
    assert "Insufficient nvidia.com/gpu" in line
    # 20 minutes from an admission 5 minutes ago: 15 left (a second or two pass while the test runs)
    left = re.search(r"in (\d+\.\d) min \(waitForPodsReady 20m", line)
    assert left is not None and 14.8 <= float(left.group(1)) <= 15.0, line


def test_without_the_timeout_the_line_still_names_the_wait() -> None:
    pods = [gang_pod(0, "ip-a"), gang_pod(1, None)]
    detail = waiting_for_capacity(pods, 2, admitted_workload(1_000_000.0), now=None, gang_timeout_s=None)
    assert detail is not None and "holds 1 node(s) (ip-a), 1 of 2 pod(s) without a node" in detail
    assert "at kueue.waitForPodsReady.timeout after its admission" in detail
    assert waiting_for_capacity([gang_pod(0, "ip-a")], 1, None) is None  # every pod has a node
    late = waiting_for_capacity(pods, 2, admitted_workload(1_000_000.0), now=1_000_000.0 + 1500, gang_timeout_s=1200)
    assert late is not None and "in 0.0 min" in late
