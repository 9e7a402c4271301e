"""Checkpoint costs of a training state held on the accelerator, one rank: what a save stalls the loop for, how
fast the state leaves the device, how fast the local disk takes it, how long a restore is.

    python scripts/bench_checkpoint_device.py [--state-mib 3072] [--device cuda|cpu] [--workdir DIR] [--json]

Rows (one process; the state is --state-mib MiB: fp32 weights of square Linear layers plus Adam's two moments):

  d2h_pageable_gib_s  one tensor of the state's size copied device -> host into fresh (pageable) memory
  d2h_pinned_gib_s    the same into a pinned buffer (non_blocking copy, then a synchronize)
  disk_write_gib_s    the same bytes (at most 1 GiB) written to --workdir in 64 MiB chunks, then fsync
  and per variant, `plain` (a module, no process group) and `fsdp` (FSDP2 fully_shard in a 1-rank process group:
  "cpu:gloo,cuda:nccl" on CUDA, gloo on the CPU; a one-GPU node's real path, DTensors and all):
  sync_save_s         dcp.save to the local disk, the loop blocked for all of it
  staging             how ShardedCheckpointer staged it: "pinned-cached" (a state on the GPU: one writer kept,
                      its pinned host copy made by the first save and reused, workloads/train/pinned.py) or
                      "pageable-per-save" (a state on the CPU: a writer and fresh host memory per save)
  first_save_stall_s  ShardedCheckpointer.save (workloads/train/sharded.py) called as the trainer calls it (a
                      TrainingState, the step, a meta dict; the previous save waited for): the loop's wait, i.e. the
                      copy of the state to host memory (pinned-cached: allocating and pinning the buffers too);
                      first_staging_gib_s is the state over it
  second_save_stall_s the same for the next save, a training step later (pinned-cached: the buffers reused);
                      second_staging_gib_s likewise (the goodput model's STAGING_BYTES_PER_S is printed beside)
  restaged            saves that found the state's layout changed and staged it afresh (0 expected here)
  local_write_s       from save() to the shards written, hashed and the manifest in
  restore_s           a fresh state on the device loaded from the local tier, every file checked (sha256)
  restored_equal      the restored weights and moments equal the saved ones, bit for bit
  and for `plain`, cached_stall_2_s: bare dcp.async_save through FileSystemWriter(cache_staged_state_dict=True), the
  second save's stall (its pinned staging buffers reused), DCP alone for comparison (CUDA only).

Each phase's figures are printed as a JSON line as soon as they exist, the whole result last.
On a machine without the device it says so and exits 0 (--device cpu runs every row but the pinned copy).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from workloads.cli import ArgumentParser  # noqa: E402
from workloads.train.pinned import CachedStagingWriter  # noqa: E402
from workloads.train.sharded import ShardedCheckpointer, TrainingState  # noqa: E402

LAYERS = 4
GIB = float(1 << 30)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model(state_mib: int, device: torch.device) -> nn.Sequential:
    """LAYERS square Linear layers holding a third of state_mib MiB as fp32 weights (Adam's moments: the rest)."""
    width = max(8, int(((state_mib << 20) / 3 / 4 / LAYERS) ** 0.5))
    return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(LAYERS))).to(device)


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    first = model[0]  # type: ignore[index]
    model(torch.randn(2, first.in_features, device=device)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(device)


def _state(state_mib: int, device: torch.device, seed: int, shard: bool) -> TrainingState:
    torch.manual_seed(seed)
    model = _model(state_mib, device)
    if shard:
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    _step(model, optimizer, device)  # Adam's moments exist: two thirds of the state
    return TrainingState(model, optimizer)


def _fingerprint(state: TrainingState) -> list[float]:
    """Sums of every weight and moment (full tensors, gathered from DTensors): equal states, equal lists."""
    out = []
    for tensor in [*state.model.parameters(), *(v for s in state.optimizer.state.values() for v in s.values())]:
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
            full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
            out.append(float(full.detach().double().sum()))
    return out


def transfer_rates(nbytes: int, device: torch.device, workdir: Path) -> dict[str, float | None]:
    """Device -> host (pageable, pinned) and host -> local disk rates for nbytes, best of three."""
    out: dict[str, float | None] = {"d2h_pageable_gib_s": None, "d2h_pinned_gib_s": None}
    if device.type == "cuda":
        source = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
        pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        pageable, pin = [], []
        for _ in range(3):
            _sync(device)
            started = time.perf_counter()
            copy = source.to("cpu")
            pageable.append(time.perf_counter() - started)
            del copy
            started = time.perf_counter()
            pinned.copy_(source, non_blocking=True)
            _sync(device)
            pin.append(time.perf_counter() - started)
        out["d2h_pageable_gib_s"] = nbytes / GIB / min(pageable)
        out["d2h_pinned_gib_s"] = nbytes / GIB / min(pin)
        del source, pinned
        torch.cuda.empty_cache()
    chunk = os.urandom(min(nbytes, 64 << 20))
    nbytes = min(nbytes, 1 << 30)  # the disk's rate needs no more
    target = workdir / "disk-rate.bin"
    writes = []
    for _ in range(1):
        started = time.perf_counter()
        with open(target, "wb") as handle:
            for _ in range(max(1, nbytes // len(chunk))):
                handle.write(chunk)
            handle.flush()
            os.fsync(handle.fileno())
        writes.append(time.perf_counter() - started)
        target.unlink()
    out["disk_write_gib_s"] = max(1, nbytes // len(chunk)) * len(chunk) / GIB / min(writes)
    return out


def measure(state_mib: int, device: torch.device, workdir: Path, shard: bool) -> dict[str, Any]:
    """One variant's save, stall, write and restore figures (see the module docstring)."""
    state = _state(state_mib, device, seed=0, shard=shard)
    root = workdir / ("fsdp" if shard else "plain")
    _sync(device)
    started = time.perf_counter()
    dcp.save({"state": state}, storage_writer=dcp.FileSystemWriter(root / "sync", sync_files=True),
             no_dist=not shard)
    sync_s = time.perf_counter() - started
    shutil.rmtree(root / "sync", ignore_errors=True)
    ckpt = ShardedCheckpointer(root / "local", None, keep=1, log=lambda line: None)
    ckpt.wait()  # as the trainer: the previous save waited for, then save() (TrainingState, step, meta)
    _sync(device)
    first = ckpt.save(state, 1, meta={"epoch": 0, "step": 1})
    ckpt.wait()
    writer = ckpt._writer
    _step(state.model, state.optimizer, device)  # the loop goes on; the next save holds the new weights
    ckpt.wait()
    second = ckpt.save(state, 2, meta={"epoch": 0, "step": 2})
    done = ckpt.wait()
    staging = "pinned-cached" if isinstance(writer, CachedStagingWriter) else "pageable-per-save"
    saved = _fingerprint(state)
    nbytes = done.total_bytes if done is not None else 0
    del state
    if device.type == "cuda":
        torch.cuda.empty_cache()
    fresh = _state(state_mib, device, seed=1, shard=shard)
    reader = ShardedCheckpointer(root / "local", None, keep=1, log=lambda line: None)
    _sync(device)
    started = time.perf_counter()
    manifest = reader.load(fresh)
    _sync(device)
    restore_s = time.perf_counter() - started
    row = {
        "variant": "fsdp" if shard else "plain", "state_mib": round(nbytes / (1 << 20), 1),
        "sync_save_s": round(sync_s, 3), "staging": staging,
        "first_save_stall_s": round(first.stall_s, 4), "first_staging_gib_s": _rate(nbytes, first.stall_s),
        "second_save_stall_s": round(second.stall_s, 4), "second_staging_gib_s": _rate(nbytes, second.stall_s),
        "same_writer": writer is not None and ckpt._writer is writer,
        "restaged": writer.restaged if isinstance(writer, CachedStagingWriter) else 0,
        "local_write_s": round(second.local_write_s or 0.0, 3), "complete": bool(done and done.complete),
        "errors": [r.error for r in (first, second) if r.error],
        "restore_s": round(restore_s, 3), "restored_step": manifest.step if manifest else None,
        "restored_equal": manifest is not None and _fingerprint(fresh) == saved,
    }
    ckpt.close()
    reader.close()
    del fresh
    shutil.rmtree(root, ignore_errors=True)
    return row


def _model_staging_gib_s() -> float | None:
    """The goodput model's STAGING_BYTES_PER_S in GiB/s; None where its module's pydantic is not installed."""
    try:
        from workloads.jobspec.goodput import STAGING_BYTES_PER_S
    except ImportError:
        return None
    return STAGING_BYTES_PER_S / GIB


def _rate(nbytes: int, seconds: float) -> float | None:
    return round(nbytes / GIB / seconds, 2) if seconds else None


def cached_stall(state_mib: int, device: torch.device, workdir: Path) -> float:
    """The second save's stall through FileSystemWriter(cache_staged_state_dict=True) (pinned buffers reused)."""
    state = _state(state_mib, device, seed=0, shard=False)
    writer = dcp.FileSystemWriter(workdir / "cached", sync_files=True, cache_staged_state_dict=True)
    stalls = []
    for _ in range(2):
        _sync(device)
        started = time.perf_counter()
        future = dcp.async_save({"state": state}, storage_writer=writer, no_dist=True)
        stalls.append(time.perf_counter() - started)
        getattr(future, "upload_completion", future).result()
        _step(state.model, state.optimizer, device)
    shutil.rmtree(workdir / "cached", ignore_errors=True)
    return round(stalls[1], 4)


def _init_group(device: torch.device, timeout_s: float) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
                       "LOCAL_WORLD_SIZE": "1"})
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1, timeout=timedelta(seconds=timeout_s))


def _partial(phase: str, values: dict[str, Any]) -> None:
    """Each phase's figures as a JSON line the moment they exist: a run stopped at its deadline keeps them."""
    print(json.dumps({"phase": phase, **values}), flush=True)


def run(state_mib: int, device: torch.device, workdir: Path) -> dict[str, Any]:
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "state_mib": state_mib, "workdir": str(workdir),
        "goodput_model_staging_gib_s": _model_staging_gib_s(),
    }
    result.update(transfer_rates(state_mib << 20, device, workdir))
    _partial("transfer", result)
    rows = [measure(state_mib, device, workdir, shard=False)]
    _partial("row", rows[0])
    _init_group(device, timeout_s=300)
    try:
        if device.type == "cuda":  # one NCCL all-reduce: the collective library loads and answers on this GPU
            probe = torch.ones(1, device=device)
            dist.all_reduce(probe)
            result["nccl_1rank_allreduce_ok"] = float(probe.item()) == 1.0
        rows.append(measure(state_mib, device, workdir, shard=True))
        _partial("row", rows[1])
    finally:
        dist.destroy_process_group()
    result["rows"] = rows
    # its staging buffers are pinned: a CUDA-only option
    result["cached_stall_2_s"] = cached_stall(state_mib, device, workdir) if device.type == "cuda" else None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-mib", type=int, default=3072, help="saved state in MiB (default 3072)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--workdir", type=Path, default=None, help="local disk for the checkpoints (default: a "
                                                                   "temporary folder)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    if args.state_mib < 1:
        print(f"error: --state-mib: must be at least 1, got {args.state_mib}", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        message = "no CUDA device on this machine (--device cpu runs the CPU path)"
        print(json.dumps({"rows": [], "skipped": message}) if args.json else f"skipped: {message}")
        return 0
    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-dev-", dir=args.workdir))
    try:
        result = run(args.state_mib, device, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not args.json:
        print(f"{result['device']}, torch {result['torch']}: state {args.state_mib} MiB; D2H pageable "
              f"{_fmt(result['d2h_pageable_gib_s'])} GiB/s, pinned {_fmt(result['d2h_pinned_gib_s'])} GiB/s; disk "
              f"{_fmt(result['disk_write_gib_s'])} GiB/s; cached-staging stall {result['cached_stall_2_s']} s")
        print(f"{'variant':<8}{'staging':>18}{'sync save s':>12}{'stall 1 s':>10}{'GiB/s':>8}{'stall 2 s':>10}"
              f"{'GiB/s':>8}{'write s':>9}{'restore s':>10}{'equal':>7}")
        for row in result["rows"]:
            print(f"{row['variant']:<8}{row['staging']:>18}{row['sync_save_s']:>12}{row['first_save_stall_s']:>10}"
                  f"{_fmt(row['first_staging_gib_s']):>8}{row['second_save_stall_s']:>10}"
                  f"{_fmt(row['second_staging_gib_s']):>8}{row['local_write_s']:>9}{row['restore_s']:>10}"
                  f"{str(row['restored_equal']):>7}")
    print(json.dumps(result))
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
