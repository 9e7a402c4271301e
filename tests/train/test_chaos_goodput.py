"""The chaos harness's goodput figures (benchmarks/chaos_goodput.py) over hand-made event streams: the buckets add
up to the wall time, lost steps are the ones after the checkpoint the next formation resumed from, and the
prediction is the stack's model (workloads/jobspec/goodput.py), synchronous or asynchronous as the events say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.chaos_goodput import BUCKETS, goodput_summary, goodput_table, measure
from workloads.jobspec.goodput import expected_goodput, goodput_terms


def _run(start: float, first_step: int, steps: int, resumed: int | None = None) -> list[tuple[float, dict[str, Any]]]:
    """One formation: model loaded at `start`, then `steps` steps of 0.5 s (0.1 s of it data wait) from
    `first_step` + 1, and a 0.2 s checkpoint after every third step."""
    events: list[tuple[float, dict[str, Any]]] = []
    if resumed is not None:
        events.append((start - 0.1, {"event": "resumed", "step": resumed}))
    events.append((start, {"event": "model_loading"}))
    at = start
    for step in range(first_step + 1, first_step + steps + 1):
        at += 0.5
        events.append((at, {"event": "batch", "step": step, "data_time": 0.1, "compute_time": 0.4}))
        if step % 3 == 0:
            at += 0.2
            events.append((at, {"event": "checkpoint", "step": step, "write_seconds": 0.2}))
    return events


def test_an_uninterrupted_run_is_startup_steps_checkpoints_and_tail() -> None:
    events = _run(2.0, 0, 6)  # steps end at 2 + 6 x 0.5 + 2 x 0.2 = 5.4
    measured = measure(events, wall_s=6.0)
    assert measured.buckets["startup"] == pytest.approx(2.0)
    assert measured.buckets["productive"] == pytest.approx(3.0)
    assert measured.buckets["checkpoint"] == pytest.approx(0.4)
    assert measured.buckets["tail"] == pytest.approx(0.6)  # the last step to the end, less the checkpoint after it
    assert measured.buckets["lost"] == 0 and measured.buckets["restart"] == 0
    assert sum(measured.buckets.values()) == pytest.approx(6.0)
    assert measured.goodput == pytest.approx(0.5)
    assert measured.window_goodput == pytest.approx(3.0 / 3.4)


def test_steps_after_the_resumed_checkpoint_are_lost_and_the_restart_is_timed() -> None:
    # formation 1 trains steps 1-5 (checkpoint at 3), is killed at 5.0; formation 2 resumes from step 3 at 9.0
    first = _run(2.0, 0, 5)
    second = _run(9.0, 3, 3, resumed=3)
    killed_at = first[-1][0] + 0.05
    first_after = second[2][0]  # the first batch after the resume
    measured = measure(first + second, wall_s=12.0, killed_at_s=killed_at, time_to_resume_s=first_after - killed_at)
    assert measured.buckets["lost"] == pytest.approx(2 * 0.5)  # steps 4 and 5
    assert measured.buckets["productive"] == pytest.approx(6 * 0.5)  # steps 1-3, then 4-6 again
    assert measured.buckets["restart"] == pytest.approx(first_after - killed_at - 0.5)
    assert measured.buckets["checkpoint"] == pytest.approx(2 * 0.2)  # at steps 3 and 6
    assert set(measured.buckets) == set(BUCKETS)
    assert sum(measured.buckets.values()) == pytest.approx(12.0)
    assert measured.buckets["other"] >= 0


def test_the_prediction_is_the_formula_and_sigterm_loses_a_checkpoint_not_half_an_interval() -> None:
    terms = goodput_terms(checkpoint_s=0.2, interval_s=1.5, restart_s=4.0)
    assert terms.first_order(12.0) == pytest.approx(1 - 0.2 / 1.5 - 0.75 / 12 - 4 / 12)
    assert terms.first_order(12.0) == expected_goodput(0.2, 1.5, 12.0, 4.0)  # the stack's prediction, the same terms
    assert terms.unexpanded(12.0) == pytest.approx(1 / (1 + 0.2 / 1.5 + (0.75 + 4) / 12))
    reference = measure(_run(2.0, 0, 24), wall_s=2.0 + 24 * 0.5 + 8 * 0.2 + 0.5)
    kill = measure(_run(2.0, 0, 5) + _run(9.0, 3, 21, resumed=3), wall_s=30.0, killed_at_s=4.6,
                   time_to_resume_s=5.0)
    summary = goodput_summary(reference, _run(2.0, 0, 24), [("SIGKILL", kill, 5.0), ("SIGTERM", kill, 5.0)], 3)
    # every input from the uninterrupted run: R is its start-up (2 s), not the trials' own restarts
    assert summary["inputs"] == {"checkpoint_s": pytest.approx(0.2), "stall_s": None, "interval_s": pytest.approx(1.5),
                                 "effective_interval_s": pytest.approx(1.5), "mtbf_s": pytest.approx(12.0),
                                 "restart_s": pytest.approx(2.0), "checkpoint_every": 3}
    assert summary["SIGKILL"]["predicted"] == pytest.approx(1 / (1 + 0.2 / 1.5 + (0.75 + 2.0) / 12))
    assert summary["SIGTERM"]["predicted"] == pytest.approx(1 / (1 + 0.2 / 1.5 + (0.2 + 2.0) / 12))
    assert summary["SIGKILL"]["predicted_terms_s"] == {"restart": 2.0, "lost": 0.75, "checkpoint": pytest.approx(1.6)}
    assert summary["SIGKILL"]["measured_goodput"] == pytest.approx(kill.goodput)
    lines = goodput_table(summary)
    assert lines[1].split()[:3] == ["kill", "trials", "restart"] and lines[4].startswith("SIGKILL")


def _asynchronous(events: list[tuple[float, dict[str, Any]]], write_s: float, script: bool) -> None:
    """The checkpoints of `events` as asynchronous saves that blocked the loop 0.2 s and wrote for `write_s` in the
    background: the trainer's event (blocked_seconds, write_seconds) or a StepReport script's (its `saving` block,
    then a "checkpoint_written" event)."""
    for index, (at, event) in enumerate(list(events)):
        if event["event"] != "checkpoint":
            continue
        if script:
            event.update(stall_seconds=0.2)
            events.insert(index + 1, (at, {"event": "checkpoint_written", "step": event["step"],
                                           "write_seconds": write_s - 0.5, "mirror_seconds": 0.5}))
        else:
            event.update(stall_seconds=0.05, blocked_seconds=0.2, write_seconds=write_s, mirror_seconds=None)


@pytest.mark.parametrize("script", [False, True])
def test_an_asynchronous_save_is_predicted_with_the_stack_model_in_flight_write_and_skips(script: bool) -> None:
    """Sharded saves: the loop blocked 0.2 s a save, the write 2.0 s in the background: a save can start only every
    ceil(2.0 / 1.5) = 2 intervals (3.0 s), and a lost node loses half of that plus the save in flight (1.5 + 2.0 s)."""
    reference_events = _run(2.0, 0, 24)
    _asynchronous(reference_events, 2.0, script)
    reference = measure(reference_events, wall_s=2.0 + 24 * 0.5 + 8 * 0.2 + 0.5)
    kill = measure(_run(2.0, 0, 5) + _run(9.0, 3, 21, resumed=3), wall_s=30.0, killed_at_s=4.6, time_to_resume_s=5.0)
    summary = goodput_summary(reference, reference_events, [("SIGKILL", kill, 5.0), ("SIGTERM", kill, 5.0)], 3)
    inputs = summary["inputs"]
    assert (inputs["checkpoint_s"], inputs["stall_s"]) == (pytest.approx(2.0), pytest.approx(0.2))
    assert inputs["effective_interval_s"] == pytest.approx(3.0)
    assert summary["SIGKILL"]["predicted_terms_s"] == {"restart": 2.0, "lost": pytest.approx(3.5),
                                                      "checkpoint": pytest.approx(12.0 / 3.0 * 0.2)}
    assert summary["SIGKILL"]["predicted"] == pytest.approx(1 / (1 + 0.2 / 3.0 + (3.5 + 2.0) / 12))
    assert summary["SIGKILL"]["predicted_first_order"] == pytest.approx(1 - 0.2 / 3.0 - 3.5 / 12 - 2.0 / 12)
    # an orderly stop loses no step and waits for one last whole save: its stall a checkpoint, the rest of its
    # write before the restart
    assert summary["SIGTERM"]["predicted_terms_s"] == {"restart": pytest.approx(3.8), "lost": 0.0,
                                                      "checkpoint": pytest.approx(12.0 / 3.0 * 0.2 + 0.2)}
    assert summary["SIGTERM"]["predicted"] == pytest.approx(1 / (1 + 0.2 / 3.0 + (2.0 + 2.0) / 12))
    assert "in the background, stall 0.200 s, saves every 3.000 s" in goodput_table(summary)[0]


def test_a_checkpoint_counts_the_whole_time_the_loop_was_blocked() -> None:
    # the trainer's event: staging 0.05 s, but its save call blocked 0.3 s (waiting for the previous save first)
    events = [(1.0, {"event": "model_loading"}), (1.5, {"event": "batch", "step": 1, "data_time": 0.1,
                                                       "compute_time": 0.4}),
              (1.8, {"event": "checkpoint", "step": 1, "stall_seconds": 0.05, "blocked_seconds": 0.3,
                     "write_seconds": 0.9}),
              (2.3, {"event": "batch", "step": 2, "data_time": 0.1, "compute_time": 0.4})]
    assert measure(events, wall_s=2.3).buckets["checkpoint"] == pytest.approx(0.3)
    assert measure(events, wall_s=2.3).buckets["other"] == pytest.approx(0.0)
    # an older trainer's (or a StepReport's) event without it: its stall; a synchronous writer's: its write
    del events[2][1]["blocked_seconds"]
    assert measure(events, wall_s=2.3).buckets["checkpoint"] == pytest.approx(0.05)
    del events[2][1]["stall_seconds"]
    assert measure(events, wall_s=2.3).buckets["checkpoint"] == pytest.approx(0.9)


def test_the_cli_sums_up_the_trials_a_run_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/chaos_gang.py --summarize WORKDIR: the goodput table of the outcomes an earlier --workdir kept (no
    trials run), as the run printed it; a file that is no outcome is one line and exit 2."""
    from dataclasses import asdict

    from benchmarks.chaos_gang import Outcome
    from scripts.chaos_gang import main

    straight = Outcome(ok=True, seconds=2.0 + 24 * 0.5 + 8 * 0.2 + 0.5, events=_run(2.0, 0, 24))
    kill = Outcome(ok=True, kill="SIGKILL", seconds=30.0, killed_at_s=4.6, time_to_resume_s=5.0,
                   events=_run(2.0, 0, 5) + _run(9.0, 3, 21, resumed=3))
    for name, outcome in (("straight", straight), ("trial000", kill)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "outcome.json").write_text(json.dumps(asdict(outcome)))
    assert main(["--summarize", str(tmp_path), "--checkpoint-every", "3"]) == 0
    reference = measure(straight.events, straight.seconds)
    trial = measure(kill.events, kill.seconds, kill.killed_at_s, kill.time_to_resume_s)
    expected = goodput_table(goodput_summary(reference, straight.events, [("SIGKILL", trial, 5.0)], 3))
    assert capsys.readouterr().out.splitlines() == expected
    (tmp_path / "trial001").mkdir()
    (tmp_path / "trial001" / "outcome.json").write_text("{}")
    with pytest.raises(SystemExit) as exited:
        main(["--summarize", str(tmp_path)])
    [line] = capsys.readouterr().err.splitlines()
    assert exited.value.code == 2 and line.startswith(f"error: --summarize: {tmp_path / 'trial001' / 'outcome.json'}: ")
