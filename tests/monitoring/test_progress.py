"""`submit status|watch`: progress from the pods' metrics pages (real exposition from the trainer's and stager's
metric classes), through a fake pod proxy; no cluster."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest

from tests.jobs.test_submit import JOB, RUNNING, FakeBatch, condition, container_status, job, pod, terminated
from workloads.data.moving.metrics import StageMetrics
from workloads.progress import MetricsParseError, parse_metrics, progress, progress_line, snapshot
from workloads.submit.observe import MAX_METRICS_PAGE_BYTES, metrics_endpoints, metrics_pages, watch_run
from workloads.train.metrics import RunShape, TrainMetrics


def _trainer(rank: int, steps: int, wait: float = 0.1, compute: float = 0.4, start: float = 1000.0) -> TrainMetrics:
    """A rank 0-based epoch 1 of 2, 10 batches per epoch, `steps` steps into epoch 1 (after a full epoch 0)."""
    metrics = TrainMetrics()
    metrics.started(RunShape(epochs=2, batches_per_epoch=10, batch_size=32, world_size=2, rank=rank))
    metrics.start_time.set(start)
    for _ in range(10):
        metrics.step(wait, compute, 32, 2.0)
    metrics.epoch_started(1, 0)
    for _ in range(steps):
        metrics.step(wait, compute, 32, 1.5)
    return metrics


def _page(metrics: TrainMetrics | StageMetrics) -> str:
    return generate_latest(metrics.registry).decode()


def _stager(ready: int) -> StageMetrics:
    stage = StageMetrics()
    stage.dataset(shards=8, total_bytes=8 << 20, budget_bytes=None)
    stage.state(ready=ready, held_bytes=ready << 20, done=ready == 8)
    return stage


def test_one_snapshot_gives_lifetime_figures_from_the_slowest_rank() -> None:
    pages = [parse_metrics(_page(_trainer(0, 5))), parse_metrics(_page(_trainer(1, 4))),
             parse_metrics(_page(_stager(8)))]
    now = snapshot(pages, at=1000.0 + 30.0)
    figures = progress(now)
    assert (figures.epoch, figures.epochs, figures.batch, figures.batches) == (2, 2, 4, 10)  # rank 1 is behind
    assert figures.fraction == pytest.approx(14 / 20)
    assert figures.samples_per_s == pytest.approx((15 + 14) * 32 / 30)  # both ranks' samples over 30 s
    assert figures.data_wait_share == pytest.approx(0.2)  # 0.1 s of every 0.5 s step
    assert figures.eta_s == pytest.approx(6 / (14 / 30))  # 6 steps left at the slowest rank's pace
    assert figures.staged == "8/8 shards"


def test_two_snapshots_give_rates_over_the_interval_and_a_restart_falls_back() -> None:
    before = snapshot([parse_metrics(_page(_trainer(0, 2, wait=0.1)))], at=1010.0)
    now = snapshot([parse_metrics(_page(_trainer(0, 6, wait=0.4, compute=0.1)))], at=1020.0)
    figures = progress(now, before)
    assert figures.samples_per_s == pytest.approx(4 * 32 / 10)  # 4 more steps of 32 in 10 s
    restarted = snapshot([parse_metrics(_page(_trainer(0, 1)))], at=1030.0)
    assert progress(restarted, now).samples_per_s == pytest.approx(11 * 32 / 30)  # counters went back: lifetime


def test_a_page_that_is_not_metrics_is_refused() -> None:
    with pytest.raises(MetricsParseError):
        parse_metrics("<html>502 Bad Gateway</html>\n{")


def test_nan_and_infinite_samples_are_left_out_of_the_figures() -> None:
    page = "ml_pack_images_total 5\nml_pack_shards_done +Inf\nml_pack_shards NaN\nml_train_epochs +Inf\n"
    assert parse_metrics(page) == {"ml_pack_images_total": 5.0}
    assert progress_line("pack-x", "Running", progress(snapshot([parse_metrics(page)], at=1.0))) == \
        "pack-x  Running  packed 0/0 shards of the running slices"


def test_progress_line() -> None:
    figures = progress(snapshot([parse_metrics(_page(_trainer(0, 5)))], at=1030.0))
    line = progress_line(JOB, "Running", figures)
    assert line == f"{JOB}  Running  epoch 2/2 batch 5/10 (75%)  16 samples/s  data-wait 20%  ETA 0m10s"


class FakeCore:
    """list pods and the pod proxy, from a script of (pods, {endpoint: page}) per poll."""

    def __init__(self, polls: list[tuple[list[dict[str, Any]], dict[str, str]]]) -> None:
        self.polls, self.poll = polls, 0

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        pods, _ = self.polls[min(self.poll, len(self.polls) - 1)]
        return SimpleNamespace(items=pods)

    def connect_get_namespaced_pod_proxy_with_path(self, name: str, namespace: str, path: str,
                                                   _preload_content: bool = True) -> Any:
        from kubernetes.client.exceptions import ApiException

        _, pages = self.polls[min(self.poll, len(self.polls) - 1)]
        if name not in pages:
            raise ApiException(status=503, reason="Service Unavailable")
        return pages[name] if _preload_content else _Response(pages[name].encode())


class _Response:
    """What the client returns with _preload_content=False (a urllib3 response): read(amt), release_conn()."""

    def __init__(self, body: bytes) -> None:
        self.body, self.released = body, False

    def read(self, amt: int) -> bytes:
        return self.body[:amt]

    def release_conn(self) -> None:
        self.released = True


def _running_pod() -> dict[str, Any]:
    body = pod("x7k2p", "Running", init=[container_status("stage", terminated(0, "Completed"))],
               containers=[container_status("train", RUNNING)])
    body["spec"]["initContainers"][0]["ports"] = [{"name": "metrics-stage", "containerPort": 9449}]
    body["spec"]["containers"][0]["ports"] = [{"name": "metrics-r0", "containerPort": 9450}]
    return body


def test_watch_prints_a_line_per_poll_until_the_run_ends(capsys: pytest.CaptureFixture[str]) -> None:
    running = _running_pod()
    assert metrics_endpoints(running) == [f"{JOB}-x7k2p:9449", f"{JOB}-x7k2p:9450"]
    endpoint = f"{JOB}-x7k2p:9450"
    core = FakeCore([([running], {endpoint: _page(_trainer(0, 2))}),
                     ([running], {endpoint: _page(_trainer(0, 6))}),
                     ([], {})])
    jobs = [job(), job(), job(condition("Complete", "Completed"), succeeded=1)]
    batch = FakeBatch(jobs[0])
    clock = iter([1010.0, 1020.0, 1030.0])

    def sleep(seconds: float) -> None:
        core.poll += 1
        batch.body = jobs[core.poll]

    assert watch_run(batch, core, "training", JOB, 10.0, clock=lambda: next(clock), sleep=sleep) == 0
    out = capsys.readouterr().out.splitlines()
    print("\n".join(out))
    # Each poll prints its progress line, then the run's goodput line (nothing measured or predicted here).
    lines = [line for line in out if not line.lstrip().startswith("goodput:")]
    assert [line.strip() for line in out if line not in lines] == ["goodput: not measured yet; not predicted "
                                                                   "(no annotation)"] * 3
    # First poll: lifetime figures (12 steps in the 10 s since the start, 8 to go); then the last interval's
    # (4 steps of 32 samples in 10 s, 4 to go).
    assert lines[0] == f"{JOB}  Running  epoch 2/2 batch 2/10 (60%)  38 samples/s  data-wait 20%  ETA 0m07s  " \
                       "1 pod(s) running"
    assert lines[1] == f"{JOB}  Running  epoch 2/2 batch 6/10 (80%)  13 samples/s  data-wait 20%  ETA 0m10s  " \
                       "1 pod(s) running"
    assert lines[2].startswith(f"{JOB}  Succeeded")


def test_a_metrics_page_larger_than_the_cap_is_skipped_not_held() -> None:
    running = _running_pod()
    stage, train = metrics_endpoints(running)
    big = "ml_train_steps_total 1\n" + "# padding\n" * (MAX_METRICS_PAGE_BYTES // 10 + 1)
    core = FakeCore([([running], {stage: big, train: _page(_trainer(0, 2))})])
    pages = metrics_pages(core, "training", [running])
    assert len(pages) == 1 and pages[0]["ml_train_steps_total"] == 12  # the trainer's page only
