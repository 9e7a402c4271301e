"""A training Job's restart incidents, for `submit status` and `watch`: when the gang lost a pod and why, how many pods
were replaced (disruptions, counted failures), the step it resumed from, the steps lost and the time until it
trained again.

Pure functions over what the API returns: the Job's pods (their status) and the trainer's JSON events in their logs
(rank 0's pod only has them). The trainer's `first_step` event, and every `batch` event, carry `resumed_from` (the
step the run started at) and `first_step_time` (the Unix time of its first step), so the tail of a log is enough.

An incident starts at the first pod failure after the gang last trained again; the failures until the gang takes
its next first step (its other pods exiting 43, the lost node's pod evicted a minute later) belong to it. Without
trainer events (logs gone, another trainer) failures more than INCIDENT_GAP_S apart are separate incidents.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from workloads.jobspec import CONFIG_ERROR_EXIT_CODE, DISRUPTION_EXIT_CODE
from workloads.jobspec.fields import TRAIN_CONTAINER

INCIDENT_GAP_S = 120.0
MAX_LOG_LINE = 64 * 1024  # a longer line is not one of the trainer's events


@dataclass(frozen=True)
class TrainerRun:
    """One trainer process's run, from the events in its pod's log."""

    pod: str
    resumed_from: int | None  # the step it started from (0: a fresh run)
    first_step_at: float | None  # Unix time of its first step
    last_step: int | None  # the last step it reported (batch, checkpoint, stopped)
    stopped: bool = False  # it stopped on SIGTERM after a last checkpoint


@dataclass(frozen=True)
class Incident:
    started_at: float  # Unix time of the incident's first pod failure
    cause: str  # the root failure: the first one that is not a peer exiting with the disruption code
    pod: str  # the pod that failed with that cause
    pods_replaced: int
    disruptions: int  # not counted against backoffLimit
    counted: int
    resumed_step: int | None = None  # None: not resumed (yet), or no trainer events
    # from the last step the failed run logged: exact when it stopped on SIGTERM, else a lower bound (the trainer
    # logs every --log-every steps, and a killed one says nothing about the steps since)
    steps_lost: int | None = None
    steps_lost_exact: bool = False
    time_to_resume_s: float | None = None  # from started_at to the first step after the resume


def api_time(text: Any) -> float | None:
    """An API server's RFC 3339 time as epoch seconds; None for anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def trainer_run(pod: str, log: str) -> TrainerRun | None:
    """The run a pod's log shows (JSON event lines among anything else); None without trainer events."""
    resumed_from: int | None = None
    first_step_at: float | None = None
    last_step: int | None = None
    stopped = False
    for line in log.splitlines():
        line = line.strip()
        if not line.startswith("{") or len(line) > MAX_LOG_LINE:
            continue
        try:
            event = json.loads(line)
        except (json.JSONDecodeError, RecursionError):  # a pod prints anything, nested arrays too
            continue
        if not isinstance(event, dict):
            continue
        name = event.get("event")
        if name in ("first_step", "batch"):
            resumed_from = _int(event.get("resumed_from"))
            first_step_at = _number(event.get("time" if name == "first_step" else "first_step_time"))
        elif name == "resumed":
            resumed_from = _int(event.get("step"))
        if name in ("first_step", "batch", "checkpoint", "stopped"):
            step = _int(event.get("step"))
            if step is not None:
                last_step = step if last_step is None else max(last_step, step)
        if name == "stopped":
            stopped = True
    if resumed_from is None and first_step_at is None and last_step is None:
        return None
    return TrainerRun(pod, resumed_from, first_step_at, last_step, stopped)


def _train_exit(pod: Mapping[str, Any]) -> tuple[int | None, str, float | None]:
    """(exit code, reason, finishedAt) of the trainer container's last termination."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != TRAIN_CONTAINER:
            continue
        terminated = (status.get("state") or {}).get("terminated") or \
            (status.get("lastState") or {}).get("terminated") or {}
        return terminated.get("exitCode"), str(terminated.get("reason") or ""), api_time(terminated.get("finishedAt"))
    return None, "", None


def _disruption(pod: Mapping[str, Any]) -> tuple[str, float | None] | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return str(condition.get("reason") or "DisruptionTarget"), api_time(condition.get("lastTransitionTime"))
    return None


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "pod"))


def pod_failure(pod: Mapping[str, Any]) -> tuple[float, str, bool, bool] | None:
    """(when, cause, a disruption (not counted), a peer's disruption exit) of a Failed pod; None otherwise."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return None
    code, reason, finished = _train_exit(pod)
    targeted = _disruption(pod)
    metadata = pod.get("metadata") or {}
    when = finished or (targeted[1] if targeted else None) or api_time(metadata.get("deletionTimestamp")) \
        or api_time(metadata.get("creationTimestamp")) or 0.0
    if targeted is not None and code != DISRUPTION_EXIT_CODE:
        return when, f"disruption ({targeted[0]})", True, False
    if code == DISRUPTION_EXIT_CODE:
        return when, f"stopped or lost a peer (exit {code})", True, True
    if code == CONFIG_ERROR_EXIT_CODE:
        return when, f"config error (exit {code})", False, False
    if reason == "OOMKilled":
        return when, "OOMKilled", False, False
    if code is not None:
        return when, f"crashed (exit {code}{', ' + reason if reason and reason != 'Error' else ''})", False, False
    return when, str(status.get("reason") or "failed"), False, False


def incidents(pods: Sequence[Mapping[str, Any]], runs: Iterable[TrainerRun]) -> list[Incident]:
    """The Job's incidents, oldest first, from its pods and the trainer runs read from their logs."""
    runs = list(runs)
    run_of = {run.pod: run for run in runs}
    starts = sorted(run.first_step_at for run in runs if run.first_step_at is not None)
    failures = sorted((failure[0], _name(pod), failure) for pod in pods
                      if (failure := pod_failure(pod)) is not None)
    groups: list[list[tuple[float, str, tuple[float, str, bool, bool]]]] = []
    for item in failures:
        if groups:
            began, last = groups[-1][0][0], groups[-1][-1][0]
            resumed = next((at for at in starts if at > began), None)
            same = item[0] <= resumed if resumed is not None else item[0] - last <= INCIDENT_GAP_S
            if same:
                groups[-1].append(item)
                continue
        groups.append([item])
    found = []
    for group in groups:
        began = group[0][0]
        root = next((item for item in group if not item[2][3]), group[0])  # a peer's 43 follows the real cause
        disruptions = sum(1 for item in group if item[2][2])
        resumed_run = min((run for run in runs if run.first_step_at is not None and run.first_step_at > began),
                          key=lambda run: run.first_step_at or 0.0, default=None)
        failed = [run for item in group if (run := run_of.get(item[1])) and run.last_step is not None]
        resumed_step = resumed_run.resumed_from if resumed_run else None
        steps_lost, exact = None, False
        if resumed_step is not None and failed:
            worst = max(failed, key=lambda run: run.last_step or 0)
            steps_lost, exact = max(0, (worst.last_step or 0) - resumed_step), worst.stopped
        found.append(Incident(
            started_at=began, cause=root[2][1], pod=root[1], pods_replaced=len(group), disruptions=disruptions,
            counted=len(group) - disruptions, resumed_step=resumed_step, steps_lost=steps_lost, steps_lost_exact=exact,
            time_to_resume_s=(resumed_run.first_step_at - began
                              if resumed_run and resumed_run.first_step_at is not None else None)))
    return found


def incident_line(number: int, incident: Incident) -> str:
    """`incident 2 at 2026-11-25T02:13:05Z: disruption (DeletionByTaintManager) of train-0: 2 pod(s) replaced
    (2 disruption(s), 0 counted); resumed from step 120 after 41.2s, at least 3 step(s) lost`"""
    when = datetime.fromtimestamp(incident.started_at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    line = (f"incident {number} at {when}: {incident.cause} of {incident.pod}: {incident.pods_replaced} pod(s) "
            f"replaced ({incident.disruptions} disruption(s), {incident.counted} counted)")
    if incident.resumed_step is None:
        return line + "; no resume seen yet"
    line += f"; resumed from step {incident.resumed_step}"
    if incident.time_to_resume_s is not None:
        line += f" after {incident.time_to_resume_s:.1f}s"
    if incident.steps_lost is not None:
        line += f", {'' if incident.steps_lost_exact else 'at least '}{incident.steps_lost} step(s) lost"
    return line
