"""Per-incident detail for `submit status/watch`: pods as the API returns them and trainer logs recorded from real
runs of `python -m workloads.train` (tests/jobs/data/trainer-*.log: a run SIGKILLed after step 7 with a checkpoint at
step 4 and its resumed run; a run stopped by SIGTERM at step 7 and its resumed run; --log-every 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.jobs.test_submit import JOB, container_status, job, pod, terminated
from workloads.incidents import INCIDENT_GAP_S, incident_line, incidents, trainer_run
from workloads.submit.observe import show_status, watch_run
from workloads.submit.phase import job_phase

DATA = Path(__file__).parent / "data"
KILLED_AT = 1795574263.0  # 2026-11-25T02:37:43Z: when the SIGKILLed run was gone
STOPPED_AT = 1795574341.0  # 2026-11-25T02:39:01Z: when the SIGTERMed run had exited 43


def _log(name: str) -> str:
    return (DATA / name).read_text()


def _finished(code: int, at: str) -> dict[str, Any]:
    state = terminated(code, "Error")
    state["terminated"]["finishedAt"] = at
    return state


def _lost(suffix: str, at: str, code: int | None = 137) -> dict[str, Any]:
    """A pod on a node that went away: DisruptionTarget (the taint manager deleted it), its trainer SIGKILLed."""
    containers = [container_status("train", _finished(code, at))] if code is not None else []
    return pod(suffix, "Failed", containers=containers,
               conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                            "lastTransitionTime": at}])


def _running(suffix: str, created: str) -> dict[str, Any]:
    return pod(suffix, "Running", created=created,
               containers=[container_status("train", {"running": {"startedAt": created}})])


def test_a_recorded_run_killed_on_a_lost_node_and_its_resume() -> None:
    killed = trainer_run(f"{JOB}-a", _log("trainer-killed-at-step-7.log"))
    resumed = trainer_run(f"{JOB}-b", _log("trainer-resumed-from-step-4.log"))
    assert killed is not None and resumed is not None
    assert (killed.resumed_from, killed.last_step, killed.stopped) == (0, 6, False)  # logged every 2 steps
    assert (resumed.resumed_from, resumed.first_step_at) == (4, 1795574281.915072)
    [incident] = incidents([_lost("a", "2026-11-25T02:37:43Z"), _running("b", "2026-11-25T02:37:45Z")],
                           [killed, resumed])
    assert incident.cause == "disruption (DeletionByTaintManager)" and incident.pod == f"{JOB}-a"
    assert (incident.pods_replaced, incident.disruptions, incident.counted) == (1, 1, 0)
    assert incident.resumed_step == 4
    # it trained 7 steps, logged 6: a lower bound, and said so
    assert (incident.steps_lost, incident.steps_lost_exact) == (2, False)
    assert incident.time_to_resume_s == pytest.approx(1795574281.915072 - KILLED_AT)
    assert incident_line(1, incident) == (
        f"incident 1 at 2026-11-25T02:37:43Z: disruption (DeletionByTaintManager) of {JOB}-a: 1 pod(s) replaced "
        "(1 disruption(s), 0 counted); resumed from step 4 after 18.9s, at least 2 step(s) lost")


def test_a_recorded_sigterm_loses_no_step_exactly() -> None:
    stopped = trainer_run(f"{JOB}-a", _log("trainer-stopped-at-step-7.log"))
    resumed = trainer_run(f"{JOB}-b", _log("trainer-resumed-from-step-7.log"))
    assert stopped is not None and stopped.stopped and stopped.last_step == 7
    pods = [pod("a", "Failed", containers=[container_status("train", _finished(43, "2026-11-25T02:39:01Z"))]),
            _running("b", "2026-11-25T02:39:02Z")]
    [incident] = incidents(pods, [stopped, resumed] if resumed else [stopped])
    assert incident.cause == "stopped or lost a peer (exit 43)"
    assert (incident.disruptions, incident.counted) == (1, 0)
    assert (incident.resumed_step, incident.steps_lost, incident.steps_lost_exact) == (7, 0, True)
    assert incident.time_to_resume_s == pytest.approx(1795574378.3484905 - STOPPED_AT)
    assert incident_line(1, incident).endswith("resumed from step 7 after 37.3s, 0 step(s) lost")


def test_a_gang_incident_groups_its_pods_and_names_the_lost_node_not_the_peer() -> None:
    killed = trainer_run(f"{JOB}-0-a", _log("trainer-killed-at-step-7.log"))  # rank 0's pod: index 0
    resumed = trainer_run(f"{JOB}-0-b", _log("trainer-resumed-from-step-4.log"))
    assert killed is not None and resumed is not None
    pods = [
        # index 0 noticed the lost peer at once (exit 43); index 1's node was gone, its pod evicted 7 s later
        pod("0-a", "Failed", containers=[container_status("train", _finished(43, "2026-11-25T02:37:43Z"))]),
        _lost("1-a", "2026-11-25T02:37:50Z", code=None),
        _running("0-b", "2026-11-25T02:37:51Z"), _running("1-b", "2026-11-25T02:37:51Z"),
        # later: a rank crashes (exit 1, counted), its peer follows with 43; no resume yet
        pod("1-b2", "Failed", containers=[container_status("train", _finished(1, "2026-11-25T02:45:00Z"))]),
        pod("0-b2", "Failed", containers=[container_status("train", _finished(43, "2026-11-25T02:45:01Z"))]),
    ]
    first, second = incidents(pods, [killed, resumed])
    assert first.cause == "disruption (DeletionByTaintManager)" and first.pod == f"{JOB}-1-a"
    assert (first.pods_replaced, first.disruptions, first.counted) == (2, 2, 0)
    assert (first.resumed_step, first.steps_lost) == (4, 2)
    assert second.cause == "crashed (exit 1)" and second.pod == f"{JOB}-1-b2"
    assert (second.pods_replaced, second.disruptions, second.counted) == (2, 1, 1)
    assert second.resumed_step is None and second.time_to_resume_s is None
    assert incident_line(2, second).endswith("; no resume seen yet")


def test_without_trainer_events_failures_apart_by_more_than_the_gap_are_separate() -> None:
    def failed(suffix: str, at: float) -> dict[str, Any]:
        from datetime import UTC, datetime

        stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return pod(suffix, "Failed", containers=[container_status("train", _finished(43, stamp))])

    pods = [failed("a", KILLED_AT), failed("b", KILLED_AT + 10), failed("c", KILLED_AT + 10 + INCIDENT_GAP_S + 1)]
    assert [i.pods_replaced for i in incidents(pods, [])] == [2, 1]


@pytest.mark.parametrize("log", [
    "",
    "plain text\nTraceback (most recent call last):\n",
    '["event", "batch"]\n{"event": "batch", "step": "seven"}\n{not json\n',
    '{"event": "batch", "step": ' + "1" * 70000 + "}\n",  # longer than any event: not parsed
    '{"event": ' + "[" * 5000 + "]" * 5000 + "}\n",  # nested past the JSON decoder's recursion limit
])
def test_logs_without_trainer_events_give_no_run(log: str) -> None:
    assert trainer_run("p", log) is None


def test_config_errors_and_oom_kills_are_named_and_counted() -> None:
    config = pod("a", "Failed", containers=[container_status("train", _finished(42, "2026-11-25T02:37:43Z"))])
    oom_state = terminated(137, "OOMKilled")
    oom_state["terminated"]["finishedAt"] = "2026-11-25T03:00:00Z"
    oom = pod("b", "Failed", containers=[container_status("train", oom_state)])
    first, second = incidents([config, oom], [])
    assert (first.cause, first.counted) == ("config error (exit 42)", 1)
    assert (second.cause, second.counted) == ("OOMKilled", 1)


class _Core:
    def __init__(self, pods: list[dict[str, Any]], logs: dict[str, str]) -> None:
        self.pods, self.logs, self.log_reads = pods, logs, []

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        return type("Pods", (), {"items": self.pods})()

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> str:
        from kubernetes.client.exceptions import ApiException

        self.log_reads.append((name, kwargs))
        if name not in self.logs:
            raise ApiException(status=404, reason="NotFound")  # the lost node took its log with it
        return self.logs[name]

    def connect_get_namespaced_pod_proxy_with_path(self, *args: Any, **kwargs: Any) -> str:
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=503, reason="ServiceUnavailable")


class _Batch:
    def read_namespaced_job(self, name: str, namespace: str) -> dict[str, Any]:
        return job(active=1, ready=1)


def test_status_prints_a_line_per_incident_from_the_pods_logs(capsys: pytest.CaptureFixture[str]) -> None:
    pods = [_lost("a", "2026-11-25T02:37:43Z"), _running("b", "2026-11-25T02:37:45Z")]
    core = _Core(pods, {f"{JOB}-a": _log("trainer-killed-at-step-7.log"),
                        f"{JOB}-b": _log("trainer-resumed-from-step-4.log")})
    assert show_status(_Batch(), core, "training", JOB, as_json=False, clock=lambda: KILLED_AT + 60) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "restarts: 1 pod(s) replaced (1 disruption(s), 0 counted against backoffLimit)" in lines[0]
    assert lines[1:-1] == [f"  incident 1 at 2026-11-25T02:37:43Z: disruption (DeletionByTaintManager) of {JOB}-a: "
                           "1 pod(s) replaced (1 disruption(s), 0 counted); resumed from step 4 after 18.9s, "
                           "at least 2 step(s) lost"]
    # then the goodput line (workloads/goodput_status.py): the pods' creation to the test's clock, the incident's
    # 18.9 s to resume; this Job has no prediction annotation
    assert lines[-1] == ("  goodput 99.9% measured over 88.65 h (startup 0.1%, restart 0.0%); "
                         "not predicted (no annotation)")
    assert all(kwargs["container"] == "train" and kwargs["tail_lines"] > 0 and kwargs["limit_bytes"] > 0
               for _, kwargs in core.log_reads)
    assert show_status(_Batch(), core, "training", JOB, as_json=True, clock=lambda: KILLED_AT + 60) == 0
    [incident] = json.loads(capsys.readouterr().out)["incidents"]
    assert (incident["resumed_step"], incident["steps_lost"], incident["pod"]) == (4, 2, f"{JOB}-a")


def test_status_reads_no_logs_for_a_job_without_restarts(capsys: pytest.CaptureFixture[str]) -> None:
    core = _Core([_running("b", "2026-11-25T02:37:45Z")], {})
    assert show_status(_Batch(), core, "training", JOB, as_json=False, clock=lambda: KILLED_AT) == 0
    assert core.log_reads == [] and "incident" not in capsys.readouterr().out


def test_a_lost_log_still_gives_the_incident_from_the_pods() -> None:
    pods = [_lost("a", "2026-11-25T02:37:43Z"), _running("b", "2026-11-25T02:37:45Z")]
    phase = job_phase(job(active=1, ready=1), pods)
    [incident] = phase.incidents
    assert incident.cause == "disruption (DeletionByTaintManager)" and incident.resumed_step is None


def test_watch_prints_each_incident_once_when_it_has_resumed(capsys: pytest.CaptureFixture[str]) -> None:
    lost = _lost("a", "2026-11-25T02:37:43Z")
    logs = {f"{JOB}-a": _log("trainer-killed-at-step-7.log"), f"{JOB}-b": _log("trainer-resumed-from-step-4.log")}
    polls = [  # the replacement still loading, then training, then done
        ([lost, pod("b", "Running", created="2026-11-25T02:37:45Z", containers=[container_status("train", {
            "running": {"startedAt": "2026-11-25T02:37:45Z"}})])], {f"{JOB}-a": logs[f"{JOB}-a"]}),
        ([lost, _running("b", "2026-11-25T02:37:45Z")], logs),
        ([lost, _running("b", "2026-11-25T02:37:45Z")], logs),
    ]
    core = _Core(*polls[0])

    class Batch:
        polled = 0

        def read_namespaced_job(self, name: str, namespace: str) -> dict[str, Any]:
            core.pods, core.logs = polls[min(self.polled, 2)]
            self.polled += 1
            done = self.polled >= 3
            return job({"type": "Complete", "status": "True"}, succeeded=1) if done else job(active=1, ready=1)

    batch = Batch()
    assert watch_run(batch, core, "training", JOB, 1.0, clock=lambda: KILLED_AT, sleep=lambda s: None) == 0
    out = capsys.readouterr().out
    assert out.count("incident 1 at") == 1 and "resumed from step 4 after 18.9s" in out
    # every poll ends with the goodput line, the same text `status` prints for the same pods at the same time
    goodput = [line for line in out.splitlines() if line.startswith("  goodput")]
    assert len(goodput) == 3
    assert "no resume seen yet" not in out  # not printed while it had not resumed
    # the stopped pod's log was read once; the running one's on every poll that found it Running
    reads = [name for name, _ in core.log_reads]
    assert reads.count(f"{JOB}-a") == 1 and reads.count(f"{JOB}-b") == 3
    assert show_status(batch, core, "training", JOB, as_json=False, clock=lambda: KILLED_AT) == 0  # the last poll's
    assert capsys.readouterr().out.splitlines()[-1] == goodput[-1]
