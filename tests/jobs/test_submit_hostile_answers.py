"""`submit status` against API answers that break the schema (an HTML page where JSON belongs, a string where a
count or an exit code belongs, JSON nested past any object's depth, Kueue Workloads without metadata): one error
line naming the API server and the call, exit 1, no traceback; checked where every call goes through (TimedApi),
against the stand-in API server the submit tests use."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.facts import dev_facts
from tests.jobs.kubeapi import FakeApiServer, fake_api_server
from workloads.cluster_facts import facts_config_map
from workloads.jobspec import KUEUE_QUEUE_LABEL
from workloads.submit import cli as submit
from workloads.submit.kube import TimedApi

NAMESPACE = "training"
JOB_PATH = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs/run"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"


@contextmanager
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    """The stand-in API server, as the kubeconfig `submit` reads."""
    with fake_api_server() as server:
        monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig(tmp_path / "kubeconfig")))
        monkeypatch.setenv("HOME", str(tmp_path))
        yield server


def job(status: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
        "name": "run", "namespace": NAMESPACE, "uid": "uid-run", "labels": {KUEUE_QUEUE_LABEL: "training"}},
        "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "train", "image": "train:0.1.0"}]}}},
        "status": status}


def pod(state: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "run-0-abcde", "namespace": NAMESPACE, "creationTimestamp": "2026-11-26T12:00:00Z",
        "labels": {"job-name": "run", "batch.kubernetes.io/job-completion-index": "0"}},
        "spec": {"containers": [{"name": "train", "image": "train:0.1.0"}]},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "train", "state": state, "image": "train:0.1.0", "imageID": "", "ready": False,
            "restartCount": 0}]}}


def nested(depth: int) -> bytes:
    return ('{"a":' * depth + "1" + "}" * depth).encode()


def html(server: FakeApiServer) -> None:
    server.add(job({"active": 1}))
    server.raw[JOB_PATH] = (200, "text/html", b"<html><body>Sign in to the corporate proxy</body></html>")


def count_as_text(server: FakeApiServer) -> None:
    server.add(job({"active": "one", "failed": "many"}))


def exit_code_as_text(server: FakeApiServer) -> None:
    server.add(job({"failed": 1}))
    server.add(pod({"terminated": {"exitCode": "forty-two", "reason": "Error"}}))


def deep_json(server: FakeApiServer) -> None:
    server.add(job({"active": 1}))
    server.raw[PODS_PATH] = (200, "application/json", nested(100_000))


CASES = {"an HTML page": (html, "read_namespaced_job", "Input should be a valid dictionary or instance of V1Job"),
         "a count as text": (count_as_text, "read_namespaced_job", "ValidationError: active"),
         "an exit code as text": (exit_code_as_text, "list_namespaced_pod", "ValidationError: exitCode"),
         "JSON nested 100,000 deep": (deep_json, "list_namespaced_pod", "(nested too deeply)")}


@pytest.mark.parametrize("case", list(CASES))
def test_status_on_an_answer_that_breaks_the_schema_is_one_line(
        case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    arrange, call, why = CASES[case]
    with stand_in(tmp_path, monkeypatch) as server:
        server.add(facts_config_map(dev_facts(), NAMESPACE))
        arrange(server)
        code = submit.main(["status", "run"])
        err = capsys.readouterr().err
    assert code == 1, err
    [line] = err.splitlines()
    assert line.startswith(f"error: kubernetes API {server.url}: {call}: the answer is not the Kubernetes object "
                           "asked for (") and why in line and len(line) < 300, line


def test_a_workload_without_metadata_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with stand_in(tmp_path, monkeypatch) as server:
        server.add(facts_config_map(dev_facts(), NAMESPACE))
        server.add(job({"active": 1}))
        server.raw[f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{NAMESPACE}/workloads"] = (
            200, "application/json",
            json.dumps({"kind": "WorkloadList",
                        "items": [{"kind": "Workload", "status": {"conditions": "x"}}]}).encode())
        code = submit.main(["status", "run"])
        err = capsys.readouterr().err
    assert code == 1, err
    [line] = err.splitlines()
    assert line == (f"error: kubernetes API {server.url}: list_namespaced_custom_object: the answer is not a list "
                    "of Kubernetes objects (items[0]: no metadata.name)"), line


def server_error(status: int) -> tuple[int, str, bytes]:
    return (status, "application/json", json.dumps({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcdserver: request timed out",
        "reason": "InternalError" if status == 500 else "ServiceUnavailable", "code": status}).encode())


@pytest.mark.parametrize("command", ["status", "submit"])
def test_a_server_error_is_retried_then_exit_1_naming_the_status(
        command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `submit` (create) and `status` (read) turned a 5xx into the input's error: exit 2, tried once."""
    monkeypatch.setattr("workloads.submit.kube.RETRY_FIRST_PAUSE_S", 0.05)
    with stand_in(tmp_path, monkeypatch) as server:
        server.add(facts_config_map(dev_facts(), NAMESPACE))
        server.add(job({"active": 1}))
        path = JOB_PATH if command == "status" else JOB_PATH.rsplit("/", 1)[0]
        server.raw[path] = server_error(503)
        argv = ["status", "run"] if command == "status" else ["submit", "examples/plain-pytorch-job.yaml"]
        code = submit.main(["--request-timeout", "1", *argv])
        err = capsys.readouterr().err
        tries = sum(1 for _, requested in server.requests if requested == path)
    assert code == 1 and "Traceback" not in err, err
    line = err.splitlines()[-1]  # submit prints its goodput prediction first
    assert [text for text in err.splitlines() if text.startswith("error: ")] == [line], err
    call = "read_namespaced_job" if command == "status" else "create_namespaced_job"
    assert line.startswith(f"error: kubernetes API {server.url}: {call}: 503 Service Unavailable (a server error; "
                           f"{tries} tries in "), line
    assert line.endswith("s, at most 1s: --request-timeout)") and tries >= 3, (tries, line)


def test_a_server_error_that_passes_is_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("workloads.submit.kube.RETRY_FIRST_PAUSE_S", 0.05)
    with stand_in(tmp_path, monkeypatch) as server:
        server.add(facts_config_map(dev_facts(), NAMESPACE))
        jobs = JOB_PATH.rsplit("/", 1)[0]
        server.raw[jobs], server.raw_times[jobs] = server_error(500), 2
        code = submit.main(["submit", "examples/plain-pytorch-job.yaml"])
        captured = capsys.readouterr()
        created = [key for key in server.objects if key[0] == "Job"]
    assert code == 0, captured.err
    assert captured.out.startswith("created job/") and len(created) == 1, captured.out


def test_a_retried_delete_that_finds_nothing_is_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The first DELETE deleted the Job but its answer was a 504 (a proxy gave up): the retry's 404 means done."""
    monkeypatch.setattr("workloads.submit.kube.RETRY_FIRST_PAUSE_S", 0.05)
    with stand_in(tmp_path, monkeypatch) as server:
        server.add(job({"active": 1}))
        server.lost[JOB_PATH] = server_error(504)
        code = submit.main(["delete", "run"])
        captured = capsys.readouterr()
        deletes = [path for method, path in server.requests if method == "DELETE" and path == JOB_PATH]
        left = [key for key in server.objects if key[0] == "Job"]
    assert code == 0 and captured.out == "deleted job/run\n", captured
    assert captured.err == (f"note: kubernetes API {server.url}: delete_namespaced_job: not found on try 2 after a "
                            "server error: an earlier try deleted it\n")
    assert len(deletes) == 2 and left == []


@pytest.mark.parametrize("name", ["delete_namespaced_job", "read_namespaced_job", "patch_namespaced_job"])
def test_only_a_retried_delete_reads_404_as_done(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first try's 404 is the usual not-found error, and so is a retried read's or patch's."""
    from kubernetes.client.exceptions import ApiException

    monkeypatch.setattr("workloads.submit.kube.RETRY_FIRST_PAUSE_S", 0.01)
    answers: list[int] = []

    class Api:
        def __getattr__(self, _: str) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                raise ApiException(status=answers.pop(0), reason="answer")
            return call

    api = TimedApi(Api(), "https://api.example", 5.0)
    answers[:] = [404]
    with pytest.raises(ApiException):
        getattr(api, name)("run", NAMESPACE)
    answers[:] = [503, 404]
    if name.startswith("delete_"):
        assert getattr(api, name)("run", NAMESPACE) is None
    else:
        with pytest.raises(ApiException):
            getattr(api, name)("run", NAMESPACE)
    assert answers == []

