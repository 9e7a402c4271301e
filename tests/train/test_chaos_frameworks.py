"""Chaos on a gang running your own Lightning or Accelerate script (examples/train_lightning.py,
examples/train_accelerate.py), rendered through a 2-node Job spec's `command:` and so under the launcher: a SIGTERM
to one node's agent (a drain, a Spot notice) and a SIGKILL of one node's whole process tree (a lost node), each
against an uninterrupted run of the same script. Checked for each: the nodes' exit codes as the Job's
podFailurePolicy judges them (SIGTERM: 43 on both nodes), nothing counted against backoffLimit, every sample trained
exactly once per epoch, SIGTERM losing no step, the final step and weights those of the uninterrupted run (the SIGKILL
trial resumes from an epoch's end, the SIGTERM trial mid-epoch).

lightning and accelerate are pinned in the project's `examples` extra, which `make setup` installs (CI's
`make test-slow` runs these): no skip where they are missing."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.chaos_gang import check, final_checkpoint, packed_dataset, rendered_gang_job, run_gang
from benchmarks.chaos_goodput import measure

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = {"lightning": REPO / "examples" / "train_lightning.py",
           "accelerate": REPO / "examples" / "train_accelerate.py"}
EVERY = 3  # --checkpoint-every: a SIGKILL loses at most this many steps

pytestmark = [
    pytest.mark.slow,  # three 2-node gang runs per framework, each a minute or more on two cores
    pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                       reason="no torchrun"),
]


@pytest.mark.parametrize("framework", sorted(SCRIPTS))
def test_a_framework_script_survives_sigterm_and_a_lost_node_without_spending_the_budget(
        framework: str, tmp_path: Path) -> None:
    __import__(framework)  # the extra is installed by `make setup`: a missing package fails here, it never skips
    data = packed_dataset(tmp_path / "data")
    job = rendered_gang_job(rank_restarts=0, script=[str(SCRIPTS[framework])])
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "python", "-m", "workloads.train.launch", "--no-python"]

    straight = run_gang(tmp_path / "straight", data, job, EVERY, timeout_s=300, step_delay_s=0.05)
    check(straight, tmp_path / "straight", None, EVERY, script=True)
    assert straight.ok and straight.actions == [], (straight.problems, straight.actions)
    reference = final_checkpoint(tmp_path / "straight" / "checkpoints", script=True)
    assert reference is not None and reference["step"] == 24  # 2 epochs of 96 samples, 2 ranks x 4
    # the script reports every step and save (StepReport; Lightning's from a callback): measured goodput reads them
    events = [event for _, event in straight.events]
    assert [event["step"] for event in events if event.get("event") == "batch"] == list(range(1, 25))
    assert {event["step"] for event in events if event.get("event") == "checkpoint"} == set(range(EVERY, 25, EVERY))
    assert measure(straight.events, straight.seconds).goodput > 0

    term = run_gang(tmp_path / "term", data, job, EVERY, kill=("SIGTERM", 5, 1), timeout_s=300, step_delay_s=0.1)
    check(term, tmp_path / "term", reference, EVERY, script=True)  # samples once, step and weights, nothing counted
    assert term.ok, (term.problems, term.actions)
    assert sorted(term.actions) == ["node0:43:Ignore", "node1:43:Ignore"]  # both stopped with the disruption code
    assert term.steps_lost == 0 and term.resumed_step is not None and term.resumed_step >= 5

    # step 13: the last checkpoint is epoch 0's end (12 steps an epoch), which Lightning resumes in a loop state of
    # its own (its epoch counter not yet moved on)
    lost = run_gang(tmp_path / "lost", data, job, EVERY, kill=("SIGKILL", 13, 1), timeout_s=300, step_delay_s=0.1)
    check(lost, tmp_path / "lost", reference, EVERY, script=True)
    assert lost.ok, (lost.problems, lost.actions)
    assert lost.actions[0] == "node1:-9:Ignore"  # the lost node's pod carries DisruptionTarget
    assert all(action.endswith(":Ignore") for action in lost.actions)  # the survivor left with 43
    assert lost.counted_failures == 0 and lost.steps_lost is not None and lost.steps_lost <= EVERY
    final = final_checkpoint(tmp_path / "lost" / "checkpoints", script=True)
    assert final is not None and all(torch.equal(final["model"][name], tensor)
                                     for name, tensor in reference["model"].items())
