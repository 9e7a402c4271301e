"""Phase logic of `workloads.submit` on Job and Pod objects shaped like the API's JSON, and the CLI's errors."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.jobs.facts import dev_facts
from tests.jobs.jobrules import check_job
from workloads.cluster_facts import facts_to_dict
from workloads.jobspec import KUEUE_QUEUE_LABEL
from workloads.submit.cli import main
from workloads.submit.commands import start_run
from workloads.submit.errors import RuntimeFailure, UsageError
from workloads.submit.kube import create_manifests
from workloads.submit.observe import status_line, watch_run
from workloads.submit.phase import job_phase, queue_position

JOB = "resnet50-s3-copy-d2e1b094"
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
T0 = "2026-11-21T10:00:00Z"


def job(*conditions: dict[str, Any], suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": JOB, "namespace": "training", "uid": "5f1c0b9e-3a53-4c1f-9a8e-0d4b2c6f7a11",
                     "creationTimestamp": T0, "annotations": {"pulumi.com/skipAwait": "true"}},
        "spec": {"backoffLimit": 2, "completions": 1, "parallelism": 1, "suspend": suspend,
                 "completionMode": "NonIndexed", "activeDeadlineSeconds": 172800},
        "status": {"startTime": T0, "uncountedTerminatedPods": {}, "terminating": 0,
                   "conditions": list(conditions), **status},
    }


def condition(kind: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": "2026-11-21T11:00:00Z", "lastTransitionTime": "2026-11-21T11:00:00Z"}


def container_status(name: str, state: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "imageID": "", "ready": "running" in state, "restartCount": 0,
            "started": "running" in state, "state": state, **extra}


def pod(suffix: str, phase: str, *, init: list[dict[str, Any]] | None = None,
        containers: list[dict[str, Any]] | None = None, created: str = T0, sidecar: bool = False,
        **status: Any) -> dict[str, Any]:
    stage_spec: dict[str, Any] = {"name": "stage", "image": IMAGE}
    if sidecar:
        stage_spec["restartPolicy"] = "Always"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{JOB}-{suffix}", "namespace": "training", "creationTimestamp": created,
                     "labels": {"batch.kubernetes.io/job-name": JOB, "job-name": JOB},
                     "annotations": {}},
        "spec": {"initContainers": [stage_spec], "containers": [{"name": "train", "image": IMAGE}],
                 "restartPolicy": "Never", "nodeName": "ip-10-10-12-34.us-west-2.compute.internal"},
        "status": {"phase": phase, "qosClass": "Burstable", "initContainerStatuses": init or [],
                   "containerStatuses": containers or [], **status},
    }


RUNNING = {"running": {"startedAt": "2026-11-21T10:05:00Z"}}
POD_INITIALIZING = {"waiting": {"reason": "PodInitializing"}}


def terminated(exit_code: int, reason: str) -> dict[str, Any]:
    return {"terminated": {"exitCode": exit_code, "reason": reason, "startedAt": "2026-11-21T10:05:00Z",
                           "finishedAt": "2026-11-21T10:45:00Z", "containerID": "containerd://4f2a"}}


def test_pending_unschedulable() -> None:
    waiting = pod("x7k2p", "Pending", conditions=[{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}])
    phase = job_phase(job(active=1, ready=0), [waiting])
    assert phase.phase == "Pending" and "Insufficient nvidia.com/gpu" in phase.detail


def test_no_pod_yet_and_suspended_by_kueue_are_pending() -> None:
    assert job_phase(job(), []).phase == "Pending"
    queued = job(condition("Suspended", "JobSuspended", "Job suspended"), suspend=True)
    queued["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpu-h100"}
    suspended = job_phase(queued, [])
    assert suspended.phase == "Pending" and "Kueue" in suspended.detail


def test_a_job_the_stack_created_suspended_says_how_to_start_it() -> None:
    phase = job_phase(job(condition("Suspended", "JobSuspended", "Job suspended"), suspend=True), [])
    assert phase.phase == "Suspended"
    assert phase.detail.endswith(f"python -m workloads.submit start {JOB}")


class FakeBatch:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body, self.patches = body, []

    def read_namespaced_job(self, name: str, namespace: str) -> dict[str, Any]:
        return self.body

    def patch_namespaced_job(self, name: str, namespace: str, patch: dict[str, Any]) -> None:
        self.patches.append((namespace, name, patch))


def test_start_unsuspends_a_suspended_job_and_leaves_kueue_jobs_to_kueue(
        capsys: pytest.CaptureFixture[str]) -> None:

    batch = FakeBatch(job(suspend=True))
    assert start_run(batch, "training", JOB) == 0
    assert batch.patches == [("training", JOB, {"spec": {"suspend": False}})]
    assert capsys.readouterr().out == f"started job/{JOB}\n"
    running = FakeBatch(job(suspend=False))
    assert start_run(running, "training", JOB) == 0 and running.patches == []
    queued = job(suspend=True)
    queued["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpu-h100"}
    with pytest.raises(UsageError, match="Kueue starts this Job"):
        start_run(FakeBatch(queued), "training", JOB)


def test_copy_stager_running_is_staging() -> None:
    staging = pod("x7k2p", "Pending", init=[container_status("stage", RUNNING)],
                  containers=[container_status("train", POD_INITIALIZING)],
                  conditions=[{"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized"}])
    assert job_phase(job(active=1, ready=0), [staging]).phase == "Staging"


def test_rolling_sidecar_beside_the_trainer_is_running_not_staging() -> None:
    running = pod("x7k2p", "Running", sidecar=True, init=[container_status("stage", RUNNING)],
                  containers=[container_status("train", RUNNING)])
    phase = job_phase(job(active=1, ready=1), [running])
    assert phase.phase == "Running" and phase.reason is None


def test_succeeded() -> None:
    done = pod("x7k2p", "Succeeded", init=[container_status("stage", terminated(0, "Completed"))],
               containers=[container_status("train", terminated(0, "Completed"))])
    finished = job(condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of succeeded pods"),
                   condition("Complete", "CompletionsReached", "Reached expected number of succeeded pods"),
                   succeeded=1, completionTime="2026-11-21T10:46:00Z")
    assert job_phase(finished, [done]).phase == "Succeeded"


def test_oom_killed() -> None:
    oom = pod("x7k2p", "Failed", containers=[container_status("train", terminated(137, "OOMKilled"))])
    failed = job(condition("FailureTarget", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                 condition("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                 failed=3)
    phase = job_phase(failed, [oom])
    assert (phase.phase, phase.reason) == ("Failed", "OOMKilled")
    assert "backoff limit" in phase.detail and "/dev/shm" in phase.detail


def test_evicted_for_ephemeral_storage() -> None:
    evicted = pod("x7k2p", "Failed", reason="Evicted",
                  message="Pod ephemeral local storage usage exceeds the total limit of containers 175Gi. ",
                  containers=[container_status("train", terminated(137, "ContainerStatusUnknown"))])
    failed = job(condition("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"))
    phase = job_phase(failed, [evicted])
    assert (phase.phase, phase.reason) == ("Failed", "Evicted")
    assert "ephemeral local storage" in phase.detail


def test_image_pull_back_off_is_failed_before_the_job_gives_up() -> None:
    stuck = pod("x7k2p", "Pending", init=[container_status("stage", {"waiting": {
        "reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}})],
        containers=[container_status("train", POD_INITIALIZING)])
    phase = job_phase(job(active=1, ready=0), [stuck])
    assert (phase.phase, phase.reason) == ("Failed", "ImagePullBackOff")
    assert "stage" in phase.detail and IMAGE in phase.detail


def test_deadline_exceeded() -> None:
    killed = pod("x7k2p", "Failed", reason="DeadlineExceeded",
                 message="Pod was active on the node longer than the specified deadline")
    failed = job(condition("Failed", "DeadlineExceeded", "Job was active longer than specified deadline"))
    phase = job_phase(failed, [killed])
    assert (phase.phase, phase.reason) == ("Failed", "DeadlineExceeded")


def test_backoff_limit_exceeded_by_plain_errors_keeps_the_job_reason() -> None:
    crashed = [pod(suffix, "Failed", created=f"2026-11-21T10:0{i}:00Z",
                   containers=[container_status("train", terminated(1, "Error"))])
               for i, suffix in enumerate(("a1", "b2", "c3"))]
    failed = job(condition("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"))
    phase = job_phase(failed, crashed)
    assert (phase.phase, phase.reason) == ("Failed", "BackoffLimitExceeded")


def test_config_error_exit_code_fails_fast() -> None:
    bad = pod("x7k2p", "Failed", containers=[container_status("train", terminated(42, "Error"))])
    failed = job(condition("Failed", "PodFailurePolicy",
                           f"Container train for pod training/{JOB}-x7k2p failed with exit code 42 matching "
                           "FailJob rule at index 0"))
    assert job_phase(failed, [bad]).reason == "ConfigError"


def test_retry_after_eviction_reports_the_new_pod_and_the_old_reason() -> None:
    evicted = pod("a1", "Failed", reason="Evicted", message="The node was low on resource: ephemeral-storage.")
    retry = pod("b2", "Pending", created="2026-11-21T10:30:00Z", init=[container_status("stage", RUNNING)])
    phase = job_phase(job(active=1, failed=0), [evicted, retry])
    assert phase.phase == "Staging" and "Evicted" in phase.detail


# --- CLI -----------------------------------------------------------------------------------------------------


@pytest.fixture
def facts_file(tmp_path: Path) -> Path:
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts_to_dict(dev_facts())))
    return path


def test_render_prints_the_jobs_of_a_spec_file(facts_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "workloads/jobs/resnet50-s3-copy.yaml", "--facts", str(facts_file)]) == 0
    job_manifest, = yaml.safe_load_all(capsys.readouterr().out)
    check_job(job_manifest)


def test_render_writes_every_object_in_full_without_yaml_anchors(facts_file: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A reviewer reads the rendered YAML: no `&id001` / `*id001` pairs where two places share one object."""
    from workloads.manifest_yaml import dump_manifests

    shared = {"key": "nvidia.com/gpu", "operator": "Exists"}
    text = dump_manifests([{"a": [shared], "b": [shared]}])
    assert "&id" not in text and "*id" not in text and text.count("nvidia.com/gpu") == 2
    for spec in ("workloads/jobs/resnet50-s3-copy.yaml", "examples/plain-pytorch-job.yaml"):
        assert main(["render", spec, "--facts", str(facts_file)]) == 0
        out = capsys.readouterr().out
        assert not re.search(r"[&*]id\d+", out), spec
        assert list(yaml.safe_load_all(out))


def test_bad_spec_is_one_error_line_with_file_and_field(tmp_path: Path, facts_file: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: bad\nimage: x:1\nmemory: 8Gi\nshmSize: 6Gi\n")
    assert main(["render", str(spec), "--facts", str(facts_file)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {spec}: memory: limit 8Gi does not cover") and err.count("\n") == 1


def test_unreadable_facts_file_is_an_error_not_a_traceback(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text('{"stack": "dev", "label_prefix": "x", "pools": [], "colour": "red"}')
    assert main(["render", "workloads/jobs/efs-pvc.yaml", "--facts", str(facts)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {facts}: cluster facts: ")


def test_a_fifo_or_device_as_spec_or_facts_is_one_line_without_blocking(tmp_path: Path, facts_file: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)  # no writer: reading it as a file would wait forever
    assert main(["render", str(fifo), "--facts", str(facts_file)]) == 2
    assert capsys.readouterr().err == f"error: {fifo}: is a FIFO, not a regular file\n"
    assert main(["render", "workloads/jobs/efs-pvc.yaml", "--facts", "/dev/zero"]) == 2
    assert capsys.readouterr().err == "error: /dev/zero: is a character device, not a regular file\n"


def test_spec_that_does_not_fit_the_cluster_names_file_and_field(facts_file: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "workloads/jobs/multi-node-ddp.yaml", "--facts", str(facts_file)]) == 2
    err = capsys.readouterr().err
    assert err == "error: workloads/jobs/multi-node-ddp.yaml: gpuType: h100 is not offered by stack dev " \
                  "(GPU types: a10g)\n"


def _team_facts_file(tmp_path: Path, teams: dict[str, Any] | None) -> Path:
    data = facts_to_dict(dev_facts())
    data.update(kueue=True, local_queue="training", local_queues=["training", "vision"], teams=teams)
    path = tmp_path / "team-facts.json"
    path.write_text(json.dumps(data))
    return path


def _team_spec(tmp_path: Path, claim: str) -> Path:
    spec = tmp_path / "team.yaml"
    spec.write_text("name: vision-run\nimage: x:1\nteam: vision\ngpus: 1\ngpuType: a10g\n"
                    f"checkpoint: {{claimName: {claim}, mountPath: /ckpt}}\n")
    return spec


def test_a_team_spec_renders_in_its_teams_namespace_and_queue(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    facts = _team_facts_file(tmp_path, {"vision": {"namespace": "team-vision", "volume_claims": ["team-shared"]}})
    assert main(["render", str(_team_spec(tmp_path, "team-shared")), "--facts", str(facts)]) == 0
    job_manifest, = yaml.safe_load_all(capsys.readouterr().out)
    assert job_manifest["metadata"]["namespace"] == "team-vision"
    assert job_manifest["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "vision"
    # The training namespace's claims are not the team's: a team Job mounts its own claim only.
    assert main(["render", str(_team_spec(tmp_path, "checkpoints-efs")), "--facts", str(facts)]) == 2
    assert "checkpoints-efs" in capsys.readouterr().err


@pytest.mark.parametrize(("teams", "words"), [
    (None, "vision: these cluster facts name no teams (read the stack's jobFacts again)"),
    ({"nlp": {"namespace": "team-nlp"}}, "vision is not a team with a namespace (teams with one: nlp)"),
])
def test_a_team_spec_never_falls_back_to_the_training_namespace(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                teams: dict[str, Any] | None, words: str) -> None:
    facts = _team_facts_file(tmp_path, teams)
    spec = _team_spec(tmp_path, "team-shared")
    assert main(["render", str(spec), "--facts", str(facts)]) == 2
    assert capsys.readouterr().err == f"error: {spec}: team: {words}\n"


class FakeApi:
    """Stands in for BatchV1Api/CoreV1Api/NetworkingV1Api: records creates, answers 409 for names that already exist."""

    def __init__(self, existing: set[str]) -> None:
        self.existing, self.created = existing, []

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        if body["metadata"]["name"] in self.existing:
            raise ApiException(status=409, reason="AlreadyExists")
        self.created.append((namespace, body["kind"], body["metadata"]["name"]))

    create_namespaced_job = create_namespaced_service = create_namespaced_network_policy = create


def test_submit_creates_job_and_service_and_treats_an_existing_hash_as_unchanged() -> None:
    from tests.jobs.facts import prod_facts
    from workloads.jobspec import parse_spec, render_job

    manifests = render_job(parse_spec({"name": "ddp", "image": IMAGE, "nodes": 2, "gpus": 8, "gpuType": "h100"}),
                           prod_facts())
    api = FakeApi(existing=set())
    lines = create_manifests(manifests, api, api, api)
    assert [kind for _, kind, _ in api.created] == ["Job", "Service", "NetworkPolicy"]
    assert lines[0].startswith("created job/ddp-")
    again = FakeApi(existing={manifests[0]["metadata"]["name"]})
    assert create_manifests(manifests, again, again, again)[0].startswith("unchanged job/ddp-")


# --- Kueue: holding, queueing and why a queued run is pending --------------------------------------------------


def queued_job(*, parallelism: int = 1, suspend: bool = True) -> dict[str, Any]:
    body = job(suspend=suspend)
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "training"}
    body["spec"]["parallelism"] = body["spec"]["completions"] = parallelism
    return body


def workload(*conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A Workload as Kueue v1beta2 writes it (status.conditions carry status True/False)."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": f"job-{JOB}-7f3a1", "namespace": "training",
                         "labels": {"kueue.x-k8s.io/job-uid": "5f1c0b9e-3a53-4c1f-9a8e-0d4b2c6f7a11"}},
            "spec": {"queueName": "training", "podSets": [{"name": "main", "count": 2}]},
            "status": {"conditions": list(conditions), **status}}


def wl_condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-21T11:00:00Z"}


def test_start_puts_a_held_job_in_its_queue_instead_of_unsuspending_it(capsys: pytest.CaptureFixture[str]) -> None:

    held = job(suspend=True)
    held["metadata"]["annotations"]["ml-cluster.io/queue-name"] = "training"
    batch = FakeBatch(held)
    assert start_run(batch, "training", JOB) == 0
    assert batch.patches == [("training", JOB, {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "training"}}})]
    assert "queued job/" in capsys.readouterr().out


def test_a_queued_job_waiting_for_quota_shows_its_place_and_why() -> None:

    pending = {"items": [{"metadata": {"name": "job-other-1"}, "positionInLocalQueue": 0,
                          "positionInClusterQueue": 0},
                         {"metadata": {"name": f"job-{JOB}-7f3a1"}, "positionInLocalQueue": 1,
                          "positionInClusterQueue": 3}]}
    position = queue_position(pending, f"job-{JOB}-7f3a1")
    assert position == (1, 3)
    waiting = workload(wl_condition("QuotaReserved", "False", "Pending",
                                    "couldn't assign flavors to pod set main: insufficient unused quota for "
                                    "nvidia.com/gpu in flavor h100, 8 more needed"))
    phase = job_phase(queued_job(), [], waiting, position)
    assert phase.phase == "Pending" and phase.reason == "WaitingForQuota"
    assert "queue training, position 2 (ClusterQueue: 4): waiting for quota: couldn't assign flavors" in phase.detail


def test_a_job_no_flavor_can_take_says_so() -> None:
    wrong = workload(wl_condition("QuotaReserved", "False", "NoMatchingFlavor",
                                  "couldn't assign flavors to pod set main: untolerated taint"))
    phase = job_phase(queued_job(), [], wrong)
    assert phase.reason == "NoMatchingFlavor" and "no flavor fits" in phase.detail


def test_a_gang_that_did_not_start_in_time_was_evicted_and_requeued() -> None:
    evicted = workload(wl_condition("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout"),
                       wl_condition("QuotaReserved", "False", "Pending", "evicted"),
                       requeueState={"count": 1, "requeueAt": "2026-11-21T11:01:00Z"})
    phase = job_phase(queued_job(parallelism=2), [], evicted)
    assert phase.phase == "Pending" and phase.reason == "Evicted"
    assert "did not get every pod ready in time" in phase.detail and "2026-11-21T11:01:00Z" in phase.detail


def test_an_admitted_gang_with_a_pod_still_pending_is_waiting_for_the_gang() -> None:
    admitted = workload(wl_condition("QuotaReserved", "True", "QuotaReserved"),
                        wl_condition("Admitted", "True", "Admitted"),
                        wl_condition("PodsReady", "False", "WaitForStart", "Not all pods are ready or succeeded"))
    running = pod("0-abcde", "Running", init=[container_status("stage", terminated(0, "Completed"))],
                  containers=[container_status("train", RUNNING)])
    waiting = pod("1-fghij", "Pending")
    phase = job_phase(queued_job(parallelism=2, suspend=False), [running, waiting], admitted)
    assert phase.phase == "Pending" and phase.reason == "WaitingForGang" and "1 of 2 pods running" in phase.detail
    assert job_phase(queued_job(), [], None).detail.startswith("suspended by Kueue: queue training: waiting for Kueue")


# -- every API call has a deadline --------------------------------------------------------------------------------
@pytest.fixture
def silent_api_server(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An "API server" on 127.0.0.1 that accepts every connection and never answers; a kubeconfig pointing at it."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            held.append(connection)  # read nothing, answer nothing

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    server = f"http://127.0.0.1:{listener.getsockname()[1]}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "silent",
        "clusters": [{"name": "silent", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "silent", "context": {"cluster": "silent", "user": "u"}}]}))
    try:
        yield server, kubeconfig
    finally:
        stop.set()
        thread.join(2)
        for connection in held:
            connection.close()
        listener.close()


@pytest.mark.parametrize("command", [["status", "run-1"], ["start", "run-1"], ["watch", "run-1", "--interval", "1"],
                                     ["logs", "run-1"], ["delete", "run-1"]])
def test_a_server_that_never_answers_is_a_one_line_runtime_error(
        command: list[str], silent_api_server: tuple[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    server, kubeconfig = silent_api_server
    code = main(["--kubeconfig", str(kubeconfig), "--request-timeout", "0.2", *command])
    err = capsys.readouterr().err
    assert code == 1, err  # runtime (a retry may succeed), not the usage code 2
    assert err.count("\n") == 1 and err.startswith(f"error: kubernetes API {server}: read_namespaced_job: "), err
    # it used to hang forever: the deadline that ended it is the one named (no wall-clock bound: load moves it)
    assert "no answer within 0.2s (--request-timeout)" in err, err


def test_watch_gives_up_at_its_deadline_naming_the_run() -> None:
    job = {"metadata": {"name": "run-1"}, "spec": {}, "status": {"active": 1}}

    class Batch:
        def read_namespaced_job(self, name: str, namespace: str) -> dict:
            return job

    class Core:
        def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
            return type("Pods", (), {"items": []})()

    slept: list[float] = []
    with pytest.raises(RuntimeFailure, match=r"job/run-1: still Pending after 0.2s \(watch --timeout\)"):
        watch_run(Batch(), Core(), "training", "run-1", 10.0, clock=lambda: 0.0,
                      sleep=lambda seconds: (slept.append(seconds), __import__("time").sleep(seconds)),
                      timeout=0.2)
    assert slept and max(slept) <= 0.2  # never sleeps past the deadline


def test_status_counts_replaced_pods_and_which_were_disruptions() -> None:
    stopped = pod("a1", "Failed", containers=[container_status("train", terminated(43, "Error"))])
    lost = pod("b2", "Failed", conditions=[{"type": "DisruptionTarget", "status": "True",
                                            "reason": "DeletionByTaintManager"}])
    crashed = pod("c3", "Failed", containers=[container_status("train", terminated(1, "Error"))])
    running = pod("d4", "Running", created="2026-11-21T10:30:00Z", containers=[container_status("train", RUNNING)])
    phase = job_phase(job(active=1, ready=1), [stopped, lost, crashed, running])
    assert phase.phase == "Running"
    assert (phase.restarts, phase.disruptions) == (3, 2)
    line = status_line(JOB, phase, None)
    assert "restarts: 3 pod(s) replaced (2 disruption(s), 1 counted against backoffLimit)" in line
    assert job_phase(job(active=1, ready=1), [running]).restarts == 0
