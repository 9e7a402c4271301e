"""A child process that must not outlive the process it serves: a daemon thread polls the parent's pid, and when the
child has been re-parented (its parent died, however: SIGKILL included, and init or a subreaper adopted the child)
it calls `on_gone` once.

The kernel's parent-death signal (prctl PR_SET_PDEATHSIG) is faster but fires when the *thread* that started the
child exits, so a child started from a short-lived thread of a living process would be killed; the pack's decode
workers, started by the pool's own thread of a process that outlives them, use it as well (samples.worker_init).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

PARENT_POLL_S = 0.5  # how often the parent's pid is checked: the delay between its death and `on_gone`


def parent_gone(parent: int) -> bool:
    """This process is no longer the child of `parent` (it died, or this process was started by another)."""
    return os.getppid() != parent


def watch_parent(parent: int, on_gone: Callable[[], None], interval_s: float = PARENT_POLL_S) -> threading.Thread:
    """Call `on_gone` (in a daemon thread) within `interval_s` of `parent` being gone, at once if it is already."""

    def watch() -> None:
        while not parent_gone(parent):
            time.sleep(interval_s)
        on_gone()

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread
