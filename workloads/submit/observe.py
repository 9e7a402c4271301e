"""A run's progress and incidents, read through the API server: the pods' metrics pages (pod proxy: no
port-forward, nothing exposed; computed by workloads.progress) and the trainer's events in their log tails
(workloads.incidents); `status` prints them once, `watch` a line per poll."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from workloads.goodput_status import goodput_line, measured, predicted
from workloads.incidents import TrainerRun, incident_line, trainer_run
from workloads.jobspec import KUEUE_QUEUE_LABEL, TRAIN_CONTAINER
from workloads.progress import MetricsParseError, Progress, Snapshot, parse_metrics, progress, progress_line, snapshot
from workloads.submit.errors import RuntimeFailure
from workloads.submit.kube import run_pods, timeout_of
from workloads.submit.kueue import kueue_state
from workloads.submit.phase import RunPhase, job_phase, pod_restarts, slices_done
from workloads.submit.runs import as_trainer_pods, job_view, read_run, trainer_container

# The trainer's events in a pod's log tail that `status` reads for a Job with restarts (workloads.incidents).
INCIDENT_LOG_LINES = 200
INCIDENT_LOG_BYTES = 256 * 1024
DEFAULT_WATCH_TIMEOUT_S = 7 * 24 * 3600.0


def metrics_endpoints(pod: dict[str, Any]) -> list[str]:
    """`<pod>:<port>` of every metrics port a pod declares (trainer ranks, stager), for the pod proxy."""
    spec = pod.get("spec") or {}
    name = (pod.get("metadata") or {}).get("name", "")
    return [f"{name}:{port['containerPort']}"
            for container in (spec.get("initContainers") or []) + (spec.get("containers") or [])
            for port in container.get("ports") or [] if str(port.get("name", "")).startswith("metrics-")]


MAX_METRICS_PAGE_BYTES = 4 << 20  # the trainer's and stager's pages are a few KiB; more is not theirs


def metrics_page(core: Any, namespace: str, endpoint: str) -> str:
    """One endpoint's page through the pod proxy, read at most MAX_METRICS_PAGE_BYTES (the client would otherwise
    hold whatever the pod sends); MetricsParseError when it is larger."""
    response = core.connect_get_namespaced_pod_proxy_with_path(endpoint, namespace, "metrics",
                                                               _preload_content=False)
    try:
        data = response.read(MAX_METRICS_PAGE_BYTES + 1)
    finally:
        response.release_conn()
    if len(data) > MAX_METRICS_PAGE_BYTES:
        raise MetricsParseError(f"{endpoint}: page larger than {MAX_METRICS_PAGE_BYTES} bytes")
    return bytes(data).decode("utf-8", "replace")


def metrics_pages(core: Any, namespace: str, pods: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The metrics of every live pod's endpoints; an endpoint that is not up (yet, or any more) is skipped."""
    from kubernetes.client.exceptions import ApiException

    pages = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") not in ("Pending", "Running"):
            continue
        for endpoint in metrics_endpoints(pod):
            try:
                pages.append(parse_metrics(metrics_page(core, namespace, endpoint)))
            except (ApiException, MetricsParseError):
                continue
    return pages


def trainer_runs(core: Any, namespace: str, pods: list[dict[str, Any]],
                  finished: dict[str, TrainerRun | None] | None = None,
                  container: str = TRAIN_CONTAINER) -> list[TrainerRun]:
    """The trainer run in each pod's log tail (the events carry where the run started and its first step); a log
    that cannot be read (the pod or its node gone) is skipped. `finished` keeps what was read from pods that have
    stopped (their logs no longer change) across the polls of `watch`."""
    from kubernetes.client.exceptions import ApiException

    runs = []
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        if phase not in ("Running", "Succeeded", "Failed"):
            continue
        name = (pod.get("metadata") or {}).get("name", "")
        if finished is not None and name in finished:
            known = finished[name]
            if known is not None:
                runs.append(known)
            continue
        try:
            log = core.read_namespaced_pod_log(name, namespace, container=container,
                                               tail_lines=INCIDENT_LOG_LINES, limit_bytes=INCIDENT_LOG_BYTES)
        except ApiException:
            continue
        run = trainer_run(name, str(log))
        if finished is not None and phase != "Running":
            finished[name] = run
        if run is not None:
            runs.append(run)
    return runs


def observe(batch: Any, core: Any, namespace: str, name: str, clock: Any,
             finished: dict[str, TrainerRun | None] | None = None,
             gang_timeout: Callable[[], int | None] | None = None) -> tuple[RunPhase, Snapshot]:
    controller, run = read_run(batch, namespace, name)
    job = job_view(controller, run)
    workload, position = (None, None)
    if KUEUE_QUEUE_LABEL in ((job.get("metadata") or {}).get("labels") or {}):
        workload, position = kueue_state(namespace, job, timeout_of(batch))
    pods = as_trainer_pods(controller, run_pods(core, namespace, name, controller))
    restarted = pod_restarts(pods)[0] > 0  # logs are read only for a Job with incidents
    runs = (trainer_runs(core, namespace, pods, finished, trainer_container(controller, TRAIN_CONTAINER))
            if restarted else ())
    phase = job_phase(job, pods, workload, position, runs)
    if phase.reason == "WaitingForCapacity" and gang_timeout is not None:  # only then: the facts are one more call
        phase = job_phase(job, pods, workload, position, runs, clock(), gang_timeout())
    now = snapshot(metrics_pages(core, namespace, pods), clock())
    phase = replace(phase, goodput=goodput_line(measured(pods, phase.incidents, now, now.at),
                                                predicted(run)))
    slices = slices_done(job)
    return phase, replace(now, slices=slices) if slices is not None else now


def status_line(name: str, phase: RunPhase, figures: Progress | None) -> str:
    reason = f" ({phase.reason})" if phase.reason else ""
    line = progress_line(name, f"{phase.phase}{reason}", figures)
    if phase.restarts:
        counted = phase.restarts - phase.disruptions
        line += (f"  restarts: {phase.restarts} pod(s) replaced ({phase.disruptions} disruption(s), "
                 f"{counted} counted against backoffLimit)")
    return f"{line}  {phase.detail}" if phase.detail else line


def incident_lines(phase: RunPhase, first: int = 0) -> list[str]:
    """`  incident N at ...` for each incident from the `first` (0-based) on."""
    return [f"  {incident_line(number, incident)}"
            for number, incident in enumerate(phase.incidents, start=1) if number > first]


def is_pack(now: Snapshot) -> bool:
    return now.pack_images is not None or now.slices is not None


def show_status(batch: Any, core: Any, namespace: str, name: str, as_json: bool, clock: Any = None,
                gang_timeout: Callable[[], int | None] | None = None) -> int:
    """`gang_timeout`: reads Kueue's gang timeout (the job facts) for a gang waiting for capacity."""
    import time

    phase, now = observe(batch, core, namespace, name, clock or time.time, gang_timeout=gang_timeout)
    figures = progress(now) if now.ranks or now.stage_shards is not None or is_pack(now) else None
    if as_json:
        print(json.dumps({"name": name, **asdict(phase), "progress": asdict(figures) if figures else None}))
    else:
        print("\n".join([status_line(name, phase, figures), *incident_lines(phase),
                         *([f"  {phase.goodput}"] if phase.goodput else [])]))
    return 1 if phase.phase == "Failed" else 0


def watch_run(batch: Any, core: Any, namespace: str, name: str, interval: float, clock: Any = None,
           sleep: Any = None, timeout: float = DEFAULT_WATCH_TIMEOUT_S) -> int:
    """A line per poll (each poll reads the Job again: it says what is waited for), then the goodput line `status`
    prints (measured so far beside predicted); rates over the last interval;
    returns when the run has succeeded or failed, and raises RuntimeFailure when it has not after `timeout`."""
    import time

    clock, sleep = clock or time.time, sleep or time.sleep
    started = time.monotonic()
    before: Snapshot | None = None
    settled = 0  # incidents already printed with their resume
    finished: dict[str, TrainerRun | None] = {}  # trainer runs of stopped pods, read once
    while True:
        phase, now = observe(batch, core, namespace, name, clock, finished)
        figures = progress(now, before) if now.ranks or now.stage_shards is not None or is_pack(now) else None
        print(status_line(name, phase, figures), flush=True)
        # an incident is printed once it has resumed (or when it is the run's last), not on every poll
        done = phase.phase in ("Succeeded", "Failed")
        ready = [i for i, incident in enumerate(phase.incidents)
                 if incident.resumed_step is not None or done]
        upto = max(ready, default=-1) + 1
        if upto > settled:
            print("\n".join(incident_lines(replace(phase, incidents=phase.incidents[:upto]), settled)), flush=True)
            settled = upto
        if phase.goodput:
            print(f"  {phase.goodput}", flush=True)  # as `status` prints it: measured so far beside predicted
        if phase.phase in ("Succeeded", "Failed"):
            return 1 if phase.phase == "Failed" else 0
        left = timeout - (time.monotonic() - started)
        if left <= 0:
            raise RuntimeFailure(f"job/{name}", f"still {phase.phase} after {timeout:g}s (watch --timeout)")
        before = now if now.ranks or now.pack_images is not None else before
        sleep(min(interval, left))
