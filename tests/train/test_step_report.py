"""StepReport, the one line per step a user's loop gives measured goodput: the bundled trainer's events and metrics,
timed on a fake clock (no sleeps)."""

from __future__ import annotations

import io
import json
import socket
import urllib.request
from collections.abc import Iterator
from contextlib import redirect_stdout

import pytest

from workloads.data.api import StepReport
from workloads.train import steps


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _events(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def test_steps_split_the_wait_for_data_from_compute_and_a_save_belongs_to_no_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(steps.time, "perf_counter", clock)
    monkeypatch.delenv("METRICS_PORT", raising=False)

    def batches() -> Iterator[int]:
        for n in range(3):
            clock.now += 0.5 + n  # the loader takes 0.5, 1.5, 2.5 s for batch n
            yield n

    out = io.StringIO()
    with redirect_stdout(out):
        report = StepReport(rank=0)
        clock.now += 30  # set-up before the loop: no step's
        step = 4  # resumed at step 4
        for _ in report.timed(batches(), epoch=2):
            clock.now += 2.0  # compute
            step += 1
            report.step(step, samples=8, loss=0.25)
            if step == 5:
                with report.saving(step):
                    clock.now += 7.0
    first, *rest = _events(out.getvalue())
    assert first["event"] == "first_step" and first["step"] == 5
    batch = [e for e in rest if e["event"] == "batch"]
    assert [(e["step"], e["epoch"], e["samples"], e["loss"]) for e in batch] == [(5, 2, 8, 0.25), (6, 2, 8, 0.25),
                                                                                  (7, 2, 8, 0.25)]
    assert [(e["data_time"], e["compute_time"]) for e in batch] == [(0.5, 2.0), (1.5, 2.0), (2.5, 2.0)]
    (saved,) = [e for e in rest if e["event"] == "checkpoint"]
    assert saved == {"event": "checkpoint", "step": 5, "stall_seconds": 7.0, "write_seconds": 7.0}


def test_only_rank_0_prints_and_every_rank_serves_the_goodput_series(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = io.StringIO()
    with redirect_stdout(out):
        report = StepReport(rank=1, local_rank=0, metrics_port=port)
        try:
            for _ in report.timed([1, 2]):
                report.step(10, samples=4, loss=1.0)
            with report.saving(10):
                pass
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        finally:
            report.close()
    assert out.getvalue() == ""
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
    assert values["ml_train_steps_total"] == 2 and values["ml_train_samples_total"] == 8
    assert values["ml_train_global_step"] == 10 and values["ml_train_rank"] == 1
    assert values["ml_train_step_seconds_count"] == 2 and "ml_train_checkpoint_stall_seconds_total" in values


def test_a_bad_metrics_port_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METRICS_PORT", "ninety")
    with pytest.raises(ValueError, match="^METRICS_PORT: not a port number: 'ninety'$"):
        StepReport()


def test_a_loop_left_early_closes_the_batches() -> None:
    closed = []

    def batches() -> Iterator[int]:
        try:
            yield from range(5)
        finally:
            closed.append(True)

    with redirect_stdout(io.StringIO()):
        report = StepReport(rank=0, metrics_port=0)
        inner = batches()  # still referenced here: only the wrapper can close it now
        timed = report.timed(inner)
        for n in timed:
            if n == 1:
                break
        timed.close()
        assert closed == [True]
    assert inner.gi_frame is None


def test_a_save_begun_in_a_hook_ends_when_the_loop_asks_for_its_next_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """save_started from a framework's hook (Lightning's on_save_checkpoint runs after the step's end hook): the
    save's time runs to the loop's next request for a batch, or to save_done at the end; it belongs to no step."""
    clock = Clock()
    monkeypatch.setattr(steps.time, "perf_counter", clock)
    monkeypatch.delenv("METRICS_PORT", raising=False)

    def batches() -> Iterator[int]:
        for n in range(3):
            clock.now += 1.0  # the loader
            yield n

    out = io.StringIO()
    with redirect_stdout(out):
        report = StepReport(rank=0)
        for n in report.timed(batches(), epoch=0):
            clock.now += 2.0  # compute
            report.step(n + 1, samples=4)
            if n in (0, 2):  # a save after step 1 (ended by the request for batch 1) and after the last step
                clock.now += 0.25  # the framework's own work before its hook
                report.save_started(n + 1)
                clock.now += 5.0
        report.save_done()  # the end of training: the last step's save is over
        report.save_done()  # nothing open: no event
    events = _events(out.getvalue())
    batch = [(e["step"], e["data_time"], e["compute_time"]) for e in events if e["event"] == "batch"]
    # step 2 starts when step 1's save ended (the 0.25 s between a step and its save, as before a `saving` block,
    # is no step's and no save's)
    assert batch == [(1, 1.0, 2.0), (2, 1.0, 2.0), (3, 1.0, 2.0)]
    saves = [(e["step"], e["stall_seconds"]) for e in events if e["event"] == "checkpoint"]
    assert saves == [(1, 5.0), (3, 5.0)]
