"""Where a process sits in a torchrun job, read from the environment torchrun (and `accelerate launch`, Lightning's
launcher, the launcher of this project) gives every worker: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE.
Every place that asks goes through `torchrun_env` (the data API's Placement, the trainer, the GPU checks)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple


class TorchrunEnv(NamedTuple):
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def torchrun_env(environ: Mapping[str, str] | None = None) -> TorchrunEnv:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE (default: the whole world on one node); a plain run is rank 0
    of 1. ValueError naming the variables when one is not an integer."""
    env = os.environ if environ is None else environ
    try:
        world_size = int(env.get("WORLD_SIZE", 1))
        return TorchrunEnv(int(env.get("RANK", 0)), world_size, int(env.get("LOCAL_RANK", 0)),
                           int(env.get("LOCAL_WORLD_SIZE", world_size)))
    except ValueError as exc:
        raise ValueError(f"RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE: not integers ({exc})") from None


def is_distributed(environ: Mapping[str, str] | None = None) -> bool:
    """More than one process in the job."""
    return torchrun_env(environ).world_size > 1
