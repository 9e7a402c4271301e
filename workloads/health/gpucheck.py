"""The GPU memory/compute check and the all-reduce inside one node: one process per GPU, started by torchrun.

    torchrun --standalone --nproc-per-node=<GPUs> -m workloads.health.gpucheck --out DIR [--memory-fraction 0.5]

Each process takes the GPU of its LOCAL_RANK and
- memory: fills `--memory-fraction` of the GPU's free memory with a position-dependent pattern in 256 MiB blocks
  and reads every block back (a stuck or flipping bit shows as a mismatch);
- compute: multiplies two fixed float32 matrices (TF32 off) and compares with the CPU's product, and every GPU's
  result with every other's (the same inputs on identical GPUs must give the same bits: a GPU that disagrees
  computes silently wrong);
- all-reduce: NCCL all_reduce of a 256 MiB tensor holding rank+1 on every rank must give n(n+1)/2 everywhere; the
  bus bandwidth is reported (nccl-tests' definition), not judged: a pass needs the right sum within the timeout.

Rank 0 writes DIR/gpu.json (atomically): first after the per-GPU checks (gathered over gloo, so a broken NCCL
cannot hide them), then again with the all-reduce's result. A process that dies leaves no summary or a summary
without the all-reduce: the verdict counts both as failures.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from workloads.cli import ArgumentParser
from workloads.safeio import atomic_write_in
from workloads.torchenv import torchrun_env
from workloads.train.allreduce import bus_bandwidth

BLOCK_BYTES = 256 * 2**20
MATRIX = 1024
ALLREDUCE_BYTES = 256 * 2**20


def pattern_mismatches(block: Any, seed: int) -> int:
    """Writes a position-dependent int32 pattern into `block` (a 1-D int32 tensor) and counts the elements that do
    not read back. Works on any device; on a GPU the comparison runs there."""
    import torch

    expected = torch.arange(block.numel(), dtype=torch.int32, device=block.device)
    expected.mul_(2654435761 % 2**31).add_(seed)  # Knuth's multiplicative hash: neighbours differ in many bits
    block.copy_(expected)
    mismatches = int((block != expected).sum().item())
    block.bitwise_not_()
    expected.bitwise_not_()
    return mismatches + int((block != expected).sum().item())


def memory_check(device: Any, fraction: float) -> tuple[bool, str | None]:
    import torch

    free, _total = torch.cuda.mem_get_info(device)
    # Each step also holds a block-sized reference pattern while it compares: a block of headroom is left.
    count = max(1, int(free * fraction) // BLOCK_BYTES - 1)
    blocks, mismatches = [], 0
    try:
        for seed in range(count):
            block = torch.empty(BLOCK_BYTES // 4, dtype=torch.int32, device=device)
            mismatches += pattern_mismatches(block, seed)
            blocks.append(block)  # keep it: the next block lands on other memory
    except torch.cuda.OutOfMemoryError:  # noqa: PERF203
        pass  # fewer blocks than planned (another process holds memory); what was tested still counts
    tested = len(blocks)
    del blocks
    torch.cuda.empty_cache()
    if not tested:
        return False, "could not allocate a single 256 MiB block"
    if mismatches:
        return False, f"{mismatches} int32 elements read back wrong in {tested} x 256 MiB"
    return True, None


def compute_check(device: Any) -> tuple[bool, str | None, Any]:
    """(ok, error, the GPU's product) for fixed inputs; the product is compared across GPUs by the caller."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator().manual_seed(20240601)
    a = torch.randn(MATRIX, MATRIX, generator=generator)
    b = torch.randn(MATRIX, MATRIX, generator=generator)
    reference = a @ b
    product = (a.to(device) @ b.to(device)).cpu()
    error = float(((product - reference).abs().max() / reference.abs().max()).item())
    if not torch.isfinite(product).all() or error > 1e-4:
        return False, f"float32 matmul differs from the CPU's by {error:.3g} (relative)", product
    return True, None, product


def _write(out: Path, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_in(out, "gpu.json", json.dumps(summary, sort_keys=True, indent=1).encode(), create_dir=False)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description="GPU memory/compute check and the all-reduce inside one node (torchrun)")
    parser.add_argument("--out", type=Path, required=True, help="directory for gpu.json")
    parser.add_argument("--memory-fraction", type=float, default=0.5, help="share of free GPU memory to test")
    parser.add_argument("--timeout", type=int, default=300, help="seconds any collective may take")
    args = parser.parse_args(argv)
    if not 0 < args.memory_fraction <= 0.9:
        print("error: --memory-fraction: must be in (0, 0.9]", file=sys.stderr)
        return 2
    return run(args.out, args.memory_fraction, args.timeout)


def run(out: Path, memory_fraction: float, timeout: int) -> int:
    import torch
    import torch.distributed as dist

    rank, world, local_rank, _ = torchrun_env()
    devices = torch.cuda.device_count()
    result: dict[str, Any] = {"index": local_rank, "name": "", "memory_ok": False, "compute_ok": False,
                              "error": None}
    product = None
    if local_rank >= devices:
        result["error"] = f"no CUDA device {local_rank} ({devices} visible)"
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        try:
            result["name"] = torch.cuda.get_device_name(device)
            result["memory_ok"], memory_error = memory_check(device, memory_fraction)
            result["compute_ok"], compute_error, product = compute_check(device)
            result["error"] = memory_error or compute_error
        except RuntimeError as exc:  # an XID mid-check surfaces as a CUDA error (torch's are RuntimeErrors)
            result["error"] = f"CUDA error: {' '.join(str(exc).split())[:300]}"
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
    results: list[Any] = [None] * world
    dist.all_gather_object(results, result)
    products: list[Any] = [None] * world
    dist.all_gather_object(products, product)
    if rank == 0:
        agreeing = [p for p in products if p is not None]
        for other, item in zip(products, results, strict=True):
            if other is not None and agreeing and not torch.equal(other, agreeing[0]) and item["error"] is None:
                item["compute_ok"] = False
                item["error"] = "its matmul result differs from GPU 0's on the same inputs"
    summary: dict[str, Any] = {"devices": devices, "ranks": world, "gpus": results,
                               "allreduce": {"ok": False, "error": "did not finish"}}
    if rank == 0:
        _write(out, summary)
    allreduce = _allreduce(local_rank, world, timeout) if local_rank < devices else \
        {"ok": False, "error": "no CUDA device"}
    outcomes: list[Any] = [None] * world
    dist.all_gather_object(outcomes, allreduce)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    failed = [outcome for outcome in outcomes if not outcome["ok"]]
    summary["allreduce"] = failed[0] if failed else outcomes[0]
    _write(out, summary)
    print(json.dumps(summary, sort_keys=True))
    return 0


def _allreduce(local_rank: int, world: int, timeout: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    try:
        group = dist.new_group(backend="nccl", timeout=timedelta(seconds=timeout))
        device = torch.device("cuda", local_rank)
        rank = dist.get_rank()
        tensor = torch.full((ALLREDUCE_BYTES // 4,), float(rank + 1), device=device)
        dist.all_reduce(tensor, group=group)  # warm-up, and the first correctness check
        torch.cuda.synchronize(device)
        expected = world * (world + 1) / 2
        if not bool((tensor == expected).all()):
            return {"ok": False, "error": f"all_reduce sum is not {expected:g} on rank {rank}"}
        tensor.fill_(float(rank + 1))
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - started
        if not bool((tensor == expected).all()):
            return {"ok": False, "error": f"all_reduce sum is not {expected:g} on rank {rank}"}
        _, busbw = bus_bandwidth(ALLREDUCE_BYTES, seconds, world)  # nccl-tests' definition; 0 for one rank
        return {"ok": True, "error": None, "busbw_gbps": round(busbw, 2)}
    except RuntimeError as exc:
        return {"ok": False, "error": " ".join(str(exc).split())[:300]}


if __name__ == "__main__":
    raise SystemExit(main())
