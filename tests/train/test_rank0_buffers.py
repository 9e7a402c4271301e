"""Before a save every rank takes rank 0's buffers: DDP broadcasts them at each forward anyway, and DCP writes each
replicated tensor from whichever rank its planner picks, so otherwise a checkpoint mixes the ranks' BatchNorm
statistics and a resumed 2-rank run ends with other buffers than an uninterrupted one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workloads.train.checkpointer import TrainState, _rank0_buffers


def _rank(rank: int, port: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    core = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    model = DistributedDataParallel(core)
    model(torch.randn(8, 4) + rank * 10)  # each rank's own batch: its own running statistics after the forward
    before = core[1].running_mean.clone()
    _rank0_buffers(TrainState(model=model, core=core, optimizer=torch.optim.SGD(core.parameters(), lr=0.1)))
    torch.save({"before": before, "after": core[1].running_mean.clone()}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


@pytest.mark.slow  # two processes on gloo (seconds to start)
def test_every_rank_takes_rank_0s_buffers_before_a_save(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    zero, one = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert not torch.equal(zero["before"], one["before"])  # the ranks' statistics really differed
    assert torch.equal(zero["after"], zero["before"])
    assert torch.equal(one["after"], zero["before"])
