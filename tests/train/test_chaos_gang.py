"""The chaos harness in its small form: one 2-node gang on 127.0.0.1 (real torchrun agents, c10d rendezvous,
gloo), one node SIGKILLed mid-run and restarted by the rendered Job's rules; and an elastic gang (minNodes 1) whose
lost node does not come back, so the survivor continues alone after the rendered wait; and a user's script under the
rendered launcher stopped by SIGTERM. The full form, with SIGTERM too, many seeded trials, the gang growing back, and
the comparison with an uninterrupted run, is scripts/chaos_gang.py (docs/benchmarks.md)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.chaos_gang import (
    CLASSES,
    ELASTIC_WAIT_S,
    NODES,
    PER_CLASS,
    RANK_BATCH,
    check,
    lost_bound,
    make_dataset,
    rendered_gang_job,
    run_gang,
)
from benchmarks.chaos_goodput import measure
from scripts.chaos_gang import main
from workloads.train.checkpointer import latest_checkpoint

REPO = Path(__file__).resolve().parents[2]

# The harness's one-incident form stays in `make test` (not marked slow): the restart rules are its subject.
pytestmark = [
    pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                       reason="no torchrun"),
]


def test_a_lost_node_restarts_the_whole_gang_which_trains_every_sample_once(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    outcome = run_gang(tmp_path / "run", data, rendered_gang_job(rank_restarts=0), checkpoint_every=3,
                       kill=("SIGKILL", 5, 1), timeout_s=240, step_delay_s=0.1)
    check(outcome, tmp_path / "run", None, checkpoint_every=3)  # every sample once per epoch, steps lost, budget
    assert outcome.ok, (outcome.problems, outcome.actions)
    assert outcome.actions[0] == "node1:-9:Ignore"  # the lost node's pod: DisruptionTarget, not counted
    assert all(action.endswith(":Ignore") for action in outcome.actions)  # the survivor exits 43: not counted
    # the save of step 3 may be in flight; each periodic save skipped meanwhile (one in flight) adds 3 steps
    assert outcome.steps_lost is not None and outcome.steps_lost <= lost_bound(3, outcome.saves_skipped)
    assert outcome.counted_failures == 0


@pytest.mark.slow  # about 50 s: it waits out the elastic wait, then a restart on one node
def test_an_elastic_gang_continues_on_fewer_nodes_and_trains_every_sample_once(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    job = rendered_gang_job(rank_restarts=0, elastic=True)
    outcome = run_gang(tmp_path / "run", data, job, checkpoint_every=3, kill=("DROP", 5, 1), timeout_s=180,
                       step_delay_s=0.1)
    # every sample once per epoch across the 2-node and the 1-node formations, the same number of steps as a
    # 2-node run (the global batch is kept), steps lost within --checkpoint-every, nothing counted
    check(outcome, tmp_path / "run", None, checkpoint_every=3)
    assert outcome.ok, (outcome.problems, outcome.actions)
    assert outcome.world_after == 1  # continued without the lost node
    assert outcome.actions == ["node0:43:Ignore"]  # the survivor left the broken gang; the lost node never came back
    assert outcome.steps_lost is not None and outcome.steps_lost <= lost_bound(3, outcome.saves_skipped)
    assert outcome.time_to_resume_s is not None and outcome.time_to_resume_s >= ELASTIC_WAIT_S  # it waited first
    final = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert final is not None and final["step"] == 2 * (CLASSES * PER_CLASS) // (NODES * RANK_BATCH)


# Eight interpreters importing torch (about 30 s of CPU). make test keeps its parts: the harness's script command just
# below, SIGTERM on one of two ranks under the launcher (stop helper, checkpoint, exit 43: test_stop_helper.py), the
# plain example's SIGTERM checkpoint (test_stop_helper.py), the agent's SIGTERM as exit 43 (test_stop.py), StepReport's
# events (test_step_report.py), and a 2-node gang restarted by the rendered Job's rules (the SIGKILL case above).
@pytest.mark.slow
def test_a_user_script_under_the_rendered_launcher_stops_on_sigterm_and_loses_no_step(tmp_path: Path) -> None:
    """examples/train_plain.py as a 2-node Job spec's `command:` (rendered under the launcher): SIGTERM to one node's
    agent; both nodes stop after the same step with a checkpoint (StopSignal), exit 43, and the gang resumes."""
    from benchmarks.chaos_gang import packed_dataset

    data = packed_dataset(tmp_path / "data")
    job = rendered_gang_job(rank_restarts=0, script=["examples/train_plain.py"])
    outcome = run_gang(tmp_path / "run", data, job, checkpoint_every=3, kill=("SIGTERM", 5, 1), timeout_s=240,
                       step_delay_s=0.1)
    check(outcome, tmp_path / "run", None, checkpoint_every=3, script=True)
    assert outcome.ok, (outcome.problems, outcome.actions)
    assert sorted(outcome.actions) == ["node0:43:Ignore", "node1:43:Ignore"]  # both stopped, nothing counted
    assert outcome.steps_lost == 0
    # the script reports its steps (StepReport): one timed "batch" event per step of a formation, so goodput is
    # measured for it as for the bundled trainer
    batches = [event for _, event in outcome.events if event.get("event") == "batch"]
    assert batches and all("data_time" in event and "compute_time" in event for event in batches)
    steps = [event["step"] for event in batches]
    assert steps == sorted(steps) and len(set(steps)) == len(steps)  # SIGTERM: resumed after the last, none twice
    assert measure(outcome.events, outcome.seconds, outcome.killed_at_s, outcome.time_to_resume_s).goodput > 0


def test_a_script_job_runs_the_script_under_the_launcher_as_the_harness_starts_it(tmp_path: Path) -> None:
    """What the slow SIGTERM case starts on each node: the rendered Job's `command: [python, SCRIPT]` under the
    launcher, its `python` replaced by the harness's script worker, the script's own arguments after the harness's
    run settings; a Job whose command leaves the launcher is refused rather than run bare."""
    from benchmarks.chaos_gang import SCRIPT_ARGS, is_script, node_command

    script = REPO / "examples" / "train_plain.py"
    job = rendered_gang_job(rank_restarts=0, script=[str(script), "--lr", "0.1"])
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:4] == ["python", "-m", "workloads.train.launch", "--no-python"]
    assert container["command"][4:] == ["python", str(script)] and container["args"] == [*SCRIPT_ARGS, "--lr", "0.1"]
    assert is_script(job) and not is_script(rendered_gang_job(rank_restarts=0))
    torchrun = ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29500"]
    data, checkpoints = tmp_path / "data", tmp_path / "ckpt"
    command = node_command(job, torchrun, data, checkpoints, checkpoint_every=3)
    assert command == [sys.executable, "-m", "workloads.train.launch", *torchrun, "--no-python", sys.executable, "-m",
                       "benchmarks.chaos_script_worker", str(script), *SCRIPT_ARGS, "--lr", "0.1", "--data", str(data),
                       "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "3"]
    container["command"] = ["python", "-m", "workloads.train.launch", "--no-python", "bash", "-c", "true"]
    with pytest.raises(ValueError, match="does not run the script under the launcher"):
        node_command(job, torchrun, data, checkpoints, checkpoint_every=3)


@pytest.mark.parametrize("argv, line", [
    (["--rank-restarts", "-1"], "--rank-restarts: -1: must be 0 or more"),
    (["--trials", "0"], "--trials: 0: must be 1 or more"),
    (["--checkpoint-every", "-3"], "--checkpoint-every: -3: must be 1 or more"),
])
def test_chaos_cli_refuses_negative_counts(argv: list[str], line: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and capsys.readouterr().err == f"error: {line}\n"  # one line, no usage block


def test_chaos_cli_refuses_a_workdir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep me\n")
    for workdir, why in ((afile, "exists and is not a directory"), (afile / "below", "cannot make it a directory")):
        with pytest.raises(SystemExit) as exited:
            main(["--trials", "1", "--workdir", str(workdir)])
        [line] = capsys.readouterr().err.splitlines()
        assert exited.value.code == 2 and line.startswith(f"error: --workdir: {workdir}: {why}"), line
    assert afile.read_text() == "keep me\n"


@pytest.mark.parametrize(("lost", "skipped", "within"), [(5, 0, True), (6, 0, False), (8, 1, True), (9, 1, False)])
def test_the_sigkill_bound_grows_by_an_interval_per_skipped_save(tmp_path: Path, lost: int, skipped: int,
                                                                 within: bool) -> None:
    """every 3: 2 x 3 - 1 = 5 steps with no periodic save skipped, one interval more per skipped save."""
    from benchmarks.chaos_gang import Outcome

    (tmp_path / "samples").mkdir()
    outcome = Outcome(ok=True, kill="SIGKILL", kill_step=7, node=1, steps_lost=lost, saves_skipped=skipped)
    check(outcome, tmp_path, None, checkpoint_every=3)
    over = [problem for problem in outcome.problems if problem.startswith("SIGKILL lost")]
    assert (over == []) is within, outcome.problems
    if not within:
        assert over == [f"SIGKILL lost {lost} steps (> {lost_bound(3, skipped)}, {skipped} periodic save(s) skipped)"]
