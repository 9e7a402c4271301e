"""What an interrupted `pulumi up` leaves behind, found and repaired the way Pulumi documents it, before `up` and before
`destroy`:

- a lock: the Pulumi Cloud answers a new update with `[409] Conflict: Another update is currently in progress.`
  (the service's message, formatted `[%d] %s` by pulumi's apitype ErrorResponse), the self-managed (DIY) backends
  with `the stack is currently locked by N lock(s). Either wait for the other process(es) to end or delete the lock
  file with `pulumi cancel`.` and one line per lock, `<url>: created by <user>@<host> (pid <N>) at <time>`. Both texts
  are the ones the Automation API classifies as a concurrent update (pulumi 3.272.0,
  `pulumi/automation/errors.py`). The repair is `pulumi cancel --yes`, done only when the lock is provably not
  a live update of someone else: a DIY lock of this host whose process is gone, or a lock this kit's own
  interrupted `up` left (`ours`). A lock of a live process, or another's, is refused with one line.
- pending operations (`deployment.pending_operations` of `pulumi stack export`: resources the CLI was changing when
  it stopped): `pulumi refresh --clear-pending-creates` (pending creates dropped from the state; the refresh reads
  the rest back from the providers), and when that refresh fails, `pulumi stack export` + `pulumi stack import`,
  which removes every pending operation from the snapshot. A pending create that did create something is then in
  no state: destroy's leftovers search finds it by the stack's tags.

Every command has its own deadline within the step's; the outcome is one line saying what was done.
"""

from __future__ import annotations

import json
import re
import socket
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from infra.acceptance.runlock import process_alive
from infra.acceptance.runner import DEADLINE_EXIT, CommandRunner, ProbeFn, ProbeOutcome, run_command

CLOUD_LOCKED = "[409] Conflict: Another update is currently in progress."
DIY_LOCKED = "the stack is currently locked by"
NO_STACK = re.compile(r"no stack named '[^']*' found")
DIY_LOCK_LINE = re.compile(r"^\s*(\S+): created by (\S+)@(\S+) \(pid (\d+)\) at (\S+)\s*$", re.MULTILINE)
# each command's share of the step's deadline at most, seconds
EXPORT_S, CANCEL_S, REFRESH_S, IMPORT_S = 120.0, 120.0, 1800.0, 300.0


@dataclass(frozen=True)
class Lock:
    kind: str  # "cloud" or "diy"
    holders: tuple[tuple[str, str, int], ...] = ()  # DIY: (user, host, pid) per lock file

    def line(self) -> str:
        if self.kind == "cloud":
            return "the Pulumi Cloud has an update of it in progress"
        return "locked by " + ", ".join(f"{user}@{host} pid {pid}" for user, host, pid in self.holders)


def lock_in(output: str) -> Lock | None:
    """The lock a failed pulumi command reports, from its output; None when it reports none."""
    if CLOUD_LOCKED in output:
        return Lock("cloud")
    if DIY_LOCKED in output:
        return Lock("diy", tuple((m.group(2), m.group(3), int(m.group(4))) for m in DIY_LOCK_LINE.finditer(output)))
    return None


def stale(lock: Lock, host: str, alive: Callable[[int], bool]) -> bool | None:
    """A DIY lock whose every holder is a process of this host that is gone: True; one that runs: False; a lock
    that does not say (the Cloud's) or names another host: None."""
    if lock.kind != "diy" or not lock.holders or any(holder_host != host for _, holder_host, _ in lock.holders):
        return None
    return not any(alive(pid) for _, _, pid in lock.holders)


def pending_operations(export: str) -> list[tuple[str, str]]:
    """(operation, URN) of each pending operation in `pulumi stack export`'s JSON."""
    document = json.loads(export)
    deployment = document.get("deployment") if isinstance(document, dict) else None
    operations = deployment.get("pending_operations") if isinstance(deployment, dict) else None
    found = []
    for operation in operations if isinstance(operations, list) else []:
        if isinstance(operation, dict):
            resource = operation.get("resource")
            resource = resource if isinstance(resource, dict) else {}
            found.append((str(operation.get("type", "?")), str(resource.get("urn", "?"))))
    return found


def _error(output: str) -> str:
    errors = [line.strip() for line in output.splitlines() if line.strip().startswith("error:")]
    return (errors or [line.strip() for line in output.splitlines() if line.strip()] or ["no output"])[0][:300]


class Recovery:
    """One repair of stack `stack`: each command through `execute` (the runner's: its own process group, killed at
    its deadline), every line into the step's log."""

    def __init__(self, stack: str, ours: bool, log: TextIO, deadline_s: float, execute: CommandRunner,
                 clock: Callable[[], float], host: str, alive: Callable[[int], bool]):
        self.stack, self.ours, self.log, self.execute = stack, ours, log, execute
        self.clock, self.host, self.alive = clock, host, alive
        self.ends = clock() + deadline_s
        self.done: list[str] = []

    def pulumi(self, cap_s: float, *words: str) -> tuple[int, str]:
        left = self.ends - self.clock()
        if left <= 0:
            return DEADLINE_EXIT, ""
        return self.execute(("pulumi", *words, "--stack", self.stack), self.log, min(cap_s, left))

    def export(self, folder: Path) -> tuple[int, str, list[tuple[str, str]]]:
        path = folder / "state.json"
        code, output = self.pulumi(EXPORT_S, "stack", "export", "--file", str(path))
        if code != 0:
            return code, output, []
        try:
            return 0, output, pending_operations(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
            return 1, f"error: {path}: not a readable stack export ({type(exc).__name__}: {exc})", []

    def unlock(self, output: str) -> ProbeOutcome | None:
        """`pulumi cancel` of a lock `output` reports, when it is safe; the refusal otherwise."""
        lock = lock_in(output)
        if lock is None:
            return None
        is_stale = stale(lock, self.host, self.alive)
        if is_stale is False:
            _, _, pid = next(h for h in lock.holders if self.alive(h[2]))
            return ProbeOutcome(1, note=f"stack {self.stack}: {lock.line()}, and pid {pid} still runs: let it end "
                                        f"(or stop it: kill -INT {pid}) and run again")
        if not (is_stale or self.ours):
            return ProbeOutcome(1, note=f"stack {self.stack}: {lock.line()}, not by this kit's own interrupted up: "
                                        "wait for that update to end; `pulumi cancel` only if it is yours")
        code, text = self.pulumi(CANCEL_S, "cancel", "--yes")
        if code != 0:
            return ProbeOutcome(code, note=f"pulumi cancel --stack {self.stack} exited {code}: {_error(text)}")
        self.done.append(f"pulumi cancel ({lock.line()}{', its process gone' if is_stale else ''})")
        return None

    def refresh(self) -> tuple[int, str]:
        return self.pulumi(REFRESH_S, "refresh", "--yes", "--non-interactive", "--skip-preview",
                           "--clear-pending-creates")

    def __call__(self) -> ProbeOutcome:
        with tempfile.TemporaryDirectory(prefix="acceptance-state-") as tmp:  # the state stays out of the bundle
            folder = Path(tmp)
            code, output, pending = self.export(folder)
            if code != 0:
                if NO_STACK.search(output):
                    return ProbeOutcome(0, {"stack_state": f"no stack {self.stack} yet: nothing to recover"})
                return ProbeOutcome(code, note=f"pulumi stack export --stack {self.stack} exited {code}: "
                                               f"{_error(output)}")
            if not pending and not self.ours:
                return ProbeOutcome(0, {"stack_state": "no pending operations; not interrupted: nothing to do"})
            code, output = self.refresh()
            if code != 0 and lock_in(output):
                refused = self.unlock(output)
                if refused is not None:
                    return refused
                code, output = self.refresh()
            if code == 0:
                self.done.append(f"pulumi refresh --clear-pending-creates ({len(pending)} pending operation(s))")
            elif pending:  # the providers cannot read everything back: drop the pending operations from the state
                self.log.write(f"refresh failed ({_error(output)}): export + import instead\n")
                code, output, pending = self.export(folder)
                if code == 0:
                    code, output = self.pulumi(IMPORT_S, "stack", "import", "--file", str(folder / "state.json"))
                if code != 0:
                    return ProbeOutcome(code, note=f"stack {self.stack}: {len(pending)} pending operation(s) not "
                                                   f"cleared: {_error(output)}")
                self.done.append(f"pulumi stack export + import ({len(pending)} pending operation(s) removed)")
            else:
                return ProbeOutcome(code, note=f"pulumi refresh --stack {self.stack} exited {code}: {_error(output)}")
        creates = [urn for op, urn in pending if op == "creating"]
        line = "; ".join(self.done) + (f"; {len(creates)} pending create(s) dropped: if created, the leftovers "
                                       f"check finds them by tag ({creates[0]})" if creates else "")
        self.log.write(f"stack_state: {line}\n")
        return ProbeOutcome(0, {"stack_state": line})


def stack_state_probe(execute: CommandRunner = run_command, clock: Callable[[], float] | None = None,
                      host: str | None = None, alive: Callable[[int], bool] = process_alive) -> ProbeFn:
    """The probe `stack_state` (args: stack; ours: non-empty when this kit's own `up` was interrupted)."""
    import time

    def probe(args: Mapping[str, str], log: TextIO, deadline_s: float) -> ProbeOutcome:
        return Recovery(args["stack"], bool(args.get("ours")), log, deadline_s, execute, clock or time.monotonic,
                        host or socket.gethostname(), alive)()
    return probe
