"""The locked-memory limit (`ulimit -l`) a gang runs under, and the rule that NCCL over EFA needs it unlimited.

libfabric's EFA provider registers (pins) the buffers NCCL sends from; under a finite RLIMIT_MEMLOCK that fails
with "Libfabric error: (-12) Cannot allocate memory" once the registrations pass the limit, mid-run. The node pools
set the container runtime's limit to unlimited on EFA nodes (infra/nodes/nodepools.py); this says, at start, what
the container actually got, and refuses to start an EFA gang under a finite one.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping


def memlock_limit() -> int | None:
    """The soft RLIMIT_MEMLOCK in bytes; None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def memlock_line(limit: int | None) -> str:
    """What `ulimit -l` would say, in one line."""
    return "locked memory (ulimit -l): " + ("unlimited" if limit is None else f"{limit // 1024} KiB")


def efa_memlock_error(env: Mapping[str, str], limit: int | None) -> str | None:
    """The config error of a gang that would run NCCL over EFA (FI_PROVIDER=efa) under a finite limit, else None."""
    if env.get("FI_PROVIDER") != "efa" or limit is None:
        return None
    return (f"ulimit -l: {limit // 1024} KiB, but NCCL over EFA (FI_PROVIDER=efa) needs unlimited locked memory: "
            "run on an ml-cluster EFA node pool (its container runtime sets it) or raise the runtime's limit")
