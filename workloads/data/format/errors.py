"""The data tools' one error: `error: <where>: <why>`, and which I/O failures a retry may cure.

Every room raises it (the format's checks, the packers, the movers, the readers' CLI paths); the CLIs print it as
one line and exit 2, or 1 when `runtime` says another try (another pod, another node) may succeed.
"""

from __future__ import annotations

import errno


class DataToolError(Exception):
    """A failure the CLI reports as one line: `error: <where>: <why>`.

    `runtime` says that retrying may succeed (the network, a full disk, a reader that never came): the CLIs exit 1
    for it, never the config-error code 2, so a Kubernetes Job retries the pod instead of failing it."""

    def __init__(self, where: str, why: str, *, runtime: bool = False) -> None:
        super().__init__(f"{where}: {why}")
        self.where = where
        self.why = why
        self.runtime = runtime


# I/O failures that say nothing about the input: a retry (or another node) may succeed.
RUNTIME_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.ETIMEDOUT, errno.ECONNRESET,
                            errno.ECONNREFUSED, errno.EPIPE, errno.EAGAIN, errno.ESTALE, errno.EHOSTUNREACH,
                            errno.ENETUNREACH})


def is_runtime_oserror(exc: OSError) -> bool:
    return exc.errno in RUNTIME_ERRNOS
