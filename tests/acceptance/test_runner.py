"""The acceptance kit's orchestration against stand-ins: a fake command runner and fake probes record what ran, in
what order, with what deadline; nothing here calls AWS or Kubernetes."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

import pytest

from infra.acceptance.bundle import SUMMARY, BundleWriteError, check_bundle, load_summary
from infra.acceptance.plan import Command, Probe, Step, probe_figures, up_figures
from infra.acceptance.runner import DEADLINE_EXIT, ProbeOutcome, Run, run_command

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _step(name: str, *actions: Command | Probe, deadline: float = 60, **kwargs: object) -> Step:
    return Step(name, actions or (Command(("do", name)),), deadline, **kwargs)  # type: ignore[arg-type]


def _steps() -> list[Step]:
    return [_step("preflight"),
            _step("up", Command(("policy", "config")), Command(("pulumi", "up")), figures=up_figures),
            _step("allreduce", Command(("submit", "spec.yaml"), capture=(("job", r"^created job/(\S+) in "),)),
                  Command(("watch", "{job}"))),
            _step("chaos", Probe("chaos", (("job", "{job}"),)), Command(("delete", "{job}"), always=True),
                  figures=probe_figures),
            _step("destroy", Command(("pulumi", "destroy")), Probe("leftovers"), after_up=True)]


class Fake:
    """Records every call; `fail` maps a command's first word (or a probe's name) to its exit status."""

    def __init__(self, folder: Path, fail: Mapping[str, int] | None = None, seconds: float = 1.0):
        self.calls: list[tuple[str, float]] = []
        self.folder, self.fail, self.seconds = folder, dict(fail or {}), seconds
        self.now = 1_800_000_000.0
        self.summaries: list[str] = []

    def clock(self) -> float:
        return self.now

    def execute(self, argv: Sequence[str], log: TextIO, deadline_s: float) -> tuple[int, str]:
        self.calls.append((" ".join(argv), deadline_s))
        self.summaries.append(json.loads((self.folder / SUMMARY).read_text())["result"])
        self.now += self.seconds
        output = "created job/train-abc in training\n" if argv[0] == "submit" else f"ran {argv[0]}\n"
        log.write(output)
        return self.fail.get(argv[0], 0), output

    def probe(self, name: str) -> object:
        def run(args: Mapping[str, str], log: TextIO, deadline_s: float) -> ProbeOutcome:
            self.calls.append((f"probe {name} {sorted(args.items())}", deadline_s))
            self.now += self.seconds
            code = self.fail.get(name, 0)
            return ProbeOutcome(code, {"time_to_resume_s": 41.5} if name == "chaos" else {},
                                None if code == 0 else f"{name} said no")
        return run

    def run(self, steps: list[Step], keep: bool = False) -> tuple[object, list[str]]:
        summary = Run(steps, self.folder, "dev", COMMIT, False, keep, execute=self.execute,
                      probes={"chaos": self.probe("chaos"), "leftovers": self.probe("leftovers")},
                      clock=self.clock, monotonic=self.clock)()
        return summary, [call for call, _ in self.calls]


def test_every_step_runs_in_order_with_captures_figures_and_a_valid_bundle(tmp_path: Path) -> None:
    fake = Fake(tmp_path)
    summary, calls = fake.run(_steps())
    assert calls == ["do preflight", "policy config", "pulumi up", "submit spec.yaml", "watch train-abc",
                     "probe chaos [('job', 'train-abc')]", "delete train-abc", "pulumi destroy", "probe leftovers []"]
    assert summary.result == "passed" and summary.failed_step is None  # type: ignore[attr-defined]
    assert set(fake.summaries) == {"running"}  # the summary on disk while steps ran
    loaded = check_bundle(tmp_path)
    assert [step.status for step in loaded.steps] == ["passed"] * 5
    up = loaded.steps[1]
    assert up.figures == {"up_seconds": 1.0} and up.started == "2027-01-15T08:00:01Z"
    assert up.ended == "2027-01-15T08:00:03Z"
    assert loaded.steps[3].figures == {"time_to_resume_s": 41.5}
    assert loaded.steps[2].commands == ["submit spec.yaml", "watch train-abc"]
    assert (tmp_path / "03-allreduce.log").read_text().splitlines()[1:4] == [
        "$ submit spec.yaml", "created job/train-abc in training", "$ watch train-abc"]


def test_a_failed_step_stops_the_run_but_destroy_still_runs(tmp_path: Path) -> None:
    summary, calls = Fake(tmp_path, {"watch": 1}).run(_steps())
    assert calls[-2:] == ["pulumi destroy", "probe leftovers []"] and not any("chaos" in c for c in calls)
    loaded = load_summary(tmp_path)
    assert loaded.result == "failed" and loaded.failed_step == "allreduce"
    assert [step.status for step in loaded.steps] == ["passed", "passed", "failed", "not-run", "passed"]
    assert loaded.steps[2].exit_status == 1 and loaded.steps[2].note == "watch train-abc exited 1"
    assert loaded.steps[3].started is None and loaded.steps[3].log is None


def test_cleanup_actions_run_after_a_failure_inside_their_step(tmp_path: Path) -> None:
    _, calls = Fake(tmp_path, {"chaos": 1}).run(_steps())
    assert calls[5:7] == ["probe chaos [('job', 'train-abc')]", "delete train-abc"]
    assert load_summary(tmp_path).steps[3].note == "chaos said no"


def test_a_failure_before_up_never_destroys(tmp_path: Path) -> None:
    summary, calls = Fake(tmp_path, {"do": 2}).run(_steps())
    assert calls == ["do preflight"]
    assert [step.status for step in load_summary(tmp_path).steps] == ["failed"] + ["not-run"] * 4


def test_a_failed_up_still_destroys_what_it_began(tmp_path: Path) -> None:
    steps = _steps()
    steps[1] = _step("up", Command(("pulumi", "up")))
    _, calls = Fake(tmp_path, {"pulumi": 1}).run(steps)
    assert calls == ["do preflight", "pulumi up", "pulumi destroy"]  # destroy's own failure ends that step


def test_keep_skips_destroy_and_says_so(tmp_path: Path) -> None:
    _, calls = Fake(tmp_path).run(_steps(), keep=True)
    assert "pulumi destroy" not in calls
    summary = load_summary(tmp_path)
    assert summary.result == "passed" and summary.keep
    assert summary.steps[-1].status == "skipped" and "KEEP=1" in (summary.steps[-1].note or "")


def test_a_skipped_step_runs_nothing_and_the_run_still_passes(tmp_path: Path) -> None:
    steps = _steps()
    steps[0] = _step("burn-in", skip="the burn-in is off in stack dev")
    _, calls = Fake(tmp_path).run(steps)
    assert "do burn-in" not in calls
    summary = load_summary(tmp_path)
    assert summary.result == "passed" and summary.steps[0].status == "skipped"


def test_the_step_deadline_is_shared_by_its_commands(tmp_path: Path) -> None:
    fake = Fake(tmp_path, seconds=35)
    steps = [_step("up", Command(("a",)), Command(("b",)), Command(("c",)), Command(("d",), always=True),
                   deadline=60)]
    fake.run(steps)
    assert fake.calls == [("a", 60), ("b", 25), ("d", 300.0)]  # c: no time left; d: a cleanup's grace
    step = load_summary(tmp_path).steps[0]
    assert step.status == "failed" and step.exit_status == DEADLINE_EXIT
    assert step.note == "the step's deadline of 60 s passed"


def test_a_missing_capture_fails_the_step_by_name(tmp_path: Path) -> None:
    steps = [_step("allreduce", Command(("other",), capture=(("job", r"^created job/(\S+)"),)),
                   Command(("watch", "{job}")))]
    _, calls = Fake(tmp_path).run(steps)
    assert calls == ["other"]
    assert load_summary(tmp_path).steps[0].note.startswith("other printed no job")  # type: ignore[union-attr]


def test_the_summary_is_replaced_whole_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Fake(tmp_path)
    fake.run(_steps()[:1])
    before = (tmp_path / SUMMARY).read_bytes()

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(BundleWriteError) as raised:
        Fake(tmp_path).run(_steps()[:1])
    assert (raised.value.where, raised.value.why) == (str(tmp_path / SUMMARY), "No space left on device")
    assert (tmp_path / SUMMARY).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["01-preflight.log", SUMMARY]


def test_the_real_runner_kills_a_command_at_its_deadline() -> None:
    log = io.StringIO()
    code, output = run_command([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(30)"],
                               log, 0.5)
    assert code == DEADLINE_EXIT  # killed at its 0.5 s deadline (the 30 s sleep would exit 0)
    assert output == "started\n" == log.getvalue()


def test_the_real_runner_says_a_missing_command_is_not_installed() -> None:
    code, output = run_command(["no-such-command-here"], io.StringIO(), 5)
    assert code == 127 and output == "error: no-such-command-here: not installed (not on PATH)\n"


def test_a_probe_that_raises_fails_its_step_and_destroy_still_runs(tmp_path: Path) -> None:
    fake = Fake(tmp_path)

    def broken(args: Mapping[str, str], log: TextIO, deadline_s: float) -> ProbeOutcome:
        raise ConnectionError("api server unreachable\nmore detail")

    summary = Run(_steps(), tmp_path, "dev", COMMIT, False, False, execute=fake.execute,
                  probes={"chaos": broken, "leftovers": fake.probe("leftovers")}, clock=fake.clock,
                  monotonic=fake.clock)()
    assert summary.failed_step == "chaos" and summary.steps[-1].status == "passed"
    assert summary.steps[3].note == "probe chaos: ConnectionError: api server unreachable"
    assert [call for call, _ in fake.calls][-3:] == ["delete train-abc", "pulumi destroy", "probe leftovers []"]


def test_a_cleanup_that_cannot_run_keeps_the_first_failure(tmp_path: Path) -> None:
    steps = [_step("allreduce", Command(("submit", "spec.yaml"), capture=(("job", r"^created job/(\S+) in "),)),
                   Command(("watch", "{job}")), Command(("logs", "{job}"), always=True))]
    _, calls = Fake(tmp_path, {"submit": 2}).run(steps)
    assert calls == ["submit spec.yaml"]
    step = load_summary(tmp_path).steps[0]
    assert (step.exit_status, step.note) == (2, "submit spec.yaml exited 2")


def test_a_failed_watch_still_reads_the_logs_for_the_figures(tmp_path: Path) -> None:
    steps = [_step("allreduce", Command(("submit", "spec.yaml"), capture=(("job", r"^created job/(\S+) in "),)),
                   Command(("watch", "{job}")), Command(("logs", "{job}"), always=True),
                   figures=lambda results: {"last": results[-1].output.strip()})]
    _, calls = Fake(tmp_path, {"watch": 1}).run(steps)
    assert calls == ["submit spec.yaml", "watch train-abc", "logs train-abc"]
    step = load_summary(tmp_path).steps[0]
    assert step.status == "failed" and step.figures == {"last": "ran logs"}


def test_an_interrupted_command_gets_a_grace_then_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during a command that ignores SIGTERM (a pulumi finishing its in-flight operations): SIGKILL once the
    grace has passed, and the Ctrl-C goes on up (the step fails, destroy follows)."""
    import signal
    import threading

    from infra.acceptance import runner

    monkeypatch.setattr(runner, "INTERRUPT_GRACE_S", 0.3)
    # Ctrl-C is Python's default handler here whatever an earlier test in this worker left installed (a SIGINT
    # ignored in-process turned this test into a 30 s wait and "DID NOT RAISE" in a full run)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    child = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
             "time.sleep(30)")
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    log, pids = io.StringIO(), []
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_command([sys.executable, "-c", child], log, 20, started=pids.append)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    # a liveness bound, not a timing claim: without the grace's SIGKILL this returns when the child's 30 s sleep ends
    assert time.monotonic() - began < 15 and log.getvalue() == "up\n"
    with pytest.raises(ProcessLookupError):
        os.killpg(pids[0], 0)


@pytest.mark.parametrize(("fail", "ours"), [({"pulumi": DEADLINE_EXIT}, "up"), ({"pulumi": 130}, "up"),
                                            ({"pulumi": 1}, ""), ({}, "")])
def test_destroy_knows_whether_up_was_interrupted(tmp_path: Path, fail: dict[str, int], ours: str) -> None:
    """A command killed at its deadline or by Ctrl-C may leave its work half done: `{interrupted?}` names its step
    for the stack-state check before destroy (empty when nothing was interrupted)."""
    fake = Fake(tmp_path, fail)
    steps = [_step("up", Command(("pulumi", "up"))),
             _step("destroy", Probe("stack_state", (("ours", "{interrupted?}"),)), after_up=True)]
    Run(steps, tmp_path, "dev", COMMIT, False, False, execute=fake.execute,
        probes={"stack_state": fake.probe("stack_state")}, clock=fake.clock, monotonic=fake.clock)()
    assert [call for call, _ in fake.calls] == ["pulumi up", f"probe stack_state [('ours', '{ours}')]"]
