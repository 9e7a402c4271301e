"""Predicted goodput (infra.plan.goodput): the Young/Daly formula, the prod Jobs' prediction, the far-interval note."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from infra.config.schema import parse_stack_config
from infra.plan.engine import load_stack_file
from infra.plan.goodput import goodput_diff_lines, goodput_notes, job_predictions
from infra.plan.view import summary
from workloads.cluster_facts import facts_from_dict, facts_to_dict
from workloads.goodput_status import predicted as status_prediction
from workloads.jobspec.goodput import (
    LLAMA3_PER_1000_GPU_DAYS,
    RESTART_S,
    SPOT_RECLAIMS_PER_NODE_MONTH,
    STAGING_BYTES_PER_S,
    GoodputInputs,
    inputs_from_dict,
    inputs_to_dict,
    predict,
    prediction_line,
)
from workloads.jobspec.prediction import spec_goodput_inputs
from workloads.submit.cli import main as submit_main

DAY = 86400.0


def test_formula_matches_a_hand_computation() -> None:
    # 16 GPUs on 2 nodes, 1 interruption per 1000 GPU-days: 0.016 failures/day, M = 62.5 days = 5,400,000 s.
    inputs = GoodputInputs(nodes=2, gpus=16, interruptions_per_1000_gpu_days=1.0, spot_reclaims_per_node_month=0.0,
                           checkpoint_s=15.0, restart_s=600.0, interval_s=1800.0)
    p = predict(inputs)
    assert p.mtbf_s == pytest.approx(5_400_000.0)
    assert p.optimal_interval_s == pytest.approx(12_727.92, abs=0.01)  # sqrt(2 * 15 * 5.4e6)
    # 1 - 15/1800 - 1800/10.8e6 - 600/5.4e6 = 1 - 0.0083333 - 0.0001667 - 0.0001111
    assert p.goodput == pytest.approx(0.9913889, abs=1e-7)
    assert p.optimal_goodput == pytest.approx(1 - 2 * 15 / 12_727.92 - 600 / 5.4e6, abs=1e-7)
    assert p.ratio == pytest.approx(12_727.92 / 1800, abs=1e-3)
    # Spot adds its reclaims per node: 0.2 per node-month on 2 nodes = 0.4/30 per day more.
    spot = predict(GoodputInputs(2, 16, 1.0, 0.2, 15.0, 600.0, 1800.0))
    assert spot.mtbf_s == pytest.approx(DAY / (0.016 + 0.4 / 30))


def _prod(plan: dict[str, Any]) -> tuple[Any, list[Any]]:
    """prod's job facts (as the plan publishes them) and its Job specs."""
    stack_file = load_stack_file("prod")
    return (facts_from_dict(plan["outputs"]["jobFacts"]),
            parse_stack_config(stack_file.values, stack_file.secure_keys).jobs)


def _with_args(spec: Any, every: int) -> Any:
    args = list(spec.args)
    args[args.index("--checkpoint-every") + 1] = str(every)
    return spec.model_copy(update={"args": args})


def _predicted(spec: Any, facts: Any) -> Any:
    inputs, where = spec_goodput_inputs(spec, facts)
    assert inputs is not None, where
    return predict(inputs)


def test_prod_ddp_interval_and_spot_move_goodput_as_the_formula_says(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    facts, specs = _prod(plan)
    ddp = next(spec for spec in specs if spec.name == "resnet50-ddp")
    on_fsx = {name: p for name, p, _ in job_predictions(plan)}["resnet50-ddp"]  # from the plan's output alone
    assert on_fsx is not None and on_fsx == _predicted(ddp, facts)
    # Its checkpoint is on FSx for Lustre: rank 0 writes 1Gi at the file system's 1,171,875,000 bytes/s
    # (250 MB/s/TiB x 4800 GiB), one write.
    assert on_fsx.inputs.checkpoint_s == pytest.approx(2**30 / 1_171_875_000)
    # A measured 100Mi/s stated in the spec (below the file system's share, so kept) is what the rest assumes.
    ddp = ddp.model_copy(update={"checkpoint": ddp.checkpoint.model_copy(update={"write_rate": "100Mi"})})
    before = _predicted(ddp, facts)
    assert before.inputs.nodes == 2 and before.inputs.gpus == 16
    assert before.inputs.checkpoint_s == pytest.approx(2**30 / (100 * 2**20))  # 1Gi at 100Mi/s: one write
    assert before.inputs.interval_s == pytest.approx(1000 * 0.5)
    assert before.mtbf_s == pytest.approx(1000 * DAY / (LLAMA3_PER_1000_GPU_DAYS * 16))

    # Its pool becomes SPOT and it checkpoints every 10000 steps instead of 1000.
    spot = replace(facts, pools=tuple(replace(pool, capacity_type="SPOT") if pool.name == "gpu-h100" else pool
                                      for pool in facts.pools))
    after = _predicted(_with_args(ddp, 10_000), spot)
    m = 1 / (LLAMA3_PER_1000_GPU_DAYS / 1000 * 16 / DAY + SPOT_RECLAIMS_PER_NODE_MONTH * 2 / (30 * DAY))
    assert after.mtbf_s == pytest.approx(m)
    assert after.mtbf_s < before.mtbf_s / 2  # Spot reclaims more than double the gang's failure rate
    delta, tau, r = before.inputs.checkpoint_s, 5000.0, RESTART_S["SPOT"]
    assert after.goodput == pytest.approx(1 - delta / tau - tau / (2 * m) - r / m)
    assert after.optimal_interval_s == pytest.approx(math.sqrt(2 * delta * m))
    assert after.optimal_interval_s < before.optimal_interval_s  # more failures: checkpoint more often
    # The longer interval saves more checkpoint time than Spot's failures cost: +1.8 points here.
    change = after.goodput - before.goodput
    expected = (delta / 500 - delta / tau) - (tau / (2 * m) - 500 / (2 * before.mtbf_s)) \
        - (r / m - RESTART_S["ON_DEMAND"] / before.mtbf_s)
    assert change == pytest.approx(expected)
    assert 0.015 < change < 0.02


def test_note_appears_only_past_three_times_the_optimum(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    facts, specs = _prod(plan)
    ddp = next(spec for spec in specs if spec.name == "resnet50-ddp")
    best = _predicted(ddp, facts).optimal_interval_s
    steps_at = {ratio: int(best * ratio / 0.5) for ratio in (1 / 3.2, 1 / 2.8, 1.0, 2.8, 3.2)}
    notes = {ratio: goodput_notes([("resnet50-ddp", _predicted(_with_args(ddp, steps), facts), "")])
             for ratio, steps in steps_at.items()}
    assert notes[1.0] == [] and notes[2.8] == [] and notes[1 / 2.8] == []
    assert len(notes[3.2]) == 1 and "3.2x longer than the Young/Daly optimum" in notes[3.2][0]
    assert len(notes[1 / 3.2]) == 1 and "3.2x shorter" in notes[1 / 3.2][0]
    assert notes[3.2][0].startswith("jobs[resnet50-ddp]: checkpoint interval ")


def test_summary_prints_each_jobs_prediction(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    text = summary(plan)
    assert "predicted goodput (Young/Daly" in text
    ddp = next(line for line in text.splitlines() if line.startswith("  resnet50-ddp ("))
    # checkpoint 2**30 / 1,171,875,000 = 0.916 s (FSx), MTBF 132.0 days: 1 - 0.916/500 - 500/2m - 540/m = 99.81%,
    # optimum sqrt(2 x 0.916 s x m) = 4571 s = 1.27 h
    assert "goodput 99.81% at the chosen interval 500 s; optimum 1.27 h -> 99.96% (checkpoint 0.9 s" in ddp
    assert ddp.endswith("step 0.5 s assumed)")
    # a plan written before the output (a base plan in a pull request) has no prediction, and says nothing
    older = {**plan, "outputs": {k: v for k, v in plan["outputs"].items() if k != "jobGoodput"}}
    assert "predicted goodput" not in summary(older)


def test_stack_jobs_carry_the_plans_prediction_for_submit_status(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    predicted = {name: prediction for name, prediction, _ in job_predictions(plan) if prediction is not None}
    runs = {resource["inputs"]["metadata"]["labels"]["app.kubernetes.io/name"]: resource["inputs"]
            for resource in plan["resources"] if resource["type"] == "kubernetes:batch/v1:Job"
            and "predicted-goodput" in str(resource["inputs"]["metadata"].get("annotations"))}
    assert set(runs) == set(predicted) == {"resnet50-ddp", "resnet50-laion"}
    for name, run in runs.items():
        # the annotation `submit status|watch` print beside the measured goodput is the plan summary's figure
        assert run["metadata"]["annotations"]["ml-cluster.io/predicted-goodput"] == f"{predicted[name].goodput:.4f}"
        assert status_prediction(run) == pytest.approx(predicted[name].goodput, abs=5e-5)
    assert runs["resnet50-ddp"]["metadata"]["annotations"]["ml-cluster.io/predicted-goodput"] == "0.9981"


# --- a spec's stated inputs, submit render, hostile inputs ------------------------------------------------------


SPEC = """\
name: llm
kind: {kind}
imageTag: 0.1.0
args: [--model, resnet50, --checkpoint-every, "{every}"]
gpus: 8
nodes: 2
gpuType: h100
checkpoint:
  claimName: checkpoints-efs
{goodput}"""


def _facts_file(tmp_path: Path) -> Path:
    from tests.jobs.facts import prod_facts

    facts = prod_facts()
    facts = replace(facts, volume_claims=("checkpoints-efs",), pools=tuple(
        replace(pool, instance_type="p5.48xlarge", capacity_type="SPOT") if pool.name == "gpu-h100" else pool
        for pool in facts.pools))
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(facts_to_dict(facts)))
    return path


def _render(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str = "Job", every: str = "1000",
            goodput: str = "") -> tuple[int, str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.format(kind=kind, every=every, goodput=goodput))
    code = submit_main(["render", str(spec), "--facts", str(_facts_file(tmp_path))])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("kind", ["Job", "JobSet", "TrainJob"])
def test_submit_render_prints_the_prediction_for_every_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             kind: str) -> None:
    code, err = _render(tmp_path, capsys, kind)
    assert code == 0, err
    [line] = [line for line in err.splitlines() if line.startswith("predicted goodput: ")]
    inputs = GoodputInputs(nodes=2, gpus=16, interruptions_per_1000_gpu_days=LLAMA3_PER_1000_GPU_DAYS,
                           spot_reclaims_per_node_month=SPOT_RECLAIMS_PER_NODE_MONTH,
                           checkpoint_s=2**30 / (100 * 2**20), restart_s=RESTART_S["SPOT"], interval_s=500.0)
    expected = predict(inputs)
    assert line.startswith("predicted goodput: llm (2 nodes, 16 GPUs on gpu-h100, p5.48xlarge SPOT): goodput "
                           f"{expected.goodput:.2%} at the chosen interval 500 s")
    assert line.endswith("step 0.5 s assumed)")


def test_a_stated_step_time_mtbf_and_restart_replace_the_assumptions(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _render(tmp_path, capsys, goodput="goodput:\n  stepSeconds: 2.5\n  mtbfHours: 240\n"
                                                  "  restartSeconds: 300\n")
    assert code == 0, err
    [line] = [line for line in err.splitlines() if line.startswith("predicted goodput: ")]
    m, tau, delta = 240 * 3600.0, 2500.0, 2**30 / (100 * 2**20)
    assert f"goodput {1 - delta / tau - tau / (2 * m) - 300 / m:.2%} at the chosen interval 2500 s" in line
    assert "restart 300 s, gang MTBF 10.0 days)" in line and "assumed" not in line


@pytest.mark.parametrize(("goodput", "field"), [
    ("goodput:\n  stepSeconds: 0\n", "goodput.stepSeconds"),
    ("goodput:\n  stepSeconds: -1\n", "goodput.stepSeconds"),
    ("goodput:\n  stepSeconds: .nan\n", "goodput.stepSeconds"),
    ("goodput:\n  stepSeconds: 1e300\n", "goodput.stepSeconds"),
    ("goodput:\n  mtbfHours: 0\n", "goodput.mtbfHours"),
    ("goodput:\n  mtbfHours: -3\n", "goodput.mtbfHours"),
    ("goodput:\n  mtbfHours: .inf\n", "goodput.mtbfHours"),
    ("goodput:\n  restartSeconds: 0\n", "goodput.restartSeconds"),
    ("goodput:\n  restartSeconds: 99999999999999999999\n", "goodput.restartSeconds"),
    ("goodput:\n  stepSeconds: fast\n", "goodput.stepSeconds"),
    ("goodput:\n  stepSecond: 1\n", "goodput.stepSecond"),
])
def test_hostile_goodput_inputs_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    goodput: str, field: str) -> None:
    code, err = _render(tmp_path, capsys, goodput=goodput)
    assert code == 2
    assert err.startswith("error: ") and field in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("every", "why"), [("abc", "'abc' is not a whole number of steps"),
                                            ("-5", "'-5' is not a whole number of steps"),
                                            ("0", "no --checkpoint-every")])
def test_an_interval_that_is_not_a_step_count_is_not_predicted(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              every: str, why: str) -> None:
    code, err = _render(tmp_path, capsys, every=every)
    assert code == 0, err
    assert "predicted goodput: llm: not predicted: " in err and why in err


def test_a_checkpoint_longer_than_its_interval_predicts_no_progress_not_a_negative_share() -> None:
    huge = predict(GoodputInputs(nodes=1, gpus=8, interruptions_per_1000_gpu_days=1.0,
                                 spot_reclaims_per_node_month=0.0, checkpoint_s=1e12, restart_s=540.0,
                                 interval_s=500.0))
    assert huge.goodput == 0.0 and huge.ratio > 3
    with pytest.raises(ValueError, match="interval_s must be a positive finite number"):
        predict(GoodputInputs(1, 8, 1.0, 0.0, 10.0, 540.0, 0.0))
    with pytest.raises(ValueError, match="mtbf_s must be positive"):
        predict(GoodputInputs(1, 8, 1.0, 0.0, 10.0, 540.0, 500.0, mtbf_s=-1.0))


@pytest.mark.parametrize("entry", [{"inputs": {"nodes": "2"}}, {"inputs": {"interval_s": -1}},
                                   {"inputs": []}, {"inputs": {"colour": 1}}, "text"])
def test_a_plan_with_broken_goodput_inputs_says_so_and_goes_on(entry: Any) -> None:
    [(name, prediction, why)] = job_predictions({"outputs": {"jobGoodput": {"x": entry}}})
    assert name == "x" and prediction is None and why


def test_the_pull_request_comment_shows_base_to_head_per_job(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    base = json.loads(json.dumps(plan))
    base["outputs"]["jobGoodput"]["resnet50-ddp"]["inputs"]["interval_s"] = 5000.0  # the base checkpointed less often
    before = {name: p for name, p, _ in job_predictions(base)}["resnet50-ddp"]
    after = {name: p for name, p, _ in job_predictions(plan)}["resnet50-ddp"]
    assert before is not None and after is not None and after.goodput < before.goodput
    lines = goodput_diff_lines(job_predictions(base), job_predictions(plan))
    ddp = next(line for line in lines if "resnet50-ddp" in line)
    change = (after.goodput - before.goodput) * 100
    assert ddp == (f"- resnet50-ddp: predicted goodput {before.goodput:.2%} -> {after.goodput:.2%} ({change:+.2f} "
                   f"points); optimum interval {after.optimal_interval_s:.0f} s, chosen 500 s")
    assert next(line for line in lines if "resnet50-laion" in line).startswith("  resnet50-laion: ")  # unchanged
    del base["outputs"]["jobGoodput"]  # a base planned before the output: nothing to compare with
    assert all(" - -> " in line for line in goodput_diff_lines(job_predictions(base), job_predictions(plan)))


def test_an_asynchronous_save_blocks_for_its_stall_and_spaces_saves_by_its_write() -> None:
    """Sharded saves (asynchronous, skipped while one is in flight): the loop is blocked for the stall s alone,
    saves start every tau_e = tau x ceil(delta / tau), and a failure loses tau_e/2 + delta (the save in flight
    counts for nothing)."""
    sync = GoodputInputs(nodes=2, gpus=16, interruptions_per_1000_gpu_days=1.0, spot_reclaims_per_node_month=0.0,
                         checkpoint_s=25.0, restart_s=600.0, interval_s=10.0)
    m = 5_400_000.0
    blocking, background = predict(sync), predict(replace(sync, stall_s=0.5))
    assert blocking.goodput == 0.0  # the whole write at every 10 s interval: no progress
    # delta 25 s over tau 10 s: a save every 30 s; 1 - 0.5/30 - (15 + 25)/M - 600/M
    assert background.goodput == pytest.approx(1 - 0.5 / 30 - 40 / m - 600 / m, abs=1e-9)
    assert background.optimal_interval_s == pytest.approx(math.sqrt(2 * 0.5 * m))  # above delta
    assert predict(replace(sync, stall_s=1e-6)).optimal_interval_s == 25.0  # never below delta
    quick = predict(replace(sync, checkpoint_s=4.0, stall_s=0.5))  # written within its interval: every 10 s
    assert quick.goodput == pytest.approx(1 - 0.5 / 10 - (5 + 4) / m - 600 / m, abs=1e-9)
    # the directions stay the model's: a longer stall, a longer write or more failures cost goodput
    assert predict(replace(sync, stall_s=1.0)).goodput < background.goodput
    # a longer write at the same spacing (28 s: still every 30 s) loses more per failure; one past it saves less often
    assert predict(replace(sync, checkpoint_s=28.0, stall_s=0.5)).goodput < background.goodput
    assert predict(replace(sync, stall_s=0.5, interruptions_per_1000_gpu_days=5.0)).goodput < background.goodput
    assert inputs_to_dict(sync).keys() == inputs_to_dict(blocking.inputs).keys() and "stall_s" not in (
        inputs_to_dict(sync))  # a blocking checkpoint's output is as before
    assert inputs_from_dict(inputs_to_dict(background.inputs)) == background.inputs


def test_a_sharded_checkpoint_is_predicted_with_its_stall_unless_the_job_waits() -> None:
    from tests.jobs.facts import prod_facts
    from workloads.jobspec.spec import TrainingJobSpec

    facts = prod_facts()
    facts = replace(facts, volume_claims=("checkpoints-efs",))
    base = {"name": "llm", "imageTag": "0.1.0", "gpus": 8, "nodes": 2, "gpuType": "h100",
            "args": ["--checkpoint-every", "100"],
            "checkpoint": {"claimName": "checkpoints-efs", "size": "64Gi", "writeRate": "1Gi", "sharded": True}}
    inputs, where = spec_goodput_inputs(TrainingJobSpec.model_validate(base), facts)
    assert inputs is not None, where
    assert inputs.stall_s == pytest.approx(4 * 2**30 / STAGING_BYTES_PER_S)  # 64Gi over 16 ranks, staged
    line = prediction_line("llm", predict(inputs), where)
    assert f"in the background, stall {inputs.stall_s:.2f} s" in line
    waits = {**base, "args": ["--checkpoint-every", "100", "--checkpoint-if-busy", "wait"]}
    whole = {**base, "checkpoint": {**base["checkpoint"], "sharded": False}}
    for spec in (waits, whole):
        inputs, where = spec_goodput_inputs(TrainingJobSpec.model_validate(spec), facts)
        assert inputs is not None and inputs.stall_s is None, where
