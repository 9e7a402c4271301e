"""DDP sharding on real data: two gloo ranks on CPU load one epoch each through the real loader; together they
must see every sample exactly once."""

from __future__ import annotations

import hashlib
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workloads.data.reading.dataset import HDF5Dataset, make_loader, to_tensors
from workloads.data.reading.sampler import ElasticBatchSampler

WORLD = 2


def _rank(rank: int, port: int, data: str, results: dict) -> None:
    torch.set_num_threads(1)  # forked from pytest: keep OpenMP out of the child, as DataLoader workers do
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        dataset = HDF5Dataset(data)
        sampler = ElasticBatchSampler(dataset.shard_sizes, 4, block_size=3, seed=11, rank=rank, world_size=WORLD)
        sampler.set_epoch(1)
        seen = []
        for batch in make_loader(dataset, sampler, workers=0):
            images, _ = to_tensors(batch)
            seen.extend(hashlib.sha256(image.numpy().tobytes()).hexdigest() for image in images)
        gathered: list[list[str] | None] = [None] * WORLD
        dist.all_gather_object(gathered, seen)
        if rank == 0:
            results["shares"] = gathered
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_read_disjoint_shares_covering_the_dataset(tiny_data: dict[str, Path]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_rank, args=(port, str(tiny_data["decoded"]), results), nprocs=WORLD, start_method="fork")
        shares = [list(share) for share in results["shares"]]
    dataset = HDF5Dataset(tiny_data["decoded"])
    every = {hashlib.sha256(dataset[i][0].numpy().tobytes()).hexdigest() for i in range(len(dataset))}
    assert len(every) == len(dataset)  # samples are distinguishable
    first, second = (set(share) for share in shares)
    assert len(shares[0]) == len(shares[1]) == len(dataset) // WORLD
    assert not first & second
    assert first | second == every
