"""`submit` for every kind: create (a TrainJob's runtime first), status and watch (phase, restarts, disruptions),
start, logs and delete of a JobSet and a TrainJob, against fake API clients that answer as the API server does."""

from __future__ import annotations

from typing import Any

import pytest

from tests.jobs.facts import prod_facts
from workloads.jobspec import parse_spec, render_job
from workloads.submit import commands, runs
from workloads.submit.kube import create_manifests
from workloads.submit.observe import observe, status_line

IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/ml-cluster-train:0.1.0"
GANG = {"name": "ddp", "image": IMAGE, "nodes": 2, "gpus": 8, "gpuType": "h100"}


def rendered(kind: str, **fields: Any) -> list[dict[str, Any]]:
    return render_job(parse_spec({**GANG, **fields, "kind": kind}), prod_facts())


def not_found() -> Exception:
    from kubernetes.client.exceptions import ApiException

    return ApiException(status=404, reason="NotFound")


class FakeBatch:
    """No batch/v1 Job of any name (the run is another kind)."""

    def read_namespaced_job(self, name: str, namespace: str) -> Any:
        raise not_found()

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        raise AssertionError("a JobSet or TrainJob run creates no batch/v1 object")

    create_namespaced_job = create_namespaced_service = create


class FakeNetworking:
    def __init__(self) -> None:
        self.created: list[str] = []
        self.deleted: list[str] = []

    def create_namespaced_network_policy(self, namespace: str, body: dict[str, Any]) -> None:
        self.created.append(body["kind"])

    def delete_namespaced_network_policy(self, name: str, namespace: str) -> None:
        self.deleted.append(name)


class FakeCustom:
    """CustomObjectsApi over a dict of (plural, name) -> object."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.objects = dict(objects or {})
        self.calls: list[tuple[str, ...]] = []

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> Any:
        if (plural, name) not in self.objects:
            raise not_found()
        return self.objects[(plural, name)]

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                        body: dict[str, Any]) -> None:
        self.calls.append(("create", plural, body["metadata"]["name"]))
        self.objects[(plural, body["metadata"]["name"])] = body

    def patch_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                       patch: dict[str, Any]) -> None:
        self.calls.append(("patch", plural, name, repr(patch)))

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str,
                                        **kwargs: Any) -> None:
        self.calls.append(("delete", plural, name))


class FakeCore:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods, self.selectors, self.logs = pods, [], []

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        self.selectors.append(label_selector)
        return type("Pods", (), {"items": self.pods})()

    def read_namespaced_pod_log(self, name: str, namespace: str, container: str, **kwargs: Any) -> str:
        self.logs.append((name, container))
        return ""

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        raise not_found()


def pod(name: str, phase: str, container: str, exit_code: int | None = None) -> dict[str, Any]:
    state = {"terminated": {"exitCode": exit_code, "reason": "Error"}} if exit_code is not None else {"running": {}}
    return {"metadata": {"name": name, "creationTimestamp": f"2026-11-26T10:0{len(name) % 10}:00Z",
                         "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
            "spec": {"containers": [{"name": container}]},
            "status": {"phase": phase, "containerStatuses": [{"name": container, "state": state}]}}


@pytest.fixture
def custom(monkeypatch: pytest.MonkeyPatch) -> FakeCustom:
    fake = FakeCustom()
    monkeypatch.setattr(runs, "custom_objects_api", lambda timeout: fake)
    return fake


def test_submit_creates_a_trainjobs_runtime_before_it_and_a_jobset_through_the_custom_api(custom: FakeCustom) -> None:
    networking = FakeNetworking()
    lines = create_manifests(rendered("TrainJob"), FakeBatch(), FakeCore([]), networking, custom)
    assert [call[:2] for call in custom.calls] == [("create", "trainingruntimes"), ("create", "trainjobs")]
    assert networking.created == ["NetworkPolicy"]
    assert lines[0].startswith("created trainingruntime/ddp-") and lines[1].startswith("created trainjob/ddp-")
    custom.calls.clear()
    create_manifests(rendered("JobSet"), FakeBatch(), FakeCore([]), networking, custom)
    assert [call[:2] for call in custom.calls] == [("create", "jobsets")]


def test_status_of_a_jobset_reads_its_conditions_pods_and_disruptions(custom: FakeCustom) -> None:
    jobset = rendered("JobSet")[0]
    name = jobset["metadata"]["name"]
    custom.objects[("jobsets", name)] = {**jobset, "status": {"restarts": 1, "conditions": [
        {"type": "RestartingJobSet", "status": "False"}]}}
    core = FakeCore([pod("a1", "Failed", "train", 43), pod("b22", "Running", "train")])
    phase, _ = observe(FakeBatch(), core, "training", name, clock=lambda: 0.0)
    assert core.selectors == [f"jobset.sigs.k8s.io/jobset-name={name}"]
    assert phase.phase == "Running" and (phase.restarts, phase.disruptions) == (1, 1)
    custom.objects[("jobsets", name)]["status"]["conditions"] = [
        {"type": "Failed", "status": "True", "reason": "ReachedMaxRestarts", "message": "jobset failed"}]
    failed, _ = observe(FakeBatch(), FakeCore([]), "training", name, clock=lambda: 0.0)
    assert (failed.phase, failed.reason) == ("Failed", "ReachedMaxRestarts")
    custom.objects[("jobsets", name)]["status"]["conditions"] = [{"type": "Completed", "status": "True"}]
    done, _ = observe(FakeBatch(), FakeCore([]), "training", name, clock=lambda: 0.0)
    assert done.phase == "Succeeded"
    assert status_line(name, failed, None).startswith(f"{name}")


def test_a_trainjobs_node_container_is_read_as_the_trainer(custom: FakeCustom) -> None:
    train_job = rendered("TrainJob")[0]
    name = train_job["metadata"]["name"]
    custom.objects[("trainjobs", name)] = train_job
    core = FakeCore([pod("a1", "Failed", "node", 43), pod("b2", "Failed", "node", 1), pod("c33", "Running", "node")])
    phase, _ = observe(FakeBatch(), core, "training", name, clock=lambda: 0.0)
    assert phase.phase == "Running" and (phase.restarts, phase.disruptions) == (2, 1)
    assert {container for _, container in core.logs} == {"node"}  # incidents read from the trainer's log
    commands.show_logs(FakeBatch(), core, "training", name, "train", 0, follow=False)
    assert core.logs[-1][1] == "node"


def test_start_and_delete_go_through_the_custom_api(custom: FakeCustom, capsys: pytest.CaptureFixture[str]) -> None:
    held = rendered("JobSet", suspend=True)[0]
    name = held["metadata"]["name"]
    custom.objects[("jobsets", name)] = held
    assert commands.start_run(FakeBatch(), "training", name) == 0
    assert custom.calls[-1] == ("patch", "jobsets", name, repr({"spec": {"suspend": False}}))
    train_job = rendered("TrainJob")[0]
    custom.objects[("trainjobs", train_job["metadata"]["name"])] = train_job
    networking = FakeNetworking()
    commands.delete_run(FakeBatch(), FakeCore([]), networking, "training", train_job["metadata"]["name"])
    assert custom.calls[-2:] == [("delete", "trainjobs", train_job["metadata"]["name"]),
                                 ("delete", "trainingruntimes", train_job["metadata"]["name"])]
    assert networking.deleted == [train_job["metadata"]["name"]]
    assert capsys.readouterr().out.splitlines()[-1] == f"deleted trainjob/{train_job['metadata']['name']}"


def test_a_run_of_no_kind_is_one_error_naming_it(custom: FakeCustom) -> None:
    from workloads.submit.errors import UsageError

    with pytest.raises(UsageError, match=r"run/nope: not found in training \(no Job, JobSet, TrainJob"):
        runs.read_run(FakeBatch(), "training", "nope")
