"""A tiny FSDP2 training run under torchrun for the sharded-checkpoint tests (not a test module itself).

Every rank: a 2-layer MLP sharded with fully_shard, Adam, a synthetic dataset of N samples (sample i is a fixed
function of i), the data API's sampler over a fixed global batch, and the ShardedCheckpointer. It resumes from the
newest complete checkpoint, trains, saves every --save-every steps (async) and, with --stop-at, saves at that step,
waits for the save and exits (the SIGTERM path's order). Each rank appends {"epoch", "step", "ids"} per trained
step to OUT/ids-<rank>-<pid>.jsonl; at the end rank 0 writes the full (unsharded) parameters and optimiser state to
OUT/final.pt. --mesh-only: build a 2x2 ("dp", "tp") device mesh, log one epoch's batches per rank and exit.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from workloads.data.api import Placement, make_sampler
from workloads.train.sharded import ShardedCheckpointer, TrainingState
from workloads.train.tiers import S3Tier

SHARDS = [20, 16, 24]  # 60 samples: 5 steps of 12 per epoch


def sample(index: int) -> tuple[torch.Tensor, int]:
    generator = torch.Generator().manual_seed(1000 + index)
    return torch.randn(8, generator=generator), index % 3


class _KilledInUpload(S3Tier):
    """The S3 tier of a process that is killed -9 in the middle of copying one checkpoint up."""

    def __init__(self, uri: str, step: int) -> None:
        super().__init__(uri)
        self.kill_at = step

    def put(self, local: Path, step: int, name: str) -> None:
        super().put(local, step, name)
        if step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--local-dir", default=None)
    parser.add_argument("--remote-dir", default=None)
    parser.add_argument("--global-batch", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=0)
    parser.add_argument("--stop-at", type=int, default=None)
    parser.add_argument("--mesh-only", action="store_true")
    parser.add_argument("--kill-in-upload", type=int, default=None, metavar="STEP",
                        help="SIGKILL this process after the first file of STEP reached the remote tier")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    log = (out / f"ids-{rank}-{os.getpid()}.jsonl").open("a", buffering=1)
    placement = Placement.from_env()
    if args.mesh_only:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
        placement = placement.with_mesh(mesh)
        sampler = make_sampler(SHARDS, args.global_batch // placement.data_world_size, placement, seed=5)
        sampler.set_epoch(0)
        for batch in sampler:
            log.write(json.dumps({"rank": rank, "dp": placement.data_rank, "ids": list(map(int, batch))}) + "\n")
        dist.barrier()
        dist.destroy_process_group()
        return

    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    state = TrainingState(model, optimizer)
    sampler = make_sampler(SHARDS, args.global_batch // world, placement, seed=5, shuffle_shards=2)
    remote: Any = args.remote_dir
    if args.kill_in_upload is not None:
        remote = _KilledInUpload(args.remote_dir, args.kill_in_upload)
    ckpt = ShardedCheckpointer(args.local_dir, remote, keep=2)
    step, start_epoch, position = 0, 0, None
    resumed = ckpt.load(state)
    if resumed is not None:
        step, start_epoch, position = resumed.step, resumed.meta["epoch"], resumed.meta["data"]
    for epoch in range(start_epoch, args.epochs):
        if position is not None and epoch == start_epoch:
            sampler.load_state_dict(position)
        else:
            sampler.set_epoch(epoch)
        for done, batch in enumerate(sampler, start=1):
            inputs = torch.stack([sample(int(i))[0] for i in batch])
            labels = torch.tensor([sample(int(i))[1] for i in batch])
            loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            log.write(json.dumps({"epoch": epoch, "step": step, "ids": list(map(int, batch))}) + "\n")
            saving = (args.save_every and step % args.save_every == 0) or step == args.stop_at
            if saving:
                ckpt.save(state, step, meta={"epoch": epoch, "data": sampler.state_dict(done)})
            if step == args.stop_at:
                ckpt.wait()
                dist.barrier()
                dist.destroy_process_group()
                return
    ckpt.wait()
    model_state, optim_state = get_state_dict(model, optimizer,
                                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": model_state, "optim": optim_state, "step": step}, out / "final.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
