"""Predicted goodput of a stack's training Jobs at plan time, read from the plan: the stack exports each Job's model
inputs as the `jobGoodput` output (infra/stack.py, from workloads.jobspec.prediction: every controller kind), and
this module predicts, prints and compares them. The model and its sources: workloads/jobspec/goodput.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workloads.jobspec.goodput import (
    DEFAULT_STEP_S,
    FAR_FACTOR,
    Prediction,
    far_note,
    inputs_from_dict,
    predict,
    prediction_line,
)
from workloads.jobspec.prediction import GOODPUT_OUTPUT

Predictions = list[tuple[str, Prediction | None, str]]


def job_predictions(plan: Mapping[str, Any]) -> Predictions:
    """(Job name, prediction or None, where it runs or why not) for each Job in the plan's `jobGoodput` output (a plan
    written before it has none)."""
    output = (plan.get("outputs") or {}).get(GOODPUT_OUTPUT) or {}
    found: Predictions = []
    if not isinstance(output, dict):
        return found
    for name, entry in output.items():
        if not isinstance(entry, dict) or "inputs" not in entry:
            reason = entry.get("reason") if isinstance(entry, dict) else None
            found.append((str(name), None, str(reason or "no goodput inputs in the plan")))
            continue
        try:
            found.append((str(name), predict(inputs_from_dict(entry["inputs"])), str(entry.get("where", ""))))
        except ValueError as exc:
            found.append((str(name), None, f"goodput inputs: {exc}"))
    return found


def goodput_lines(predictions: Predictions) -> list[str]:
    """The plan summary's section: per Job, predicted goodput, the chosen and the optimal checkpoint interval."""
    if not predictions:
        return []
    lines = ["", f"predicted goodput (Young/Daly; step time {DEFAULT_STEP_S:g} s assumed where goodput.stepSeconds "
                 "is unset; docs/monitoring.md):"]
    for name, prediction, where in predictions:
        lines.append(f"  {name}: not predicted: {where}" if prediction is None
                     else f"  {prediction_line(name, prediction, where)}")
    return lines


def goodput_notes(predictions: Predictions, factor: float = FAR_FACTOR) -> list[str]:
    """A note per Job whose chosen checkpoint interval is more than `factor` times away from the optimum."""
    return [note for name, prediction, _ in predictions
            if prediction is not None and (note := far_note(name, prediction, factor)) is not None]


def goodput_diff_lines(old: Predictions, new: Predictions) -> list[str]:
    """Per Job, base -> head predicted goodput (the pull-request comment's section); unchanged Jobs included."""
    before = {name: prediction for name, prediction, _ in old}
    lines = []
    for name, prediction, where in new:
        head = "-" if prediction is None else f"{prediction.goodput:.2%}"
        base_prediction = before.get(name)
        base = "-" if base_prediction is None else f"{base_prediction.goodput:.2%}"
        change = ""
        if prediction is not None and base_prediction is not None:
            change = f" ({(prediction.goodput - base_prediction.goodput) * 100:+.2f} points)"
        sign = " "  # a diff block colours a lower prediction red, a higher one green
        if prediction is not None and base_prediction is not None and base != head:
            sign = "-" if prediction.goodput < base_prediction.goodput else "+"
        detail = where if prediction is None else (f"optimum interval {prediction.optimal_interval_s:.0f} s, chosen "
                                                    f"{prediction.inputs.interval_s:.0f} s")
        lines.append(f"{sign} {name}: predicted goodput {base} -> {head}{change}; {detail}")
    for name in before.keys() - {name for name, _, _ in new}:
        lines.append(f"- {name}: removed")
    return lines
