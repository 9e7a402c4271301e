"""A run's measured goodput as `submit status` can see it through the API server alone, beside the predicted one.

The recording rules (infra/monitoring/goodput.py) split GPU time exactly from Prometheus; `status` has no Prometheus,
only the run's pods, its incidents (workloads.incidents: from the pods and the trainer's log events) and the live
ranks' metrics pages (workloads.progress.Snapshot). From those it estimates, over the wall time since the first pod
was created (until the last container ended, for a finished run):

    startup     first pod created -> its training container started (scheduling, a node, image pull, init and
                staging containers), and on to the trainer's start once its ranks report one (rendezvous, data)
    restart     each incident's time to resume (from the failure to the first step after it)
    lost        each incident's steps lost x the live ranks' mean step time (a lower bound: killed runs log their
                last step every --log-every steps)
    data wait   the live ranks' share of step time spent waiting for batches, over their lifetime
    checkpoint  the live ranks' seconds blocked in checkpoint saves
    productive  the rest

The gang's pods start and stop together, so the shares are the same per GPU. Earlier processes' data waits and
checkpoint stalls are not on a live page any more and count as productive here: the rules see them.

The predicted goodput comes from the run's PREDICTED_ANNOTATION (`submit render|submit` and the stack put it there
from the spec and the job facts: workloads.jobspec.prediction.annotate_prediction).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workloads.incidents import Incident, api_time
from workloads.jobspec.fields import TRAIN_CONTAINER
from workloads.jobspec.prediction import PREDICTED_ANNOTATION
from workloads.progress import Snapshot

BADPUT = ("startup", "restart", "lost", "data wait", "checkpoint")




def _container_times(pod: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(started, finished) of the pod's training container."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != TRAIN_CONTAINER:
            continue
        state = status.get("state") or {}
        running, ended = state.get("running") or {}, state.get("terminated") or {}
        return api_time(running.get("startedAt") or ended.get("startedAt")), api_time(ended.get("finishedAt"))
    return None, None


def measured(pods: Sequence[Mapping[str, Any]], incidents: Sequence[Incident], now: Snapshot,
             at: float) -> tuple[float, dict[str, float]] | None:
    """(wall seconds, seconds per bucket: BADPUT and productive) of the run so far; None before it has a pod."""
    created = [t for pod in pods if (t := api_time((pod.get("metadata") or {}).get("creationTimestamp"))) is not None]
    if not created:
        return None
    began = min(created)
    times = [_container_times(pod) for pod in pods]
    running = any((pod.get("status") or {}).get("phase") in ("Pending", "Running") for pod in pods)
    finished = [end for _, end in times if end is not None]
    end = at if running or not finished else max(finished)
    wall = max(0.0, end - began)
    buckets = dict.fromkeys(BADPUT, 0.0)
    first_started = min((start for start, _ in times if start is not None), default=None)
    trainer_start = now.start_time if now.ranks and not incidents else None
    startup_end = max(t for t in (first_started, trainer_start) if t is not None) \
        if first_started is not None or trainer_start is not None else end
    buckets["startup"] = min(wall, max(0.0, startup_end - began))
    for incident in incidents:
        resume = incident.time_to_resume_s
        buckets["restart"] += resume if resume is not None else max(0.0, end - incident.started_at)
    if now.ranks and now.steps > 0:
        step_s = now.step_seconds / now.ranks / now.steps
        buckets["lost"] = step_s * sum(incident.steps_lost or 0 for incident in incidents)
        buckets["data wait"] = now.wait_seconds / now.ranks
        buckets["checkpoint"] = now.checkpoint_seconds / now.ranks
    spent = sum(buckets.values())
    if spent > wall > 0:  # estimates from different clocks overlap: scale them into the wall time
        buckets = {name: value * wall / spent for name, value in buckets.items()}
    buckets["productive"] = max(0.0, wall - sum(buckets.values()))
    return wall, buckets


def predicted(run: Mapping[str, Any]) -> float | None:
    """The prediction `submit` annotated the run with (<label prefix>/PREDICTED_ANNOTATION, whatever the stack's
    prefix); None when it has none or it is not a fraction."""
    annotations = (run.get("metadata") or {}).get("annotations") or {}
    text = next((value for key, value in annotations.items()
                 if isinstance(key, str) and key.endswith(f"/{PREDICTED_ANNOTATION}")), None)
    try:
        value = float(text) if isinstance(text, str) else None
    except ValueError:
        return None
    return value if value is not None and 0.0 <= value <= 1.0 else None


def goodput_line(measure: tuple[float, dict[str, float]] | None, prediction: float | None) -> str:
    """`goodput 91.2% measured so far (startup 2.1%, restart 3.1%, lost 0.4%, data wait 2.4%, checkpoint 0.8%);
    97.95% predicted`"""
    guess = f"{prediction:.2%} predicted" if prediction is not None else "not predicted (no annotation)"
    if measure is None or measure[0] <= 0:
        return f"goodput: not measured yet; {guess}"
    wall, buckets = measure
    parts = ", ".join(f"{name} {buckets[name] / wall:.1%}" for name in BADPUT if buckets[name] > 0)
    return (f"goodput {buckets['productive'] / wall:.1%} measured over {wall / 3600:.2f} h"
            f"{f' ({parts})' if parts else ''}; {guess}")
