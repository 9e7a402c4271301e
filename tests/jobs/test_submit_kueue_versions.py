"""`submit status` reads Kueue in the API versions the cluster's Kueue serves, as the API server's discovery says:
the stack's 0.19 (v1beta2 Workloads and visibility), an adopted 0.13/0.14 (v1beta1 of both), one without the
visibility API (no position asked), and a discovery that answers nothing usable (the versions tried newest first,
the position asked in the Workloads' version). Against the stand-in API server the submit tests use, which answers
404 for a version its `served` table does not list, as a real API server does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.jobs.facts import dev_facts
from tests.jobs.kubeapi import KUEUE_0_14, FakeApiServer
from tests.jobs.test_submit_hostile_answers import NAMESPACE, job, stand_in
from workloads.cluster_facts import facts_config_map
from workloads.submit import cli as submit

WAITING = "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu"


def queued(server: FakeApiServer, version: str) -> None:
    """A Job Kueue holds (suspended), its Workload in `version`, and the LocalQueue's pending workloads."""
    server.add(facts_config_map(dev_facts(), NAMESPACE))
    held = job({})
    held["spec"]["suspend"] = True
    server.add(held)
    server.add({"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "Workload", "metadata": {
        "name": "job-run-1a2b3", "namespace": NAMESPACE, "labels": {"kueue.x-k8s.io/job-uid": "uid-run"},
        "creationTimestamp": "2026-11-26T12:00:00Z"}, "status": {"conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": WAITING}]}})
    server.pending[(NAMESPACE, "training")] = {"items": [
        {"metadata": {"name": "job-other-9z8y7"}, "positionInLocalQueue": 0, "positionInClusterQueue": 0},
        {"metadata": {"name": "job-run-1a2b3"}, "positionInLocalQueue": 1, "positionInClusterQueue": 2}]}


def kueue_requests(server: FakeApiServer) -> list[str]:
    return [path for _, path in server.requests if "kueue" in path]


def status(capsys: pytest.CaptureFixture[str], times: int = 1) -> str:
    for _ in range(times):
        assert submit.main(["status", "run"]) == 0
    return capsys.readouterr().out


def test_the_stacks_kueue_is_read_in_v1beta2_and_discovery_is_asked_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with stand_in(tmp_path, monkeypatch) as server:
        queued(server, "v1beta2")
        out = status(capsys, times=2)
    assert f"position 2 (ClusterQueue: 3): waiting for quota: {WAITING}" in out, out
    workloads = f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads"
    pending = f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/localqueues/training/pendingworkloads"
    assert kueue_requests(server) == ["/apis/kueue.x-k8s.io", workloads, "/apis/visibility.kueue.x-k8s.io", pending,
                                      workloads, pending]


def test_an_adopted_kueue_older_than_0_15_is_read_in_v1beta1_without_a_try_in_v1beta2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Kueue 0.14 serves v1beta1 only (a v1beta2 path is 404): discovery says so, and the Workload and the position
    are read in v1beta1 (before: after a 404 in v1beta2 on every poll, the position in the Workloads' version)."""
    with stand_in(tmp_path, monkeypatch) as server:
        server.served = dict(KUEUE_0_14)
        queued(server, "v1beta1")
        out = status(capsys)
    assert f"position 2 (ClusterQueue: 3): waiting for quota: {WAITING}" in out, out
    assert kueue_requests(server) == [
        "/apis/kueue.x-k8s.io", f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/workloads",
        "/apis/visibility.kueue.x-k8s.io",
        f"/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/localqueues/training/pendingworkloads"]


def test_a_kueue_without_the_visibility_api_is_not_asked_for_a_position(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with stand_in(tmp_path, monkeypatch) as server:
        del server.served["visibility.kueue.x-k8s.io"]  # discovery: 404, no such group
        queued(server, "v1beta2")
        out = status(capsys)
    assert f"queue training: waiting for quota: {WAITING}" in out, out
    assert not [path for path in kueue_requests(server) if path.endswith("/pendingworkloads")]


@pytest.mark.parametrize("answer", [(403, "application/json", json.dumps({
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403}).encode()),
    (200, "text/html", b"<html>a proxy's page</html>"), (200, "application/json", b'{"versions": [')])
def test_unreadable_discovery_falls_back_to_trying_the_versions_newest_first(
        answer: tuple[int, str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with stand_in(tmp_path, monkeypatch) as server:
        server.served = dict(KUEUE_0_14)
        for group in KUEUE_0_14:
            server.raw[f"/apis/{group}"] = answer
        queued(server, "v1beta1")
        out = status(capsys)
    assert f"position 2 (ClusterQueue: 3): waiting for quota: {WAITING}" in out, out
    assert kueue_requests(server) == [
        "/apis/kueue.x-k8s.io", f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads",
        f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/workloads", "/apis/visibility.kueue.x-k8s.io",
        f"/apis/visibility.kueue.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/localqueues/training/pendingworkloads"]


def test_a_cluster_without_kueue_shows_no_workload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """No Kueue group (a Job labelled for a queue on a cluster that lost Kueue): no Workload call, one status."""
    with stand_in(tmp_path, monkeypatch) as server:
        server.served = {}
        queued(server, "v1beta2")
        out = status(capsys)
    assert "waiting for Kueue to create its Workload" in out, out
    assert kueue_requests(server) == ["/apis/kueue.x-k8s.io"]


@pytest.mark.parametrize("answer", [(403, "application/json", b'{"kind": "Status", "code": 403}'),
                                    (200, "application/json", b'{"items": [')])
def test_a_position_that_cannot_be_read_leaves_the_status_without_it(
        answer: tuple[int, str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The visibility API is optional (its RBAC, an aggregated server that answers badly): status goes on."""
    with stand_in(tmp_path, monkeypatch) as server:
        queued(server, "v1beta2")
        server.raw[f"/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/localqueues/training/"
                   "pendingworkloads"] = answer
        out = status(capsys)
    assert f"queue training: waiting for quota: {WAITING}" in out, out
