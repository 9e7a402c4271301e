"""Run the planned steps in order, each within its deadline, into an evidence bundle.

A failed step stops the run: the steps after it are recorded as not-run, except destroy, which runs whenever `up`
began (a half-created stack is the costliest thing to leave), unless keep (KEEP=1). Ctrl-C fails the running step
the same way. summary.json is rewritten whole (temp + rename) after every step, so the bundle always holds a
readable summary of what happened so far (result `running` until the end).

A bundle file that cannot be written (a full disk) stops the run like a failed step (destroy still runs once `up`
began; a command's output is still read, so it never stalls on a full pipe) and the run ends in BundleWriteError
naming the first such file; the summary on disk is then the last one written whole.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol, TextIO, cast

from infra.acceptance.bundle import BundleWriteError, Figure, StepRecord, Summary, write_summary
from infra.acceptance.plan import Action, ActionResult, Command, Probe, Step

DEADLINE_EXIT = 124  # as timeout(1)
NOT_FOUND_EXIT = 127  # as a shell for a missing command
CLEANUP_S = 300.0  # what an `always` action gets after its step's deadline passed
KILL_GRACE_S = 10.0
# What an interrupted command gets to stop on its own after SIGTERM: pulumi then cancels its update, finishing the
# resource operations in flight and releasing its lock (pkg/backend/cancellation_scope.go); past it, SIGKILL, and
# the stack-state step repairs what is left.
INTERRUPT_GRACE_S = 60.0


@dataclass(frozen=True)
class ProbeOutcome:
    exit_status: int  # 0 passed, 1 failed, DEADLINE_EXIT its deadline passed
    figures: Mapping[str, Figure] = field(default_factory=dict)
    note: str | None = None


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], log: TextIO, deadline_s: float) -> tuple[int, str]:
        """Run argv to its end or its deadline; its output goes to `log` as it comes and is returned too."""


ProbeFn = Callable[[Mapping[str, str], TextIO, float], ProbeOutcome]


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_command(argv: Sequence[str], log: TextIO, deadline_s: float,
                started: Callable[[int], None] | None = None) -> tuple[int, str]:
    """The real runner: its own process group (killed whole at the deadline: TERM, then KILL), output teed;
    `started(pid)` once it runs (the pid is its process group's id)."""
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, text=True, errors="replace")
    except FileNotFoundError:
        line = f"error: {argv[0]}: not installed (not on PATH)\n"
        log.write(line)
        return NOT_FOUND_EXIT, line
    if started is not None:
        started(proc.pid)
    chunks: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout

    def pump() -> None:
        logging = True
        for line in stdout:  # read to the end whatever happens to the log: a full pipe would stall the command
            chunks.append(line)
            if logging:
                try:
                    log.write(line)
                    log.flush()
                except OSError:
                    logging = False

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=max(deadline_s, 0.0))
    except subprocess.TimeoutExpired:
        code = DEADLINE_EXIT
        for sig, grace in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        proc.wait()
    except BaseException:  # Ctrl-C: the command goes with us, given a while to stop cleanly (pulumi cancels)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=INTERRUPT_GRACE_S)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):  # or a second Ctrl-C: now
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    reader.join(timeout=KILL_GRACE_S)
    return code, "".join(chunks)


class StepLog(io.TextIOBase):
    """A step's log file that survives a full disk: the first failed write is kept in `error` and later writes are
    dropped (the caller still reads its command's output to the end); line-buffered, fsynced when closed."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = path
        self.error: OSError | None = None
        try:
            self._file: TextIO | None = path.open("w", encoding="utf-8", buffering=1)
        except OSError as exc:
            self._file = None
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self.error is None:
            self.error = OSError(exc.errno, exc.strerror or str(exc), str(self.path))
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):
                file.close()  # the unwritten rest of its buffer is dropped with it

    def _try(self, act: Callable[[TextIO], object]) -> None:
        if self._file is not None:
            try:
                act(self._file)
            except OSError as exc:
                self._failed(exc)

    def write(self, text: str) -> int:
        self._try(lambda file: file.write(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:  # type: ignore[override]
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._try(lambda file: file.flush())

    def close(self) -> None:
        def synced(file: TextIO) -> None:
            file.flush()
            os.fsync(file.fileno())
            file.close()

        self._try(synced)
        self._file = None
        super().close()


class MissingCapture(LookupError):
    pass


def fill(text: str, captures: Mapping[str, str]) -> str:
    """`{name}` -> the captured value (MissingCapture when there is none); `{name?}` -> the value or ""."""
    def value(match: re.Match[str]) -> str:
        if match.group(1) not in captures:
            if match.group(2):
                return ""
            raise MissingCapture(match.group(1))
        return captures[match.group(1)]

    return re.sub(r"\{([a-z_]+)(\??)\}", value, text)


def filled(action: Action, captures: Mapping[str, str]) -> Action:
    if isinstance(action, Command):
        return Command(tuple(fill(word, captures) for word in action.argv), action.capture, action.always)
    return Probe(action.probe, tuple((key, fill(value, captures)) for key, value in action.args), action.always)


@dataclass
class Run:
    """One acceptance run: the steps, where the bundle goes, and how commands and probes are executed."""

    steps: Sequence[Step]
    folder: Path
    stack: str
    git_commit: str
    git_dirty: bool
    keep: bool
    execute: CommandRunner = run_command
    probes: Mapping[str, ProbeFn] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    captures: dict[str, str] = field(default_factory=dict)
    report: Callable[[StepRecord], None] = lambda record: None
    bundle_error: BundleWriteError | None = None  # the first bundle file that could not be written
    previous_run: str | None = None  # an earlier run of the stack that died, and what was done about it

    def _wrote(self, error: OSError | None, fallback: Path) -> None:
        if error is not None and self.bundle_error is None:
            self.bundle_error = BundleWriteError.of(error, fallback)

    def _save(self, summary: Summary) -> None:
        try:
            write_summary(self.folder, summary)
        except OSError as exc:
            self._wrote(exc, self.folder / "summary.json")

    def _act(self, action: Action, log: TextIO, remaining: float) -> ActionResult:
        started = self.monotonic()
        if isinstance(action, Command):
            code, output = self.execute(action.argv, log, remaining)
            figures: Mapping[str, Figure] = {}
            note = None
        else:
            probe = self.probes.get(action.probe)
            if probe is None:
                outcome = ProbeOutcome(1, note=f"probe {action.probe}: not available")
            else:
                try:
                    outcome = probe(dict(action.args), log, remaining)
                except Exception as exc:  # an API error ends the step, never the run (destroy must still run)
                    first = (str(exc).strip().splitlines() or [""])[0][:300]
                    outcome = ProbeOutcome(1, note=f"probe {action.probe}: {type(exc).__name__}: {first}")
            code, output, figures, note = outcome.exit_status, "", outcome.figures, outcome.note
            if note:
                log.write(f"{note}\n")
        return ActionResult(code, note or output, self.monotonic() - started, figures)

    def _capture(self, action: Action, result: ActionResult) -> str | None:
        """Store what the action prints for later ones; the problem when it printed none of it."""
        if not isinstance(action, Command):
            return None
        for name, pattern in action.capture:
            match = re.search(pattern, result.output, re.MULTILINE)
            if match is None:
                return f"{action.shell()} printed no {name} (/{pattern}/)"
            self.captures[name] = match.group(1)
        return None

    def run_step(self, number: int, step: Step) -> StepRecord:
        log_name = f"{number:02d}-{step.name}.log"
        started = self.clock()
        began = self.monotonic()
        results: list[ActionResult] = []
        shown: list[str] = []
        exit_status: int | None = None
        note: str | None = None
        log = StepLog(self.folder / log_name)
        try:
            log.write(f"# step {step.name}: deadline {step.deadline_s:g} s, started {utc(started)}\n")
            for action in step.actions:
                if note is not None and not action.always:
                    continue
                remaining = step.deadline_s - (self.monotonic() - began)
                if action.always:
                    remaining = max(remaining, CLEANUP_S)
                elif remaining <= 0:
                    exit_status, note = DEADLINE_EXIT, f"the step's deadline of {step.deadline_s:g} s passed"
                    continue
                try:
                    action = filled(action, self.captures)
                except MissingCapture as missing:
                    if note is None:
                        exit_status, note = 1, f"no {missing} to run {action.shell()}"
                    continue
                shown.append(action.shell())
                log.write(f"$ {action.shell()}\n")
                log.flush()
                try:
                    result = self._act(action, cast(TextIO, log), remaining)
                except KeyboardInterrupt:
                    result = ActionResult(130, "interrupted (Ctrl-C)", self.monotonic() - began)
                results.append(result)
                if result.exit_status in (DEADLINE_EXIT, 130):  # what it was doing may be left half done
                    self.captures["interrupted"] = step.name
                problem = self._capture(action, result) if result.exit_status == 0 else None
                if note is None and (result.exit_status != 0 or problem):
                    exit_status = result.exit_status or 1
                    note = problem or self._failure_note(action, result, step)
                elif note is None:
                    exit_status = result.exit_status
            figures: dict[str, Figure] = {}
            if step.figures is not None and results:
                try:
                    figures = step.figures(results)
                except (ValueError, KeyError, IndexError, TypeError) as exc:
                    log.write(f"figures: not read ({type(exc).__name__}: {exc})\n")
            ended = self.clock()
            log.write(f"# step {step.name}: {'failed: ' + note if note else 'passed'}, ended {utc(ended)}\n")
        finally:
            log.close()
        status: Literal["passed", "failed"] = "failed" if note else "passed"
        if log.error is not None:  # the step's own result stands (a destroy that passed did destroy)
            self._wrote(log.error, log.path)
            note = f"{note + '; ' if note else ''}{log_name}: {log.error.strerror}: the log is incomplete"
        return StepRecord(name=step.name, commands=shown or [a.shell() for a in step.actions],
                          status=status, started=utc(started), ended=utc(ended),
                          exit_status=exit_status if exit_status is not None else 0, deadline_s=step.deadline_s,
                          log=log_name, figures=figures, note=note)

    @staticmethod
    def _failure_note(action: Action, result: ActionResult, step: Step) -> str:
        if result.exit_status == DEADLINE_EXIT:
            return f"the step's deadline of {step.deadline_s:g} s passed during {action.shell()}"
        if result.exit_status == 130:
            return f"interrupted (Ctrl-C) during {action.shell()}"
        if isinstance(action, Probe):
            return result.output.splitlines()[-1] if result.output else f"{action.shell()} failed"
        errors = [line for line in result.output.splitlines() if line.startswith("error:")]
        return f"{action.shell()} exited {result.exit_status}" + (f": {errors[0]}" if errors else "")

    def summary(self, records: Sequence[StepRecord], started: float, ended: float | None) -> Summary:
        failed = next((record.name for record in records if record.status == "failed"), None)
        result: Literal["passed", "failed", "running"] = (
            "running" if ended is None else "failed" if failed or self.bundle_error else "passed")
        return Summary(schema="ml-cluster/acceptance-summary/v1", stack=self.stack, git_commit=self.git_commit,
                       git_dirty=self.git_dirty, started=utc(started), ended=None if ended is None else utc(ended),
                       result=result, failed_step=failed, keep=self.keep, steps=list(records),
                       bundle_error=None if self.bundle_error is None else str(self.bundle_error),
                       previous_run=self.previous_run)

    def __call__(self) -> Summary:
        started = self.clock()
        records = [StepRecord(name=step.name, commands=[a.shell() for a in step.actions], status="not-run",
                              deadline_s=step.deadline_s) for step in self.steps]
        self._save(self.summary(records, started, None))
        stopped = up_began = False
        for index, step in enumerate(self.steps):
            if step.after_up and self.keep:
                if up_began:
                    records[index] = records[index].model_copy(update={
                        "status": "skipped", "note": f"KEEP=1: the stack stays up (make destroy STACK={self.stack})"})
                continue
            stopped = stopped or self.bundle_error is not None
            if stopped and not (step.after_up and up_began):
                continue
            if step.skip is not None:
                records[index] = records[index].model_copy(update={"status": "skipped", "note": step.skip})
                continue
            up_began = up_began or step.name == "up"
            records[index] = records[index].model_copy(update={  # what a runner killed here leaves on disk
                "status": "running", "started": utc(self.clock()), "log": f"{index + 1:02d}-{step.name}.log"})
            self._save(self.summary(records, started, None))
            records[index] = self.run_step(index + 1, step)
            self.report(records[index])
            stopped = stopped or records[index].status == "failed"
            self._save(self.summary(records, started, None))
        summary = self.summary(records, started, self.clock())
        self._save(summary)
        if self.bundle_error is not None:
            raise self.bundle_error
        return summary
