"""What every reader of packed shards shares: its errors, the batch buffers it fills (in shared memory in a
DataLoader worker, so handing a batch to the main process costs no copy; numpy arrays with transport "pipe", see
workloads/data/reading/shm.py) and the runs of consecutive samples a batch of indices is read in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import get_worker_info

Batch = tuple[torch.Tensor, torch.Tensor]
Transport = Literal["shm", "pipe"]


class DatasetError(ValueError):
    """A dataset that cannot be read; the message names the file. A config error: retrying cannot help."""


class DataUnavailableError(RuntimeError):
    """The data cannot be read now, though nothing says it is wrong: the staging cache's stager failed, stopped or
    left a state that cannot be served, or a shard was not staged in time. A runtime failure: a retry (a new pod,
    with a new stager) may succeed. The message names the file waited for."""


def uint8_batch(shape: Sequence[int], transport: Transport = "shm") -> torch.Tensor | np.ndarray:
    """An uninitialised uint8 batch: in a worker with the shm transport it is allocated in shared memory, so
    returning it costs no copy; with the pipe transport it is a numpy array (pickled through the pipe)."""
    if transport == "pipe":
        return np.empty(tuple(shape), dtype=np.uint8)
    if get_worker_info() is None:
        return torch.empty(tuple(shape), dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(tuple(shape))


def to_tensors(batch: Any) -> Batch:
    """(images, labels) as tensors, whichever transport delivered them (numpy arrays are wrapped, not
    copied)."""
    images, labels = batch
    return torch.as_tensor(images), torch.as_tensor(labels)


def contiguous_runs(indices: Sequence[int]) -> list[tuple[int, int, int]]:
    """[(position in batch, first index, length)] for maximal runs of consecutive indices, in batch order."""
    runs: list[tuple[int, int, int]] = []
    for position, index in enumerate(indices):
        if runs and runs[-1][1] + runs[-1][2] == index:
            start_position, first, length = runs[-1]
            runs[-1] = (start_position, first, length + 1)
        else:
            runs.append((position, int(index), 1))
    return runs
