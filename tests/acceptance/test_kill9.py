"""kill -9 of the acceptance runner mid-run: the next run sees what it left (its run lock, the command it ran still
going, a bundle whose summary says which step was running, half-written files, the stack's lock and pending
operations) and refuses with one line or recovers. The slow case SIGKILLs the real runner (scripts/acceptance.py's
run, the stand-in pulumi of conftest.py on PATH) in the middle of `pulumi up`; the fast ones SIGKILL real
processes standing in for the runner and its command, and read the lock as the next run does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.acceptance.bundle import SUMMARY, StepRecord, Summary, load_summary, write_summary
from infra.acceptance.runlock import RunLockError, claim, group_alive, inspect, lock_path, start_time
from tests.acceptance.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HOST = socket.gethostname()


def _wait(what: str, done: Callable[[], object], deadline_s: float = 30) -> None:
    ends = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < ends, f"no {what} within {deadline_s} s"
        time.sleep(0.05)


def _killed(popen: subprocess.Popen[bytes]) -> int:
    pid = popen.pid
    os.kill(pid, signal.SIGKILL)
    popen.wait(timeout=10)
    return pid


def _bundle_in_up(folder: Path) -> None:
    """A bundle as a runner killed during `up` leaves it: summary.json says up is running; a half-written temp."""
    folder.mkdir(parents=True)
    steps = [StepRecord(name="preflight", commands=["p"], status="passed", started="2026-11-27T01:00:00Z",
                        ended="2026-11-27T01:00:05Z", exit_status=0, deadline_s=600, log="01-preflight.log"),
             StepRecord(name="up", commands=["pulumi up"], status="running", started="2026-11-27T01:00:05Z",
                        deadline_s=7200, log="02-up.log"),
             StepRecord(name="destroy", commands=["pulumi destroy"], status="not-run", deadline_s=5400)]
    write_summary(folder, Summary(schema="ml-cluster/acceptance-summary/v1", stack="dev", git_commit=COMMIT,
                                  git_dirty=False, started="2026-11-27T01:00:00Z", ended=None, result="running",
                                  failed_step=None, keep=False, steps=steps))
    (folder / ".summary.json.0123456789ab.tmp").write_text('{"schema": "ml-clus')


def test_a_dead_runner_whose_command_still_runs_is_refused_then_recovered(tmp_path: Path) -> None:
    evidence, bundle = tmp_path / "evidence", tmp_path / "evidence" / "dev-1"
    _bundle_in_up(bundle)
    runner = subprocess.Popen(["sleep", "30"])
    command = subprocess.Popen(["sleep", "30"], start_new_session=True)  # as run_command starts pulumi
    try:
        lock_path(evidence, "dev").write_text(json.dumps({
            "pid": runner.pid, "host": HOST, "started": "2026-11-27T01:00:00Z", "bundle": str(bundle),
            "child": command.pid, "command": "pulumi up --stack dev --yes"}))
        with pytest.raises(RunLockError) as live:
            inspect(evidence, "dev")
        assert live.value.why.startswith(f"another acceptance run of dev is going (pid {runner.pid}, since ")
        runner_pid = _killed(runner)
        with pytest.raises(RunLockError) as orphan:
            inspect(evidence, "dev")
        assert orphan.value.why == (
            f"the run in {bundle} died (pid {runner_pid} gone), but the command it ran, pulumi up --stack dev --yes, "
            f"still runs (process group {command.pid}): let it end or stop it (kill -INT -{command.pid}), then run "
            "again")
        _killed(command)
        assert not group_alive(command.pid)
        dead = inspect(evidence, "dev")
        assert dead is not None and (dead.step, dead.up_began, dead.pid) == ("up", True, runner_pid)
        assert dead.line() == (
            f"the run in {bundle} died during step up (pid {runner_pid} gone); its bundle stays as it last wrote it, "
            "less 1 half-written file(s); this run's stack-state step repairs the lock and pending operations its "
            "`up` may have left")
        before = (bundle / SUMMARY).read_bytes()
        lock = claim(evidence, "dev", evidence / "dev-2", "2026-11-27T02:00:00Z", dead)
        assert json.loads(lock_path(evidence, "dev").read_text())["pid"] == os.getpid()
        assert sorted(p.name for p in bundle.iterdir()) == [SUMMARY] and (bundle / SUMMARY).read_bytes() == before
        lock.release()
        assert inspect(evidence, "dev") is None
    finally:
        for process in (runner, command):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_second_run_cannot_take_a_held_lock(tmp_path: Path) -> None:
    lock = claim(tmp_path, "dev", tmp_path / "dev-1", "2026-11-27T01:00:00Z", None)
    with pytest.raises(RunLockError) as held:
        claim(tmp_path, "dev", tmp_path / "dev-2", "2026-11-27T01:00:01Z", None)
    assert held.value.why == "another run of dev took the lock first"
    with pytest.raises(RunLockError) as live:
        inspect(tmp_path, "dev")
    assert "another acceptance run of dev is going" in live.value.why
    lock.child(4242, "pulumi up --stack dev")
    assert json.loads(lock_path(tmp_path, "dev").read_text())["child"] == 4242
    lock.release()
    assert list(tmp_path.iterdir()) == []  # no temp file left either


@pytest.mark.parametrize(("text", "says"), [
    ('{"pid": 1, "host": "ci-runner-7", "started": "t", "bundle": "b"}', "a run of dev started on host ci-runner-7"),
    ("{not json", "not a run lock"),
    ('{"pid": "1", "host": "h", "started": "t", "bundle": "b"}', "not a run lock (pid, host, started, bundle)"),
    ('{"pid": true, "host": "h", "started": "t", "bundle": "b"}', "not a run lock (pid, host, started, bundle)"),
    ("[" * 30000, "not a run lock"),
])
def test_a_lock_the_next_run_cannot_account_for_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    lock_path(tmp_path, "dev").write_text(text)
    with pytest.raises(RunLockError) as refused:
        inspect(tmp_path, "dev")
    assert refused.value.why.startswith(says) and "\n" not in str(refused.value)


RUNNER = textwrap.dedent("""
    import importlib.util, sys, types
    from pathlib import Path
    root, evidence, bundle = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("acceptance_cli", root / "scripts" / "acceptance.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    from infra.acceptance.plan import Command, Probe, Step, probe_figures
    from infra.acceptance.runlock import inspect

    def go(argv):
        dead = inspect(evidence, "dev")
        ours = f"died:{dead.bundle}" if dead is not None and dead.up_began else ""
        state = lambda ours: Probe("stack_state", (("stack", "dev"), ("ours", ours)))
        steps = [Step("preflight", (Command((sys.executable, "-c", "print('ok')")),), 60),
                 Step("stack-state", (state(ours),), 60, probe_figures),
                 Step("up", (Command(("pulumi", "up", "--stack", "dev", "--yes")),), 60),
                 Step("destroy", (state(ours + "{interrupted?}"), Command(("pulumi", "destroy", "--stack", "dev",
                                  "--yes"))), 60, probe_figures, after_up=True)]
        return cli.run("dev", types.SimpleNamespace(region="us-west-2"), steps, {}, bundle, "0" * 40, False, False,
                       evidence, dead)

    cli.main = go
    sys.exit(cli.entry([]))
""")


@pytest.mark.slow  # three runner processes importing the kit, and the stand-in pulumi: several seconds
def test_kill_9_of_the_real_runner_mid_up_then_the_next_runs(pulumi, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    pulumi(up_hangs=True)
    script, evidence = tmp_path / "runner.py", tmp_path / "evidence"
    script.write_text(RUNNER)

    def runner(name: str) -> list[str]:
        return [sys.executable, str(script), str(ROOT), str(evidence), str(evidence / name)]

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(runner("dev-1"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = lock_path(evidence, "dev")
        _wait("pulumi up holding the stack's lock",
              lambda: pulumi.read().get("lock") and lock.exists() and "up" in json.loads(lock.read_text()).get(
                  "command", ""))
        child = json.loads(lock.read_text())["child"]
        first_pid = _killed(first)  # kill -9 of the runner in the middle of `pulumi up`
    finally:
        if first.poll() is None:
            first.kill()
    assert group_alive(child)  # pulumi runs on in its own process group
    second = subprocess.run(runner("dev-2"), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 2 and second.stdout == ""
    assert second.stderr.splitlines() == [
        f"error: {lock}: the run in {evidence / 'dev-1'} died (pid {first_pid} gone), but the command it ran, pulumi "
        f"up --stack dev --yes, still runs (process group {child}): let it end or stop it (kill -INT -{child}), then "
        "run again"]
    os.killpg(child, signal.SIGKILL)
    _wait("the orphaned pulumi to go", lambda: not group_alive(child))
    died = load_summary(evidence / "dev-1")
    assert died.result == "running" and [s.status for s in died.steps] == ["passed", "passed", "running", "not-run"]

    pulumi.update(up_hangs=False)
    third = subprocess.run(runner("dev-3"), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert third.returncode == 0, third.stdout + third.stderr
    printed = third.stdout.splitlines()
    assert printed[0] == (f"recovered: the run in {evidence / 'dev-1'} died during step up (pid {first_pid} gone); "
                          "its bundle stays as it last wrote it; this run's stack-state step repairs the lock and "
                          "pending operations its `up` may have left")
    assert printed[3].startswith(f"stack-state: passed stack_state=pulumi cancel (locked by me@{HOST} pid {child}, "
                                 "its process gone); pulumi refresh --clear-pending-creates (1 pending operation(s))")
    summary = load_summary(evidence / "dev-3")
    assert summary.result == "passed" and summary.previous_run == printed[0].removeprefix("recovered: ")
    assert pulumi.read()["destroyed"] is True and not lock.exists()


def test_the_dry_run_says_what_an_earlier_run_left(cli, clean_git: None, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
                                                   tmp_path: Path) -> None:
    bundle = tmp_path / "dev-1"
    _bundle_in_up(bundle)
    gone = subprocess.Popen(["sleep", "30"])
    pid = _killed(gone)
    lock_path(tmp_path, "dev").write_text(json.dumps({"pid": pid, "host": HOST, "started": "2026-11-27T01:00:00Z",
                                                      "bundle": str(bundle)}))
    code, out, _ = run_cli(cli, capsys, "--stack", "dev", "--dry-run", "--evidence", str(tmp_path),
                           "--allreduce-floor", "20", "--gang-dataset", "s3://my-data/imagenet-hdf5")
    assert code == 0
    assert [line for line in out.splitlines() if line.startswith("warning: ")] == [
        f"warning: the run in {bundle} died during step up (pid {pid} gone); its bundle stays as it last wrote it, "
        "less 1 half-written file(s); this run's stack-state step repairs the lock and pending operations its `up` "
        "may have left (a real run goes on)"]
    assert f"    $ probe stack_state stack=dev ours=died:{bundle}" in out.splitlines()
    assert (bundle / ".summary.json.0123456789ab.tmp").exists()  # a dry run changes nothing


@pytest.mark.skipif(start_time(os.getpid()) is None, reason="no /proc/<pid>/stat here")
def test_a_reused_pid_is_not_taken_for_the_runner(tmp_path: Path) -> None:
    """The lock's pid now names another process (started at another time): the run it names is gone."""
    lock_path(tmp_path, "dev").write_text(json.dumps({
        "pid": os.getpid(), "pid_start": (start_time(os.getpid()) or 0) + 1, "host": HOST,
        "started": "2026-11-27T01:00:00Z", "bundle": str(tmp_path / "dev-1")}))
    dead = inspect(tmp_path, "dev")
    assert dead is not None and (dead.pid, dead.step, dead.up_began) == (os.getpid(), None, False)
    lock = claim(tmp_path, "dev", tmp_path / "dev-2", "2026-11-27T02:00:00Z", dead)
    assert json.loads(lock_path(tmp_path, "dev").read_text())["pid_start"] == start_time(os.getpid())
    lock.release()


def test_a_lock_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    evidence = tmp_path / "evidence"
    evidence.write_text("a file where the folder belongs")
    with pytest.raises(RunLockError) as refused:
        claim(evidence, "dev", evidence / "dev-1", "2026-11-27T02:00:00Z", None)
    assert (refused.value.where, refused.value.why) == (str(evidence), "File exists")


def test_check_bundle_says_where_a_dead_run_stopped(cli, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _bundle_in_up(tmp_path / "dev-1")
    (tmp_path / "dev-1" / "01-preflight.log").write_text("# step preflight\n")
    (tmp_path / "dev-1" / "02-up.log").write_text("# step up\n")
    code, out, err = run_cli(cli, capsys, "--check-bundle", str(tmp_path / "dev-1"))
    assert (code, err) == (0, "")
    assert out == (f"ok: {tmp_path / 'dev-1'}: stack dev, running (step up was running when this summary was "
                   "written: a run that died stops here)\n")


def test_a_zombie_is_not_a_running_process() -> None:
    """A process that exited but was not reaped yet (a killed orphan under a container init that reaps late) holds
    no lock: the stale-lock check and the run lock read it as gone, as group_alive does."""
    from infra.acceptance.runlock import process_alive

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        _wait("the child to exit", lambda: Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
              == "Z")
        assert not process_alive(child.pid)
    finally:
        child.wait(timeout=10)
    assert process_alive(os.getpid())
