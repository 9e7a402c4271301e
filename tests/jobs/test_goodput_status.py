"""The goodput `submit status` prints, measured from what the API server shows, beside the prediction `submit`
annotated the run with (workloads/goodput_status.py); against the stand-in API server in test_submit_facts.py."""

from __future__ import annotations

from typing import Any

import pytest

from workloads.goodput_status import PREDICTED_ANNOTATION, goodput_line, measured, predicted
from workloads.incidents import Incident
from workloads.progress import Snapshot

T0 = 1_795_000_000.0  # any instant: the pods' times are relative to it


def _iso(seconds: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(T0 + seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod(name: str, created: float, started: float | None, finished: float | None, phase: str) -> dict[str, Any]:
    state: dict[str, Any] = {}
    if started is not None:
        state = ({"terminated": {"startedAt": _iso(started), "finishedAt": _iso(finished), "exitCode": 0}}
                 if finished is not None else {"running": {"startedAt": _iso(started)}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "training", "creationTimestamp": _iso(created)},
            "status": {"phase": phase, "containerStatuses": [{"name": "train", "state": state, "image": "x:1",
                                                                "imageID": "", "ready": False, "restartCount": 0}]}}


def test_the_estimate_by_hand() -> None:
    """An hour: 5 min to the container's start, one incident that took 10 min to resume and lost 30 steps; the live
    ranks (2) stepped 1,000 times in 2,000 s of rank time, waited 100 s each for data and 20 s each in checkpoints."""
    pods = [_pod("a", 0, 300, None, "Running")]
    incident = Incident(started_at=T0 + 1800, cause="crashed", pod="a", pods_replaced=1, disruptions=0, counted=1,
                        resumed_step=100, steps_lost=30, time_to_resume_s=600)
    now = Snapshot(at=T0 + 3600, ranks=2, steps=1000, step_seconds=4000, wait_seconds=200, checkpoint_seconds=40)
    wall, buckets = measured(pods, [incident], now, now.at) or (0.0, {})
    assert wall == 3600
    assert buckets == {"startup": 300, "restart": 600, "lost": 30 * 2.0, "data wait": 100, "checkpoint": 20,
                       "productive": 3600 - 300 - 600 - 60 - 100 - 20}
    line = goodput_line((wall, buckets), 0.9795)
    assert line == ("goodput 70.0% measured over 1.00 h (startup 8.3%, restart 16.7%, lost 1.7%, data wait 2.8%, "
                    "checkpoint 0.6%); 97.95% predicted")


@pytest.mark.parametrize("value", ["1.5", "-0.1", "nan", "most", None])
def test_an_annotation_that_is_not_a_fraction_is_no_prediction(value: Any) -> None:
    run = {"metadata": {"annotations": {f"x.io/{PREDICTED_ANNOTATION}": value}}}
    assert predicted(run) is None
    assert predicted({"metadata": {"annotations": {f"x.io/{PREDICTED_ANNOTATION}": "0.5"}}}) == 0.5


def finished_pod(job: str) -> dict[str, Any]:
    """The one pod of `job`: created at T0, its training container started 5 minutes later and ran 55 more."""
    pod = _pod(f"{job}-0", 0, 300, 3600, "Succeeded")
    pod["metadata"]["labels"] = {"batch.kubernetes.io/job-name": job}
    return pod
