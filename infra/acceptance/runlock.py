"""One acceptance run per stack at a time, and what a run that died (kill -9, a lost laptop) left behind.

A run holds `<evidence>/.<stack>.run` (JSON: its pid, host, start, bundle, and the process group of the command it
is running), created exclusively (a temp file hard-linked into place) and removed when the run ends. The next run
reads one it finds:
- its runner still runs (this host): refused, one line;
- written on another host: refused (this host cannot tell whether it runs), one line saying how to clear it;
- its runner is gone but the command it ran is not (a `pulumi up` in its own process group outlives a SIGKILL of its
  runner until its next write to the closed pipe): refused, naming the pid to wait for or stop;
- runner and command gone: a dead run. Its bundle keeps what it last wrote whole (summary.json says which step was
  `running`); its half-written temp files are removed; when its `up` had begun, the new run's stack-state step
  repairs the lock and pending operations it left (stackstate.py). The new run takes the lock over and records the
  dead one in its summary's `previous_run`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.acceptance.bundle import BundleError, load_summary
from workloads.safeio import StateFileError, atomic_write_in, read_text_file

PARTIAL = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # workloads.safeio.atomic_write_in's temp files


class RunLockError(Exception):
    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


def lock_path(evidence: Path, stack: str) -> Path:
    return evidence / f".{stack}.run"


def process_alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """The process runs: it exists and, on Linux, is not a zombie (one that exited but nobody reaped yet, as under
    a container's init that reaps late, runs nothing: group_alive's rule)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def start_time(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The process's start time in clock ticks since boot (Linux /proc/<pid>/stat field 22), None where unknown:
    with the pid it names one process even after the pid is reused."""
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def group_alive(pgid: int, proc: Path = Path("/proc")) -> bool:
    """A process of group `pgid` runs: on Linux from /proc (a zombie nobody reaped runs nothing), else killpg."""
    if proc.is_dir():
        for stat in proc.glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
                if int(fields[2]) == pgid and fields[0] != "Z":
                    return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class DeadRun:
    """An earlier run of the stack whose runner is gone."""

    lock: Path
    text: str  # the lock file as read (taken over only if unchanged)
    pid: int
    bundle: Path
    step: str | None  # the step its summary says was running (None: it died before or between steps)
    up_began: bool
    partial: tuple[Path, ...]  # its half-written temp files

    def line(self) -> str:
        where = f"during step {self.step}" if self.step else "between steps"
        then = ("; this run's stack-state step repairs the lock and pending operations its `up` may have left"
                if self.up_began else "; its `up` had not begun")
        return (f"the run in {self.bundle} died {where} (pid {self.pid} gone); its bundle stays as it last wrote it"
                f"{f', less {len(self.partial)} half-written file(s)' if self.partial else ''}{then}")


def _record(path: Path) -> tuple[str, dict[str, object]]:
    try:
        text = read_text_file(path, 64 * 1024)
        record = json.loads(text)
    except (StateFileError, json.JSONDecodeError, RecursionError) as exc:
        raise RunLockError(str(path), f"not a run lock ({exc}): if no acceptance run of this stack is going, "
                                      "remove it") from None
    fields = {"pid": int, "host": str, "started": str, "bundle": str}
    if not isinstance(record, dict) or any(not isinstance(record.get(k), t) or isinstance(record.get(k), bool)
                                           for k, t in fields.items()):
        raise RunLockError(str(path), "not a run lock (pid, host, started, bundle): if no acceptance run of this "
                                      "stack is going, remove it")
    return text, record


def inspect(evidence: Path, stack: str, host: str | None = None,
            alive: Callable[[int], bool] = process_alive,
            group: Callable[[int], bool] = group_alive) -> DeadRun | None:
    """None when no run of `stack` holds the lock; the dead run it left; RunLockError (one line) for a run that
    may still be going."""
    path = lock_path(evidence, stack)
    if not path.exists() and not path.is_symlink():
        return None
    text, record = _record(path)
    pid, bundle, started = int(record["pid"]), Path(str(record["bundle"])), record["started"]  # type: ignore[call-overload]
    if record["host"] != (host or socket.gethostname()):
        raise RunLockError(str(path), f"a run of {stack} started on host {record['host']} at {started} (pid {pid}, "
                                      f"{bundle}): if it is gone, remove this file")
    recorded = record.get("pid_start")
    if alive(pid) and not (isinstance(recorded, int) and start_time(pid) not in (None, recorded)):
        raise RunLockError(str(path), f"another acceptance run of {stack} is going (pid {pid}, since {started}, "
                                      f"{bundle}): wait for it, or stop it (kill -INT {pid}: it destroys what it "
                                      "began)")
    child = record.get("child")
    if isinstance(child, int) and group(child):
        raise RunLockError(str(path), f"the run in {bundle} died (pid {pid} gone), but the command it ran, "
                                      f"{record.get('command', '?')}, still runs (process group {child}): let it "
                                      f"end or stop it (kill -INT -{child}), then run again")
    step, up_began = None, False
    with contextlib.suppress(BundleError):
        summary = load_summary(bundle)
        step = next((s.name for s in summary.steps if s.status == "running"), None)
        up_began = any(s.name == "up" and s.status != "not-run" and s.status != "skipped" for s in summary.steps)
    partial = tuple(sorted(p for p in bundle.iterdir() if PARTIAL.match(p.name))) if bundle.is_dir() else ()
    return DeadRun(path, text, pid, bundle, step, up_began, partial)


class RunLock:
    """The lock this run holds; `child()` records the command it runs, `release()` ends it."""

    def __init__(self, path: Path, record: dict[str, object]):
        self.path, self.record = path, record

    def _write(self) -> None:
        atomic_write_in(self.path.parent, self.path.name, json.dumps(self.record).encode(), create_dir=False)

    def child(self, pgid: int, command: str) -> None:
        self.record.update(child=pgid, command=command[:200])
        with contextlib.suppress(OSError):  # a full disk: the run goes on; the next run then knows less
            self._write()

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def claim(evidence: Path, stack: str, bundle: Path, started: str, dead: DeadRun | None) -> RunLock:
    """Take the lock of `stack` (taking over `dead`'s, whose half-written files go); RunLockError when another run
    took it first."""
    path = lock_path(evidence, stack)
    try:
        evidence.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunLockError(str(evidence), exc.strerror or str(exc)) from None
    if dead is not None:
        for partial in dead.partial:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        try:
            now = read_text_file(path, 64 * 1024)
        except (StateFileError, OSError):
            now = None
        if now is not None and now != dead.text:
            raise RunLockError(str(path), f"another run of {stack} took the lock first")
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    record: dict[str, object] = {"pid": os.getpid(), "pid_start": start_time(os.getpid()),
                                 "host": socket.gethostname(), "started": started, "bundle": str(bundle)}
    tmp = evidence / f".{stack}.run.{secrets.token_hex(6)}.new"
    try:
        with tmp.open("x", encoding="utf-8") as file:
            file.write(json.dumps(record))
            file.flush()
            os.fsync(file.fileno())
        os.link(tmp, path)  # exclusive: fails when the file exists
    except OSError as exc:
        if exc.errno == errno.EEXIST and exc.filename2 is not None:
            raise RunLockError(str(path), f"another run of {stack} took the lock first") from None
        raise RunLockError(str(exc.filename or path), exc.strerror or str(exc)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return RunLock(path, record)
