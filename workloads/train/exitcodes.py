"""The exit codes every training process of a Job speaks, and how a lost peer is recognised.

The rendered Jobs' podFailurePolicy acts on them (workloads/jobspec/render.py): the config-error code fails the Job
at once, the disruption code is retried without being counted, anything else is counted against backoffLimit. The
bundled trainer, the launcher (workloads/train/launch.py) and the stop helper for your own code
(workloads/train/stop.py, exported by workloads.data.api) all read them from here.
"""

from __future__ import annotations

import os

from workloads.torchenv import is_distributed

RUNTIME_EXIT_CODE = 1  # a failure a retry may fix; never the config-error code
DISRUPTION_EXIT_CODE = 43  # the default; workloads/jobspec/fields.py renders the same number into every Job


def config_error_exit_code() -> int:
    """$CONFIG_ERROR_EXIT_CODE when it is a usable failure code (2-125); else 2: a config error never exits 0
    (success), nor 1 (the runtime failures' code, which the Job retries), nor a code the shell wraps (300 -> 44)
    or uses for signals (128 + n)."""
    try:
        code = int(os.environ.get("CONFIG_ERROR_EXIT_CODE", "2"))
    except ValueError:
        return 2
    return code if 2 <= code <= 125 else 2


def disruption_exit_code() -> int:
    """$DISRUPTION_EXIT_CODE when it is a usable code (2-125) other than the config-error code; else 43 (44 when
    43 is the config-error code)."""
    config = config_error_exit_code()
    fallback = DISRUPTION_EXIT_CODE if config != DISRUPTION_EXIT_CODE else DISRUPTION_EXIT_CODE + 1
    try:
        code = int(os.environ.get("DISRUPTION_EXIT_CODE", str(fallback)))
    except ValueError:
        return fallback
    return code if 2 <= code <= 125 and code != config else fallback


# What the transports say when the other end of a collective is gone. DDP's gradient all-reduce and its buffer
# broadcast surface gloo's as a plain RuntimeError (not a DistError), so they are recognised by these words; NCCL's,
# with async error handling, arrive as DistBackendError.
_PEER_LOST = ("gloo/transport/tcp", "Connection closed by peer", "Connection reset by peer",
              "NCCL communicator was aborted", "Watchdog caught collective operation timeout")


def peer_lost(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is a collective that failed because another rank is gone."""
    from torch.distributed import DistError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DistError) or any(marker in str(current) for marker in _PEER_LOST):
            return True
        current = current.__cause__ or current.__context__
    return False


def leave(code: int) -> None:
    """Exit with `code`. A distributed rank leaves at once after flushing (os._exit): a C++ destructor of the
    collective layer that aborts at interpreter exit must not turn the code the Job acts on (0, 43, 42) into a
    SIGABRT, which it would count."""
    import sys

    if is_distributed():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
