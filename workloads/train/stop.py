"""Stop at a step every rank agrees on, checkpoint, exit with the disruption code: the stop helper for your own loop.

A Spot reclaim, a Capacity Block's end, a drain or Kueue's preemption stop a pod with SIGTERM, then SIGKILL after
terminationGracePeriodSeconds. The rendered Jobs retry a pod that exits with the disruption code (43) without
counting it, and resume it from its checkpoint. `StopSignal` gives your loop that behaviour in four lines:

    from workloads.data.api import StopSignal

    with StopSignal() as stop:                       # SIGTERM/SIGINT now set a flag; a lost peer exits 43 too
        for epoch in ...:
            for batch in data.batches(epoch):
                ...                                  # your step
                stop.check(lambda: save(step))       # every rank, every step: stop here if any rank was signalled

`check` all-reduces this rank's flag with every other rank's (one 1-element collective, the trick the bundled
trainer folds into its step's all-reduce), so every rank stops after the same step; then it calls your checkpoint
callback on every rank (rank 0 writes a torch.save checkpoint; a torch.distributed.checkpoint save wants every
rank), waits for all ranks at a barrier, tears the process group down and exits with $DISRUPTION_EXIT_CODE
(43). Before the first `check` nothing has been trained, so a signal exits 43 at once. Leaving the `with` block
on an exception of a collective whose peer is gone (gloo's "Connection closed by peer" inside DDP, a DistError,
an NCCL abort) exits 43 with one line instead of a traceback and exit 1, which the Job would count.

DataLoader workers: a SIGTERM to the whole process group (`timeout`, systemd, torchrun's agent stopping its
workers) reaches them too, and PyTorch's workers die of it, which the loader reports as a crash. The data API's
loaders start their workers in sessions of their own, out of the group's reach (the main process stops them); for
a DataLoader of your own, pass `worker_init_fn=ignore_stop_signals`.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any, NoReturn

from workloads.data.reading.workers import ignore_stop_signals
from workloads.train.exitcodes import disruption_exit_code, leave, peer_lost

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
__all__ = ["STOP_SIGNALS", "StopSignal", "ignore_stop_signals"]


class StopSignal:
    """SIGTERM and SIGINT ask the run to stop; `check()` stops every rank after the same step.

    every: all-reduce the flag every that many `check` calls (1: every step). Every rank must call `check` the same
    number of times. A larger value saves a collective per step and costs up to that many steps of grace period.
    device: where the flag's tensor lives for the all-reduce (default: the current CUDA device for NCCL, else CPU).
    agree: your framework's own way to agree, from this rank's flag to the answer every rank gets (Accelerate:
    `set_trigger` when the flag is set, then `check_trigger()`); default: the all-reduce above.
    install: take over the signals now (else on `install()` or entering the `with` block); only the main thread can.
    """

    def __init__(self, *, every: int = 1, device: Any = None, agree: Callable[[bool], bool] | None = None,
                 install: bool = True) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every: must be an integer >= 1, got {every!r}")
        self.every = every
        self.device = device
        self.agree = agree
        self.signum: int | None = None
        self.started = False  # a check has run: from here on a signal waits for the agreed step
        self.calls = 0
        self._previous: dict[int, Any] = {}
        if install:
            self.install()

    @property
    def requested(self) -> bool:
        """This process got a stop signal (the agreed answer is `should_stop()`)."""
        return self.signum is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            if not self.started:  # nothing trained yet: nothing to save
                print(f"stopped: {signal.Signals(signum).name} before the first step (nothing to save)",
                      file=sys.stderr, flush=True)
                leave(disruption_exit_code())

    def install(self) -> StopSignal:
        """Take the stop signals (again: a framework that set its own handlers since gives them back on restore)."""
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach only the main thread
        for number in STOP_SIGNALS:
            previous = signal.signal(number, self._handle)
            self._previous.setdefault(number, previous)
        return self

    def restore(self) -> None:
        """Give the signals back to the handlers they had before."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()

    def should_stop(self) -> bool:
        """Whether any rank got a stop signal: the same answer on every rank (a collective when distributed: every
        rank calls it at the same point of the same step)."""
        self.started = True
        self.calls += 1
        if self.calls % self.every:
            return False
        if self.agree is not None:
            return bool(self.agree(self.requested))
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.requested
        device = self.device
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([1.0 if self.requested else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def stop(self, checkpoint: Callable[[], object] | None = None) -> NoReturn:
        """Call `checkpoint` (every rank), wait for every rank, tear the process group down, exit 43."""
        import torch.distributed as dist

        if checkpoint is not None:
            checkpoint()
        distributed = dist.is_available() and dist.is_initialized()
        if distributed:
            dist.barrier()  # rank 0's checkpoint is complete before any rank leaves
            dist.destroy_process_group()
        name = signal.Signals(self.signum).name if self.signum is not None else "a stop on another rank"
        saved = "checkpoint written" if checkpoint is not None else "no checkpoint callback: nothing saved"
        print(f"stopped: {name} ({saved}); exit {disruption_exit_code()}", file=sys.stderr, flush=True)
        self.restore()
        leave(disruption_exit_code())
        raise AssertionError("unreachable")  # leave() exits

    def check(self, checkpoint: Callable[[], object] | None = None) -> None:
        """At a step boundary: when any rank got a stop signal, `stop(checkpoint)`; else return at once."""
        if self.should_stop():
            self.stop(checkpoint)

    def __enter__(self) -> StopSignal:
        return self.install()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()
        if exc is not None and not isinstance(exc, SystemExit | KeyboardInterrupt) and peer_lost(exc):
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"error: peer lost ({type(exc).__name__}): {text}; exit {disruption_exit_code()}",
                  file=sys.stderr, flush=True)
            leave(disruption_exit_code())
