"""What a training process is part of and how it talks: its place in the gang (torchrun's environment), the JSON
lines it reports, and the stop signals that end it at a step boundary."""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

from workloads.torchenv import torchrun_env


class TrainingDiverged(ValueError):
    """The loss became NaN or infinite: the weights would be garbage from here on (a config error: --lr)."""


class Disrupted(BaseException):
    """The run was stopped from outside, not by a fault of its own (a BaseException, like KeyboardInterrupt: no
    `except Exception` on the way turns it into another error): a stop signal (SIGTERM from the kubelet on a
    drain, a Spot notice or a preemption; SIGINT), after which the last checkpoint was written when training had
    started, or a peer rank that was lost. The CLI exits with the disruption code, which the Job does not count."""

    def __init__(self, message: str, *, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step  # the step the checkpoint holds (None: nothing was written)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """SIGTERM and SIGINT ask the run to stop. Before the first step nothing is lost, so the signal ends the run at
    once (Disrupted); once training runs it only sets a flag: every rank finishes the step in flight, the ranks agree
    on the flag in the step's all-reduce, every rank saves its share of the checkpoint and waits for the save (local
    tier, then the remote one), and they stop.
    A second signal while stopping changes nothing (the checkpoint is not torn)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.signalled_at: float | None = None  # time.monotonic() of the first signal (the grace period's start)
        self.immediate = True  # before the training loop: stop where we are
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signum is None
        self.signum = signum if first else self.signum
        self.signalled_at = time.monotonic() if first else self.signalled_at
        if first and self.immediate:
            raise Disrupted(f"stopped by {signal.Signals(signum).name} before training started (nothing to save)")

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach only the main thread; an embedding caller handles them itself
        for number in STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: JSON has no such tokens, and log pipelines reject Python's."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


@dataclass(frozen=True)
class Distributed:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int = 1

    @classmethod
    def from_env(cls) -> Distributed:
        """torchrun's environment (workloads.torchenv); a plain run is rank 0 of 1."""
        return cls(*torchrun_env())

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))


class Reporter:
    """JSON lines on stdout, from rank 0 only (every rank's figures are reduced first where it matters)."""

    def __init__(self, rank: int, stream: TextIO | None = None) -> None:
        self.enabled = rank == 0
        self.stream = stream or sys.stdout  # looked up now: whatever stdout is when the run starts

    def emit(self, event: str, **fields: Any) -> None:
        if self.enabled:
            self.stream.write(json.dumps(_json_safe({"event": event, **fields}), allow_nan=False) + "\n")
            self.stream.flush()
