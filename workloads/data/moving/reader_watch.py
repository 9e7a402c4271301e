"""What the stager knows of its reader (stage.py, cache mode): the reader's plan, read again every poll interval and
checked against the manifest, and the stager's waits on it (for space while the cache holds only shards the reader
needs first, or for the plan to move on), each logged and bounded by --wait-timeout."""

from __future__ import annotations

import sys
import time
from collections.abc import Container
from pathlib import Path

from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import PLAN_STATE
from workloads.data.moving.cache import ReadPlan, cache_dir, plan_file
from workloads.safeio import StateFile, StateFileError

_LONG_WAIT_S = 60.0  # a wait for the reader this long is logged again (the first one always is)


def _quoted(name: str, limit: int = 80) -> str:
    """A name from another container's file, safe for a one-line message (repr escapes control characters)."""
    return repr(name[:limit]) + ("..." if len(name) > limit else "")


def read_checked_plan(dest: Path, names: Container[str], source: StateFile | None = None) -> ReadPlan | None:
    """The reader's plan, or None while there is none; a broken plan.json (not a regular file, a link, too large,
    not JSON, a field of the wrong type), or one naming a shard the manifest does not list, is a one-line error (the
    reader is another container: its files are untrusted input). `source` keeps the last parse: the plan is parsed
    again only when the file changed."""
    source = source or plan_file(dest)
    where = str(source.path)
    try:
        plan = source.read()
    except StateFileError as exc:
        raise DataToolError(where, exc.why if exc.where == where else str(exc)) from exc
    if plan is not None:
        for name in plan.order:
            if name not in names:
                raise DataToolError(where, f"names {_quoted(name)}, which is not a shard of the manifest")
    return plan


class ReaderWatch:
    """The reader's plan as the stager last read it, and how long the stager has been waiting on the reader."""

    def __init__(self, dest: Path, names: Container[str], *, serving: bool, poll_interval_s: float,
                 first_plan_wait_s: float, wait_timeout_s: float | None) -> None:
        self.dest = dest
        self.names = names
        self.serving = serving
        self.poll_interval_s = poll_interval_s
        self.wait_timeout_s = wait_timeout_s
        self.plan: ReadPlan | None = None
        self._plan_file = plan_file(dest)
        self._plan_read_at: float | None = None
        self._plan_changed_at = time.monotonic()  # when the plan last changed (or the run started)
        self._waiting_since: float | None = None
        self._first_plan_deadline = time.monotonic() + first_plan_wait_s
        self._told_waiting = False
        self._told_reader_wait = False
        self._told_long_wait = False

    def refresh(self, force: bool = False) -> None:
        """Read the plan again, at most once per poll interval; a changed plan restarts the wait-timeout clock."""
        now = time.monotonic()
        if not self.serving or (not force and self._plan_read_at is not None
                                and now - self._plan_read_at < self.poll_interval_s):
            return
        self._plan_read_at = now
        plan = read_checked_plan(self.dest, self.names, self._plan_file)
        if plan != self.plan:
            self.plan = plan
            self._plan_changed_at = now
            self.not_waiting()

    def starting(self) -> bool:
        """The reader has not written a first plan yet, and may still (first_plan_wait_s)."""
        return self.serving and self.plan is None and time.monotonic() < self._first_plan_deadline

    def _tell_waiting(self, name: str, plan_path: Path, waited: float, held_bytes: int, budget: int | None) -> None:
        plan = "a plan" if self.plan is None else "the plan to move on"
        print(f"stage: cache full ({held_bytes} of {budget} bytes, all of it shards the reader needs "
              f"first); waiting for {plan} in {plan_path} before fetching {name}"
              + (f" (for {waited:.0f}s now)" if waited >= 1 else ""), file=sys.stderr, flush=True)

    def not_waiting(self) -> None:
        self._waiting_since = None
        self._told_long_wait = False

    def wait_for_space(self, name: str, held_bytes: int, budget: int | None) -> None:
        """Log (the first wait, and a wait that lasts) and apply --wait-timeout while `name` waits for space."""
        now = time.monotonic()
        plan_path = cache_dir(self.dest) / PLAN_STATE
        if self._waiting_since is None:
            self._waiting_since = now
        waited = now - self._waiting_since
        if not self._told_waiting:  # the first wait of the run
            self._told_waiting = True
            self._tell_waiting(name, plan_path, waited, held_bytes, budget)
        elif waited >= _LONG_WAIT_S and not self._told_long_wait:  # a reader that stopped moving
            self._told_long_wait = True
            self._tell_waiting(name, plan_path, waited, held_bytes, budget)
        timeout = self.wait_timeout_s
        if timeout is not None and waited > timeout:
            what = "there was no plan" if self.plan is None else "the plan did not change"
            raise DataToolError(str(plan_path), f"{what} for {timeout:g}s while the cache was full and {name} waited "
                                                f"for space (--wait-timeout); is the training container reading "
                                                f"{self.dest}?", runtime=True)

    def wait_for_reader(self) -> None:
        """Log (once, and again when it lasts) and apply --wait-timeout while the stager waits for the reader: a
        reader that never comes, or stopped moving, fails the stager instead of keeping it forever."""
        now = time.monotonic()
        plan_path = cache_dir(self.dest) / PLAN_STATE
        if self._waiting_since is None:
            self._waiting_since = max(now, self._plan_changed_at) if self.plan is not None else now
        waited = now - self._waiting_since
        what = "a plan" if self.plan is None else "the plan to move on"
        if not self._told_reader_wait or (waited >= _LONG_WAIT_S and not self._told_long_wait):
            self._told_long_wait = self._told_reader_wait
            self._told_reader_wait = True
            print(f"stage: every shard the reader wants is staged; waiting for {what} in {plan_path}"
                  + (f" (for {waited:.0f}s now)" if waited >= 1 else ""), file=sys.stderr, flush=True)
        timeout = self.wait_timeout_s
        if timeout is not None and waited > timeout:
            state = "there was no plan" if self.plan is None else "the plan did not change"
            raise DataToolError(str(plan_path), f"{state} for {timeout:g}s while every shard it wants was staged "
                                                f"(--wait-timeout); is the training container reading {self.dest}?",
                                runtime=True)
