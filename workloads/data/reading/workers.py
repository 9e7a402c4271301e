"""What a DataLoader worker does first: leave the parent's process group, so a stop signal sent to the group reaches
the main process alone (the stop helper, workloads.train.stop, decides when the run stops and stops its workers)."""

from __future__ import annotations

import contextlib
import os


def ignore_stop_signals(worker_id: int = 0) -> None:
    """A DataLoader `worker_init_fn`: the worker leaves its parent's process group (a session of its own), so a
    SIGTERM or SIGINT to the group (`timeout`, systemd, Ctrl-C, torchrun's agent) does not reach it. The main process
    decides when to stop and shuts its workers down itself (a direct SIGTERM from it still works, where ignoring the
    signal would leave multiprocessing's exit-time join waiting); they also exit when it is gone."""
    with contextlib.suppress(OSError):  # already a session leader (never the case for a forked worker)
        os.setsid()
