"""The sharded checkpointer's storage writer for a state on the GPU: one DCP FileSystemWriter kept for the run with
its staged host copy cached (`cache_staged_state_dict=True`: pinned host buffers allocated by the first save and
copied into by every later one), and a fresh copy when the state's layout changed between saves.

Why: DCP's default staging (BlockingAsyncStager without the cache) allocates fresh pageable host tensors on every
save and copies the state into them, and a device-to-host copy into pageable memory is slow (one H100 80GB HBM3,
torch 2.11.0+cu130, a 3 GiB state: 1.3 GiB/s plain, 0.72 GiB/s FSDP2, against 48 GiB/s into the cached pinned
buffers on the second save; scripts/bench_checkpoint_device.py). The price: the pinned copy (this rank's share of the
state) stays in host memory for the run instead of only during a save (docs/operations.md, host memory).

The cache is torch's; torch copies into it only when the new state has the same structure (its _copy_state_dict
raises CompanionMismatch when a dict's keys or a list's length differ: the optimizer's state appearing after the
first step, a sampler's list of another length). It does not compare a tensor's shape or dtype (copy_ would
broadcast or convert) nor a tensor where the cache holds none (it would hand DCP the live GPU tensor); those are
checked here first. Either way the cache is dropped and the state staged afresh, once, with one line: a save never
fails for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed._state_dict_utils import CompanionMismatch
from torch.distributed.tensor import DTensor


def cache_supported() -> bool:
    """Whether this torch's FileSystemWriter takes cache_staged_state_dict (older ones: the per-save writer)."""
    return "cache_staged_state_dict" in inspect.signature(dcp.FileSystemWriter.__init__).parameters


def holds_cuda(state: Any) -> bool:
    """Whether `state` (a TrainingState-like object with .model, a Stateful, a state dict) holds a CUDA tensor."""
    model = getattr(state, "model", None)
    if isinstance(model, nn.Module):
        return any(tensor.is_cuda for tensor in (*model.parameters(), *model.buffers()))
    if isinstance(state, torch.Tensor):
        return state.is_cuda
    if isinstance(state, dict):
        return any(holds_cuda(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return any(holds_cuda(value) for value in state)
    if callable(getattr(state, "state_dict", None)):
        return holds_cuda(state.state_dict())
    return False


def wants_cached_staging(state: Any) -> bool:
    """The cached (pinned) staging applies: CUDA is there, the state holds CUDA tensors, torch has the option."""
    return torch.cuda.is_available() and cache_supported() and holds_cuda(state)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def layout_change(new: Any, cached: Any, path: str = "state") -> str | None:
    """What differs between a tensor of `new` and its cached copy (shape, dtype, a tensor where the cache holds
    none, a DTensor where it holds a plain one), the first one found with its path; None when nothing does. Dicts
    and lists are followed where both sides have the key or index: their keys and lengths are torch's to check."""
    if isinstance(new, torch.Tensor):
        if not isinstance(cached, torch.Tensor):
            return f"{path}: a tensor where the cached copy holds {type(cached).__name__}"
        if isinstance(new, DTensor) != isinstance(cached, DTensor):
            return f"{path}: {type(new).__name__} where the cached copy holds {type(cached).__name__}"
        have, want = _local(new), _local(cached)
        if have.shape != want.shape or have.dtype != want.dtype:
            return (f"{path}: {str(want.dtype).removeprefix('torch.')}{list(want.shape)} -> "
                    f"{str(have.dtype).removeprefix('torch.')}{list(have.shape)}")
        return None
    if isinstance(new, dict) and isinstance(cached, dict):
        for key, value in new.items():
            if key in cached:
                why = layout_change(value, cached[key], f"{path}.{key}")
                if why is not None:
                    return why
    elif isinstance(new, (list, tuple)) and isinstance(cached, (list, tuple)):
        for index, (value, old) in enumerate(zip(new, cached, strict=False)):
            why = layout_change(value, old, f"{path}[{index}]")
            if why is not None:
                return why
    return None


class CachedStagingWriter(dcp.FileSystemWriter):
    """A FileSystemWriter kept for the run (DCP's reset(checkpoint_id) points it at each save's folder) whose staged
    host copy is reused by every save with the same layout; `restaged` counts the saves that allocated it afresh
    after the first."""

    def __init__(self, path: str | Path, log: Callable[[str], None]) -> None:
        super().__init__(path, sync_files=True, cache_staged_state_dict=True)
        self._log = log
        self.restaged = 0

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if self.state_dict_cache is not None:
            why = layout_change(state_dict, self.state_dict_cache)
            if why is not None:
                return self._afresh(state_dict, why)
        try:
            return super().stage(state_dict)
        except CompanionMismatch as exc:  # a dict's keys or a list's length differ from the cached copy's
            return self._afresh(state_dict, str(exc).strip() or "a dict's keys or a list's length differ")

    def _afresh(self, state_dict: dict[str, Any], why: str) -> dict[str, Any]:
        self.state_dict_cache = None  # the old pinned copy is freed with it
        self.restaged += 1
        self._log(f"checkpoint: the state's layout changed since the previous save ({why}); its pinned host copy "
                  "is allocated afresh")
        return super().stage(state_dict)
