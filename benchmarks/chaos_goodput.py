"""Measured against predicted goodput for the chaos harness's trials (benchmarks/chaos_gang.py).

Measured, per trial, from what the run recorded: rank 0's JSON events (each `batch` with its data and compute time,
each `checkpoint` with its write time, `resumed` with the step a formation started from), timed when the harness
read them, and the harness's own clock (start, the kill, the end). The trial's wall time is split into

    startup     from the start to the first step (two torchrun agents, rendezvous, data, model)
    productive  the steps that count (the harness's per-step sleep stands for compute, so a step's whole time counts)
    lost        steps trained and then discarded: after the checkpoint the next formation resumed from
    checkpoint  rank 0's checkpoint writes (the gang waits for them)
    restart     from the kill to the start of the first step after the resume
    tail        from the last step to the end (the last epoch line, process exit), its checkpoint write excepted
    other       the rest: epoch boundaries, the gap between a step and the kill, event transport

Predicted with the stack's model (workloads/jobspec/goodput.py, goodput_terms: Young 1974, Daly 2006), every input
from the uninterrupted run: tau = --checkpoint-every x its mean step time, M = its productive time (the harness kills
once per trial), R = its start-up (a restart is a fresh start of both nodes plus a checkpoint load). A synchronous
writer (a StepReport `saving` block and nothing else) blocks the loop for delta = its mean save, and a failure loses
tau/2. An asynchronous sharded save (the trainer's "checkpoint" events with blocked_seconds, a StepReport script's
"checkpoint_written" events) blocks only for its stall s (the mean blocked time) while the write, delta (the mean
write and mirror time), runs beside the next steps: saves start every tau_e = tau x ceil(delta / tau) (skipped while
one is in flight) and a failure loses tau_e/2 + delta (the save in flight counts for nothing). SIGTERM (an orderly
stop) loses no steps but writes one last whole save (delta). The first-order formula 1 - s/tau_e - lost/M - R/M is for
delta << tau << M; here M is seconds, not days, and R is larger than M, so the table also gives the same terms
without the first-order expansion, 1 / (1 + s/tau_e + (lost + R)/M). Both are compared with the measured goodput of
the model's window (startup and tail excluded: the model has no term for them).

Pure functions over recorded numbers; no torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from workloads.jobspec.goodput import goodput_terms

BUCKETS = ("startup", "productive", "lost", "checkpoint", "restart", "tail", "other")


@dataclass(frozen=True)
class Measured:
    wall_s: float
    buckets: dict[str, float]  # seconds per BUCKETS entry; they add up to wall_s

    @property
    def goodput(self) -> float:
        return self.buckets["productive"] / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def window_s(self) -> float:
        """The model's window: the wall time less start-up and tail."""
        return self.wall_s - self.buckets["startup"] - self.buckets["tail"]

    @property
    def window_goodput(self) -> float:
        return self.buckets["productive"] / self.window_s if self.window_s > 0 else 0.0


def _steps(events: Sequence[tuple[float, dict[str, Any]]]) -> list[tuple[float, int, float, int]]:
    """(arrival, step, step seconds, formation) of every batch event; a formation starts at each model_loading."""
    out, formation = [], 0
    for at, event in events:
        name = event.get("event")
        if name == "model_loading":
            formation += 1
        elif name == "batch":
            seconds = float(event.get("data_time") or 0.0) + float(event.get("compute_time") or 0.0)
            out.append((at, int(event["step"]), seconds, formation))
    return out


def measure(events: Sequence[tuple[float, dict[str, Any]]], wall_s: float, killed_at_s: float | None = None,
            time_to_resume_s: float | None = None) -> Measured:
    """The buckets of one run: `events` as (seconds since the run started, event), `killed_at_s` since the start."""
    steps = _steps(events)
    # the step each formation started from: its `resumed` event comes before its model_loading (0: a fresh start)
    resumed_from: dict[int, int] = {}
    formation, pending = 0, 0
    for _, event in events:
        if event.get("event") == "resumed":
            pending = int(event["step"])
        elif event.get("event") == "model_loading":
            formation += 1
            resumed_from[formation], pending = pending, 0
    buckets = dict.fromkeys(BUCKETS, 0.0)
    if not steps:
        buckets["startup"] = wall_s
        return Measured(wall_s, buckets)
    first_at, _, first_s, _ = steps[0]
    buckets["startup"] = max(0.0, first_at - first_s)
    for _at, step, seconds, formed in steps:
        # a step after the checkpoint the next formation resumed from was lost with its formation
        kept = formed + 1 not in resumed_from or step <= resumed_from[formed + 1]
        buckets["productive" if kept else "lost"] += seconds
    buckets["checkpoint"] = sum(_blocked(event) for _, event in events
                                if event.get("event") == "checkpoint")
    if killed_at_s is not None and time_to_resume_s is not None:
        resumed_step = next((seconds for at, _, seconds, _ in steps if at >= killed_at_s + time_to_resume_s - 1e-6),
                            0.0)
        buckets["restart"] = max(0.0, time_to_resume_s - resumed_step)
    after_last = sum(_blocked(event) for at, event in events
                     if event.get("event") == "checkpoint" and at > steps[-1][0])  # counted as checkpoint already
    buckets["tail"] = max(0.0, wall_s - steps[-1][0] - after_last)
    buckets["other"] = wall_s - sum(value for name, value in buckets.items() if name != "other")
    return Measured(wall_s, buckets)


def _blocked(event: dict[str, Any]) -> float:
    """The seconds a "checkpoint" event's save blocked the loop: blocked_seconds (the trainer's whole save call: the
    wait for the previous save, then staging), else stall_seconds (staging alone: the write and the copy run beside
    the next steps; a StepReport's is the whole save), else write_seconds (a synchronous writer)."""
    for key in ("blocked_seconds", "stall_seconds", "write_seconds"):
        if event.get(key) is not None:
            return float(event[key])
    return 0.0


def _writes(events: Sequence[tuple[float, dict[str, Any]]]) -> list[float]:
    """The background write (and mirror) time of each asynchronous save: the trainer's "checkpoint" events (those with
    blocked_seconds, reported when the save is complete) and a StepReport's "checkpoint_written" events. None for a
    synchronous writer (its whole save is the blocked time)."""
    out = []
    for _, event in events:
        name = event.get("event")
        if (name == "checkpoint" and event.get("blocked_seconds") is not None) or name == "checkpoint_written":
            out.append(float(event.get("write_seconds") or 0.0) + float(event.get("mirror_seconds") or 0.0))
    return out


def reference_inputs(reference: Measured, events: Sequence[tuple[float, dict[str, Any]]],
                     checkpoint_every: int) -> dict[str, Any]:
    """The model's inputs, all from the uninterrupted run: delta its mean checkpoint write (asynchronous: the
    background write; stall_s then the mean time a save blocked the loop; synchronous: the blocked time, stall_s
    None), tau checkpoint_every x its mean step, M its productive time (the harness kills once per trial), R its
    start-up (a restart is a fresh start of the gang plus a checkpoint load: the plan's cold-start figure, not the
    trials' own restarts)."""
    steps = _steps(events)
    blocked = [_blocked(event) for _, event in events if event.get("event") == "checkpoint"]
    writes = _writes(events)
    step_s = statistics.fmean(seconds for _, _, seconds, _ in steps) if steps else 0.0
    mean_blocked = statistics.fmean(blocked) if blocked else 0.0
    return {"checkpoint_s": statistics.fmean(writes) if writes else mean_blocked,
            "stall_s": mean_blocked if writes else None, "interval_s": checkpoint_every * step_s,
            "mtbf_s": reference.buckets["productive"], "restart_s": reference.buckets["startup"],
            "checkpoint_every": checkpoint_every}


def goodput_summary(reference: Measured, reference_events: Sequence[tuple[float, dict[str, Any]]],
                    trials: Sequence[tuple[str, Measured, float | None]], checkpoint_every: int) -> dict[str, Any]:
    """Per kill kind: the measured buckets (means) and goodput, and the model's prediction term by term (the stack's
    goodput_terms; SIGTERM an orderly stop). `trials` holds (kill kind, measured, time to resume)."""
    inputs = reference_inputs(reference, reference_events, checkpoint_every)
    delta, tau, mtbf, restart, stall = (inputs["checkpoint_s"], inputs["interval_s"], inputs["mtbf_s"],
                                        inputs["restart_s"], inputs["stall_s"])
    out: dict[str, Any] = {"inputs": inputs,
                           "uninterrupted": {"goodput": reference.goodput, "window_goodput": reference.window_goodput,
                                             "buckets": reference.buckets}}
    if not tau > 0:
        return out
    inputs["effective_interval_s"] = goodput_terms(delta, tau, restart, stall).interval_s
    for kind in sorted({kind for kind, _, _ in trials}):
        measured = [m for k, m, _ in trials if k == kind]
        orderly = kind == "SIGTERM"  # no steps lost, one more whole save written
        terms = goodput_terms(delta, tau, restart, stall, orderly=orderly)
        out[kind] = {
            "trials": len(measured),
            "buckets_mean_s": {name: statistics.fmean(m.buckets[name] for m in measured) for name in BUCKETS},
            "measured_goodput": statistics.fmean(m.goodput for m in measured),
            "measured_window_goodput": statistics.fmean(m.window_goodput for m in measured),
            # an orderly stop's last save: its block is one more checkpoint, the wait for the rest of its write
            # (asynchronous) comes before the restart, in the harness's restart bucket
            "predicted_terms_s": {"restart": restart + (terms.lost_s - terms.blocked_s if orderly else 0.0),
                                  "lost": 0.0 if orderly else terms.lost_s,
                                  "checkpoint": mtbf / terms.interval_s * terms.blocked_s
                                  + (terms.blocked_s if orderly else 0.0)},
            "predicted_first_order": terms.first_order(mtbf),
            "predicted": terms.unexpanded(mtbf),
        }
    return out


KINDS = ("SIGKILL", "SIGTERM", "DROP")  # the harness's kills, in the order its summaries list them


def kind_rows(summary: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(kind, row) for each kill a summary (the harness's or its goodput's) has trials of, in KINDS' order."""
    for kind in KINDS:
        row = summary.get(kind)
        if row:
            yield kind, row


def goodput_table(summary: dict[str, Any]) -> list[str]:
    """The table scripts/chaos_gang.py --goodput prints: each term measured / predicted (seconds, trial means), then
    goodput over the model's window measured / predicted (and the first-order formula's), and over the whole trial."""
    inputs = summary["inputs"]
    stall = inputs.get("stall_s")
    saves = (f"checkpoint {inputs['checkpoint_s']:.3f} s" if stall is None else
             f"checkpoint {inputs['checkpoint_s']:.3f} s in the background, stall {stall:.3f} s, saves every "
             f"{inputs.get('effective_interval_s', inputs['interval_s']):.3f} s")
    lines = [f"goodput model inputs, from the uninterrupted run: {saves}, interval "
             f"{inputs['interval_s']:.3f} s = {inputs['checkpoint_every']} steps, M {inputs['mtbf_s']:.2f} s of "
             f"productive time per failure (one kill per trial), R {inputs['restart_s']:.2f} s (its start-up)",
             f"{'kill':8} {'trials':>6} {'restart s':>13} {'lost s':>11} {'checkpoint s':>13} {'goodput':>15} "
             f"{'1st order':>9} {'whole run':>9}",
             f"{'':8} {'':>6} {'meas / pred':>13} {'meas / pred':>11} {'meas / pred':>13} {'meas / pred':>15}"]
    uninterrupted = summary["uninterrupted"]
    none, writes = 0.0, 0.0
    if inputs["interval_s"]:
        terms = goodput_terms(inputs["checkpoint_s"], inputs["interval_s"], inputs["restart_s"], stall)
        none, writes = terms.unexpanded(math.inf), inputs["mtbf_s"] / terms.interval_s * terms.blocked_s
    lines.append(f"{'none':8} {1:6d} {'-':>13} {'-':>11} {uninterrupted['buckets']['checkpoint']:5.2f} / {writes:5.2f} "
                 f"{uninterrupted['window_goodput']:6.1%} / {none:6.1%} {'-':>9} {uninterrupted['goodput']:9.1%}")
    for kind, row in kind_rows(summary):
        b, p = row["buckets_mean_s"], row["predicted_terms_s"]
        lines.append(f"{kind:8} {row['trials']:6d} {b['restart']:5.2f} / {p['restart']:5.2f} "
                     f"{b['lost']:4.2f} / {p['lost']:4.2f} {b['checkpoint']:5.2f} / {p['checkpoint']:5.2f} "
                     f"{row['measured_window_goodput']:6.1%} / {row['predicted']:6.1%} "
                     f"{row['predicted_first_order']:9.1%} {row['measured_goodput']:9.1%}")
    return lines


def trials_goodput(straight: Any, outcomes: Sequence[Any], checkpoint_every: int) -> dict[str, Any] | None:
    """goodput_summary over the harness's Outcomes (events, seconds, killed_at_s, time_to_resume_s, kill); None when
    the run reported no steps (a script without the trainer's events)."""
    reference = measure(straight.events, straight.seconds)
    if reference.buckets["productive"] <= 0:
        return None
    trials = [(o.kill, measure(o.events, o.seconds, o.killed_at_s, o.time_to_resume_s), o.time_to_resume_s)
              for o in outcomes if o.kill is not None and o.ok]
    return goodput_summary(reference, straight.events, trials, checkpoint_every)
