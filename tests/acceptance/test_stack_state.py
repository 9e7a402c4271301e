"""What an interrupted `pulumi up` leaves (a lock, pending operations) is found and repaired before `up` and before
`destroy`, against a stand-in `pulumi` on PATH that answers with the real CLI's texts (tests/acceptance/
fake_pulumi.py says where each comes from); the commands go through the kit's real runner (own process group,
deadline)."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from infra.acceptance.bundle import load_summary
from infra.acceptance.plan import Command, Probe, Step, probe_figures
from infra.acceptance.runner import Run
from infra.acceptance.stackstate import Lock, lock_in, pending_operations, stack_state_probe, stale

HERE = Path(__file__).resolve().parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
URN = "urn:pulumi:dev::ml-cluster::aws:eks/cluster:Cluster::ml-dev"
HOST = socket.gethostname()


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)  # it has exited (and was reaped): no process has this pid now, barring reuse


def _probe(ours: str = "") -> tuple[object, str]:
    log = io.StringIO()
    outcome = stack_state_probe()({"stack": "dev", "ours": ours}, log, 60)
    return outcome, log.getvalue()


def test_the_real_lock_texts_are_recognised() -> None:
    cloud = ("error: [409] Conflict: Another update is currently in progress.\nTo learn more about possible reasons "
             "and resolution, visit https://www.pulumi.com/docs/support/troubleshooting/common-issues/update-conflicts/")
    assert lock_in(cloud) == Lock("cloud")
    diy = ("error: the stack is currently locked by 2 lock(s). Either wait for the other process(es) to end or delete "
           "the lock file with `pulumi cancel`.\n  s3://b/.pulumi/locks/organization/ml-cluster/dev/1.json: created by "
           "chris@dev-machine (pid 4242) at 2024-01-15T10:30:00Z\n  s3://b/.pulumi/locks/organization/ml-cluster/dev/"
           "2.json: created by ci@runner-7 (pid 999) at 2024-01-15T10:31:00Z")
    assert lock_in(diy) == Lock("diy", (("chris", "dev-machine", 4242), ("ci", "runner-7", 999)))
    assert lock_in("error: no stack named 'dev' found") is None
    assert stale(Lock("diy", (("me", "h", 1),)), "h", lambda pid: False) is True
    assert stale(Lock("diy", (("me", "h", 1),)), "h", lambda pid: True) is False
    assert stale(Lock("diy", (("me", "other", 1),)), "h", lambda pid: False) is None
    assert stale(Lock("cloud"), "h", lambda pid: False) is None
    export = {"deployment": {"pending_operations": [{"resource": {"urn": URN}, "type": "creating"}]}}
    assert pending_operations(json.dumps(export)) == [("creating", URN)]
    assert pending_operations(json.dumps({"deployment": {}})) == [] == pending_operations("[]")


def test_a_dead_processes_lock_is_cancelled_and_its_pending_create_cleared(pulumi) -> None:  # type: ignore[no-untyped-def]
    pid = _dead_pid()
    pulumi(lock={"user": "me", "host": HOST, "pid": pid}, pending=[{"type": "creating", "urn": URN}])
    outcome, log = _probe()
    assert outcome.exit_status == 0, outcome.note  # type: ignore[attr-defined]
    assert outcome.figures["stack_state"] == (  # type: ignore[attr-defined]
        f"pulumi cancel (locked by me@{HOST} pid {pid}, its process gone); pulumi refresh --clear-pending-creates "
        f"(1 pending operation(s)); 1 pending create(s) dropped: if created, the leftovers check finds them by tag "
        f"({URN})")
    state = pulumi.read()
    assert [call.split(" --")[0] for call in state["calls"]] == ["stack export", "refresh", "cancel", "refresh"]
    assert state["lock"] is None and state["pending"] == []
    assert "error: the stack is currently locked by 1 lock(s)" in log  # the CLI's own answer, in the step's log


def test_a_lock_whose_process_still_runs_is_refused_in_one_line(pulumi) -> None:  # type: ignore[no-untyped-def]
    pulumi(lock={"user": "me", "host": HOST, "pid": os.getpid()}, pending=[{"type": "updating", "urn": URN}])
    outcome, _ = _probe(ours="up")  # even after our own interrupted up: that pulumi is still at work
    assert outcome.exit_status == 1  # type: ignore[attr-defined]
    assert outcome.note == (f"stack dev: locked by me@{HOST} pid {os.getpid()}, and pid {os.getpid()} still runs: "  # type: ignore[attr-defined]
                            f"let it end (or stop it: kill -INT {os.getpid()}) and run again")
    assert "cancel" not in " ".join(pulumi.read()["calls"])


def test_a_cloud_update_in_progress_is_cancelled_only_after_our_own_interrupted_up(pulumi) -> None:  # type: ignore[no-untyped-def]
    pulumi(backend="cloud", cloud_update=True, pending=[{"type": "creating", "urn": URN}])
    outcome, _ = _probe()
    assert outcome.exit_status == 1 and outcome.note == (  # type: ignore[attr-defined]
        "stack dev: the Pulumi Cloud has an update of it in progress, not by this kit's own interrupted up: wait for "
        "that update to end; `pulumi cancel` only if it is yours")
    assert pulumi.read()["cloud_update"] is True
    outcome, _ = _probe(ours="up")
    assert outcome.exit_status == 0 and outcome.figures["stack_state"].startswith(  # type: ignore[attr-defined]
        "pulumi cancel (the Pulumi Cloud has an update of it in progress); pulumi refresh --clear-pending-creates")
    assert pulumi.read()["cloud_update"] is False and pulumi.read()["pending"] == []


def test_pending_operations_a_refresh_cannot_clear_are_exported_and_imported(pulumi) -> None:  # type: ignore[no-untyped-def]
    pulumi(pending=[{"type": "deleting", "urn": URN}], refresh_breaks=True)
    outcome, log = _probe()
    assert outcome.figures == {"stack_state": "pulumi stack export + import (1 pending operation(s) removed)"}  # type: ignore[attr-defined]
    state = pulumi.read()
    assert [call.split(" --")[0] for call in state["calls"]] == ["stack export", "refresh", "stack export",
                                                                 "stack import"]
    assert state["pending"] == [] and f"warning: removing pending operation 'deleting' on '{URN}'" in log


@pytest.mark.parametrize(("fields", "says", "calls"), [
    ({"exists": False}, "no stack dev yet: nothing to recover", 1),
    ({}, "no pending operations; not interrupted: nothing to do", 1),
])
def test_a_clean_or_absent_stack_is_left_alone(pulumi, fields: dict, says: str, calls: int) -> None:  # type: ignore[no-untyped-def,type-arg]
    pulumi(**fields)
    outcome, _ = _probe()
    assert outcome.exit_status == 0 and outcome.figures == {"stack_state": says}  # type: ignore[attr-defined]
    assert len(pulumi.read()["calls"]) == calls


@pytest.mark.slow  # 1 s of deadline and eight stand-in pulumi processes: about 2 s (the fast siblings: the probe's
# cases above, and test_runner.py's interrupted capture)
def test_an_up_killed_at_its_deadline_is_repaired_before_destroy(pulumi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The real runner kills a `pulumi up` that holds its lock at the step's deadline (1 s); destroy's state check
    knows the up was interrupted, cancels the lock its dead process left, clears the pending create, and destroys."""
    pulumi(up_hangs=True)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    steps = [Step("up", (Command(("pulumi", "up", "--stack", "dev", "--yes")),), 1.0),
             Step("destroy", (Probe("stack_state", (("stack", "dev"), ("ours", "{interrupted?}"))),
                              Command(("pulumi", "destroy", "--stack", "dev", "--yes"))), 60, probe_figures,
                  after_up=True)]
    summary = Run(steps, bundle, "dev", COMMIT, False, False, probes={"stack_state": stack_state_probe()})()
    assert [step.status for step in summary.steps] == ["failed", "passed"], summary.steps[1].note
    assert summary.steps[0].exit_status == 124
    assert summary.steps[1].figures["stack_state"].startswith("pulumi cancel (locked by me@")
    state = pulumi.read()
    assert state["destroyed"] is True and state["lock"] is None and state["pending"] == []
    assert load_summary(bundle).steps[1].figures == summary.steps[1].figures


@pytest.mark.parametrize("written", [b'{"deployment": {"pending_operations": [', b"\xff\xfe", b"[" * 30000])
def test_an_export_that_cannot_be_read_is_a_failed_export(tmp_path: Path, written: bytes) -> None:
    """`pulumi stack export` exiting 0 with a file that is not JSON (a full disk, a killed write): one line naming
    the file, as a failed export, never a traceback."""
    from infra.acceptance.stackstate import Recovery

    def execute(argv: tuple[str, ...], log: object, timeout_s: float) -> tuple[int, str]:
        Path(argv[argv.index("--file") + 1]).write_bytes(written)
        return 0, ""

    recovery = Recovery("dev", False, io.StringIO(), 60, execute, lambda: 0.0, HOST, lambda pid: False)
    code, output, pending = recovery.export(tmp_path)
    assert code == 1 and pending == [] and output.startswith(f"error: {tmp_path / 'state.json'}: not a readable")
    assert "\n" not in output
