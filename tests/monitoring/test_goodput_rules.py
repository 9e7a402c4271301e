"""Measured goodput's recording rules (infra/monitoring/goodput.py) with promtool, over stand-in kube-state-metrics
and trainer series of a run with a wait for capacity, a start-up, a data-wait episode, a checkpoint stall, one gang
restart and the steps it redid: each bucket equals the hand-computed GPU-seconds, and they add up to wall time x
GPUs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.monitoring.dashboard import GOODPUT_PANELS
from infra.monitoring.goodput import (
    BUCKETS,
    GOODPUT_GPUS,
    GOODPUT_INTERVAL_S,
    TEAM_GOODPUT_GPUS,
    goodput_ratio,
    goodput_rule_groups,
    gpu_seconds,
)
from tests.monitoring.prom import PROMETHEUS, PROMTOOL, prometheus, static_exporter

NS, TEAM_NS = "training", "team-a"
JOB, TEAM_JOB = "llm-1a2b3c4d", "tiny-5e6f7a8b"
MINUTES = 30  # samples at minutes 0..29


def values(by_minute: dict[int, float | str]) -> str:
    """promtool's value list over MINUTES one-minute samples: `_` where a minute has none."""
    return " ".join(str(by_minute.get(minute, "_")) for minute in range(MINUTES))


def span(first: int, last: int, value: float | str) -> dict[int, float | str]:
    return {minute: value for minute in range(first, last + 1)}


def pod_series(namespace: str, job: str, pod: str, gpus: int, phases: dict[str, tuple[int, int]],
               unscheduled: tuple[int, int] | None, exists: tuple[int, int]) -> list[dict[str, str]]:
    """kube-state-metrics of one pod: its phase per minute range, PodScheduled false while unscheduled."""
    labels = f'namespace="{namespace}", pod="{pod}"'
    first, last = exists
    out = [{"series": f'kube_pod_labels{{{labels}, label_app_kubernetes_io_instance="{job}"}}',
            "values": values(span(first, last, 1))},
           {"series": f'kube_pod_container_resource_requests{{{labels}, container="train", '
                      f'resource="nvidia_com_gpu", unit="integer"}}', "values": values(span(first, last, gpus))}]
    for phase in ("Pending", "Running", "Succeeded", "Failed"):
        minutes = span(first, last, 0)
        if phase in phases:
            minutes.update(span(*phases[phase], 1))
        out.append({"series": f'kube_pod_status_phase{{{labels}, phase="{phase}"}}', "values": values(minutes)})
    unsched = span(first, last, 0)
    if unscheduled is not None:
        unsched.update(span(*unscheduled, 1))
    out.append({"series": f'kube_pod_status_scheduled{{{labels}, condition="false"}}', "values": values(unsched)})
    return out


def rank_series(namespace: str, job: str, pod: str, rank: int, steps: dict[int, float | str],
                global_step: dict[int, float | str], data_wait: dict[int, float | str],
                stall: dict[int, float | str]) -> list[dict[str, str]]:
    """The trainer's series of one rank (its own endpoint), as the PodMonitor labels them."""
    labels = f'namespace="{namespace}", pod="{pod}", job_name="{job}", instance="{pod}:{9400 + rank}"'
    return [{"series": f"ml_train_steps_total{{{labels}}}", "values": values(steps)},
            {"series": f"ml_train_global_step{{{labels}}}", "values": values(global_step)},
            {"series": f"ml_train_data_wait_seconds_sum{{{labels}}}", "values": values(data_wait)},
            {"series": f"ml_train_checkpoint_stall_seconds_total{{{labels}}}", "values": values(stall)}]


def _ended(minutes: dict[int, float | str], at: int) -> dict[int, float | str]:
    return {**minutes, at: "stale"}  # the process is gone: the next scrape marks its series stale


def run_series() -> list[dict[str, str]]:
    """A 2-pod gang of 2 GPUs a pod, 2 ranks a pod, in `training`:

    minutes 0-1   pods a, b Pending, not scheduled                     -> capacity
    2             scheduled, pulling the image                         -> startup
    3             Running, the trainer has not stepped                 -> startup
    4-12          stepping at 60 steps/min up to step 540; data waits over minutes 7-9 (pod a's rank 0 30 s/min,
                  the other ranks 15 s/min); over minute 10 rank 0 (pod a) writes a checkpoint for 6 s, which the
                  whole gang waits for
    13            a, b Failed; replacements c, d Pending, not scheduled -> capacity
    14-15         scheduled, then Running before their first step     -> restart (the Job trained before)
    16-17         stepping from the checkpoint at step 400: 460, 520 < 540 -> recompute (c's ranks block 6 s in a
                  checkpoint over minute 17: still recompute)
    18-25         past the old step                                     -> productive
    26-29         Succeeded: no GPUs held
    And in team-a a 1-GPU pod e stepping over minutes 0-9, Succeeded from 10.
    """
    series: list[dict[str, str]] = []
    for pod in ("a", "b"):
        series += pod_series(NS, JOB, pod, 2, {"Pending": (0, 2), "Running": (3, 12), "Failed": (13, 29)},
                             (0, 1), (0, 29))
        for rank in (0, 1):
            steps = _ended({m: 60 * (m - 3) for m in range(4, 13)}, 13)
            heavy = pod == "a" and rank == 0
            per_minute = 30 if heavy else 15
            waits = {**span(4, 6, 0), 7: per_minute, 8: 2 * per_minute, **span(9, 12, 3 * per_minute)}
            stall = {**span(4, 9, 0), **span(10, 12, 6 if heavy else 0)}  # rank 0 writes, the gang waits
            series += rank_series(NS, JOB, pod, rank, steps, steps, _ended(waits, 13), _ended(stall, 13))
    for pod in ("c", "d"):
        series += pod_series(NS, JOB, pod, 2, {"Pending": (13, 14), "Running": (15, 25), "Succeeded": (26, 29)},
                             (13, 13), (13, 29))
        for rank in (0, 1):
            stall = {16: 0, **span(17, 25, 6 if pod == "c" else 0)}
            series += rank_series(NS, JOB, pod, rank, _ended({m: 60 * (m - 15) for m in range(16, 26)}, 26),
                                  _ended({m: 400 + 60 * (m - 15) for m in range(16, 26)}, 26),
                                  _ended(span(16, 25, 0), 26), _ended(stall, 26))
    series += pod_series(TEAM_NS, TEAM_JOB, "e", 1, {"Running": (0, 9), "Succeeded": (10, 29)}, None, (0, 29))
    series += rank_series(TEAM_NS, TEAM_JOB, "e", 0, _ended({m: 10 * (m + 1) for m in range(10)}, 10),
                          _ended({m: 10 * (m + 1) for m in range(10)}, 10), _ended(span(0, 9, 0), 10),
                          _ended(span(0, 9, 0), 10))
    return series


# Hand-computed GPU-seconds of the gang (4 GPUs), one evaluation a minute standing for 60 s:
DATA_WAIT = 3 * (2 * (30 + 15) / 2 / 60 + 2 * 15 / 60) * 60  # minutes 7-9: pod a 0.375, pod b 0.25 of 2 GPUs each
STALL = 4 * 6 / 60 * 60  # minute 10: 6 s of 60 on every GPU
EXPECTED = {
    "capacity": (2 + 1) * 4 * 60,  # minutes 0, 1 and 13
    "startup": 2 * 4 * 60,  # minutes 2, 3
    "restart": 2 * 4 * 60,  # minutes 14, 15
    "recompute": 2 * 4 * 60,  # minutes 16, 17
    "checkpoint": STALL,
    "data_wait": DATA_WAIT,
    "productive": (9 + 8) * 4 * 60 - DATA_WAIT - STALL,  # minutes 4-12 and 18-25, less the waits and the stall
}
WALL_X_GPUS = 26 * 60 * 4  # minutes 0-25, 4 GPUs


def test_the_hand_computation_adds_up() -> None:
    assert set(EXPECTED) == set(BUCKETS)
    assert DATA_WAIT == 225 and STALL == 24
    assert sum(EXPECTED.values()) == WALL_X_GPUS == 6240


def test_rule_groups_shape() -> None:
    [group] = goodput_rule_groups(NS, (TEAM_NS,))
    assert group["interval"] == f"{GOODPUT_INTERVAL_S}s"
    assert [rule.get("labels", {}).get("bucket") for rule in group["rules"]] == [*BUCKETS, None]
    assert all(f'namespace=~"{NS}|{TEAM_NS}"' in rule["expr"] for rule in group["rules"][:-1])


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not on PATH (make setup puts Debian's in .tools)")
def test_buckets_add_up_to_wall_time_times_gpus(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": goodput_rule_groups(NS, (TEAM_NS,))}))
    job = f'namespace="{NS}", job_name="{JOB}"'
    per_bucket: list[dict[str, Any]] = [
        {"labels": f'{{bucket="{bucket}", job_name="{JOB}", namespace="{NS}"}}', "value": seconds}
        for bucket, seconds in EXPECTED.items()]
    per_bucket += [{"labels": f'{{bucket="{bucket}", job_name="{TEAM_JOB}", namespace="{TEAM_NS}"}}',
                    "value": 10 * 60 if bucket == "productive" else 0}  # a stepping pod's shares are recorded, 0 too
                   for bucket in ("productive", "data_wait", "checkpoint")]
    tests: list[dict[str, Any]] = [
        # [29m] at minute 29 holds the 30 evaluations 0..29 (both ends included)
        {"expr": gpu_seconds("29m"), "eval_time": "29m", "exp_samples": per_bucket},
        {"expr": f"sum({gpu_seconds('29m', job)})", "eval_time": "29m", "exp_samples": [{"value": WALL_X_GPUS}]},
        {"expr": goodput_ratio("29m", job), "eval_time": "29m",
         "exp_samples": [{"labels": f'{{job_name="{JOB}", namespace="{NS}"}}',
                          "value": EXPECTED["productive"] / WALL_X_GPUS}]},
        {"expr": gpu_seconds("29m", by="namespace", series=TEAM_GOODPUT_GPUS), "eval_time": "29m",
         "exp_samples": [{"labels": f'{{namespace="{NS}"}}', "value": WALL_X_GPUS},
                         {"labels": f'{{namespace="{TEAM_NS}"}}', "value": 600}]},
        # one evaluation: every GPU of the gang in one bucket, here the data-wait episode's minute 8
        {"expr": f"{GOODPUT_GPUS}{{{job}}}", "eval_time": "8m", "exp_samples": [
            {"labels": f'{GOODPUT_GPUS}{{bucket="checkpoint", job_name="{JOB}", namespace="{NS}"}}', "value": 0},
            {"labels": f'{GOODPUT_GPUS}{{bucket="data_wait", job_name="{JOB}", namespace="{NS}"}}', "value": 1.25},
            {"labels": f'{GOODPUT_GPUS}{{bucket="productive", job_name="{JOB}", namespace="{NS}"}}', "value": 2.75}]},
    ]
    unit = {"rule_files": ["rules.yml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": run_series(), "promql_expr_test": tests}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run([str(PROMTOOL), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


STAND_INS = f"""\
# TYPE kube_pod_labels gauge
kube_pod_labels{{namespace="{NS}",pod="a",label_app_kubernetes_io_instance="{JOB}"}} 1
kube_pod_labels{{namespace="{NS}",pod="b",label_app_kubernetes_io_instance="{JOB}"}} 1
# TYPE kube_pod_container_resource_requests gauge
kube_pod_container_resource_requests{{namespace="{NS}",pod="a",resource="nvidia_com_gpu",unit="integer"}} 2
kube_pod_container_resource_requests{{namespace="{NS}",pod="b",resource="nvidia_com_gpu",unit="integer"}} 2
# TYPE kube_pod_status_phase gauge
kube_pod_status_phase{{namespace="{NS}",pod="a",phase="Running"}} 1
kube_pod_status_phase{{namespace="{NS}",pod="a",phase="Pending"}} 0
kube_pod_status_phase{{namespace="{NS}",pod="b",phase="Running"}} 0
kube_pod_status_phase{{namespace="{NS}",pod="b",phase="Pending"}} 1
# TYPE kube_pod_status_scheduled gauge
kube_pod_status_scheduled{{namespace="{NS}",pod="a",condition="false"}} 0
kube_pod_status_scheduled{{namespace="{NS}",pod="b",condition="false"}} 1
# TYPE ml_train_steps_total counter
ml_train_steps_total{{namespace="{NS}",pod="a",job_name="{JOB}"}} 12
# TYPE ml_train_global_step gauge
ml_train_global_step{{namespace="{NS}",pod="a",job_name="{JOB}"}} 12
# TYPE ml_train_data_wait_seconds_sum counter
ml_train_data_wait_seconds_sum{{namespace="{NS}",pod="a",job_name="{JOB}"}} 1.5
# TYPE ml_train_checkpoint_stall_seconds_total counter
ml_train_checkpoint_stall_seconds_total{{namespace="{NS}",pod="a",job_name="{JOB}"}} 0.5
"""


@pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                    reason="Debian's prometheus package is not installed (.ci/run installs it)")
def test_the_dashboards_goodput_row_on_a_real_prometheus(tmp_path: Path) -> None:
    """A gang with one pod stepping (2 GPUs) and one waiting for a node (2 GPUs): the row's three queries, with the
    rules evaluated every 200 ms instead of every minute (the ratio does not depend on it)."""
    groups = goodput_rule_groups(NS)
    for group in groups:
        group["interval"] = "200ms"
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    grafana = {"$__rate_interval": "1m", "$__range": "5m", "$namespace": NS, "$job": ".*"}

    def query(server: Any, expr: str) -> dict[str, float]:
        for variable, value in grafana.items():
            expr = expr.replace(variable, value)
        result = server.query(expr)
        assert result["status"] == "success", (expr, result)
        return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result["data"]["result"]}

    panels = {panel.title: panel.queries[0][0] for panel in GOODPUT_PANELS}
    with static_exporter(STAND_INS) as port:
        targets = [{"job_name": "stand-ins", "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
        with prometheus(tmp_path / "prom", targets, [tmp_path / "rules.yml"]) as server:
            server.wait_for(f'count({TEAM_GOODPUT_GPUS})', lambda r: r and r[0]["value"][1] == "4")
            now = query(server, panels["GPUs by goodput bucket"])
            assert now == {'{"bucket": "productive"}': 2.0, '{"bucket": "capacity"}': 2.0,
                           '{"bucket": "data_wait"}': 0.0, '{"bucket": "checkpoint"}': 0.0}  # counters standing still
            assert query(server, panels["Goodput per Job over the dashboard's range"]) == {
                f'{{"job_name": "{JOB}"}}': 0.5}
            hours = query(server, panels["GPU-hours per team and bucket over the range"])
            assert set(hours) == {json.dumps({"bucket": b, "namespace": NS}, sort_keys=True)
                                  for b in ("productive", "capacity", "data_wait", "checkpoint")}
            assert hours[json.dumps({"bucket": "productive", "namespace": NS}, sort_keys=True)] > 0
