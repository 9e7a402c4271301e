"""Check /dev/shm against what the DataLoader will keep in flight, and pick a transport that cannot run out
of it.

Worker batches normally travel through shared memory (PyTorch moves every tensor a worker returns into
/dev/shm). Containers get 64 MiB of /dev/shm by default, and Kubernetes has no pod-level setting (only an
emptyDir with medium: Memory), so a large batch times workers x prefetch can exhaust it: older PyTorch died
of SIGBUS, current PyTorch raises "unable to allocate shared memory". Switching torch.multiprocessing to the
file_system strategy does not help here: it allocates from the same /dev/shm. What does help is not using
/dev/shm at all: workers return numpy batches, which multiprocessing pickles through the worker's pipe
("pipe" transport). It costs a copy per batch but keeps decoding parallel and cannot fail for lack of shared
memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

SHM_PATH = "/dev/shm"
SHM_BYTES_ENV = "ML_CLUSTER_SHM_BYTES"  # simulate a /dev/shm of this many bytes (tests, dry runs)
# A batch can exist twice at the moment of hand-over (worker's copy not yet released, consumer's view in use),
# plus the batch the training step holds.
_SAFETY = 1.5

Transport = Literal["shm", "pipe"]


def shm_available_bytes(path: str = SHM_PATH) -> int:
    override = os.environ.get(SHM_BYTES_ENV)
    if override:
        try:
            return int(override)
        except ValueError as exc:
            raise ValueError(f"{SHM_BYTES_ENV}: not an integer byte count: {override!r}") from exc
    try:
        stats = os.statvfs(path)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


@dataclass(frozen=True)
class SharedMemoryPlan:
    transport: Transport
    available_bytes: int
    needed_bytes: int

    @property
    def message(self) -> str:
        have, need = self.available_bytes >> 20, self.needed_bytes >> 20
        if self.transport == "shm":
            return f"/dev/shm has {have} MiB, the loader needs {need} MiB"
        return (
            f"/dev/shm has {have} MiB but the loader needs {need} MiB (batch x workers x prefetch): workers "
            "now send batches through pipes instead of shared memory; give the pod a larger /dev/shm "
            "(emptyDir medium: Memory) to get the faster path back"
        )


def plan_shared_memory(batch_bytes: int, workers: int, prefetch_factor: int, available_bytes: int) -> SharedMemoryPlan:
    if workers == 0:
        return SharedMemoryPlan("shm", available_bytes, 0)
    needed = int(batch_bytes * (workers * prefetch_factor + 1) * _SAFETY)
    transport: Transport = "shm" if needed <= available_bytes else "pipe"
    return SharedMemoryPlan(transport, available_bytes, needed)
