"""Sharded checkpoint costs, per world size: what a save blocks, how fast each tier takes it, how long a restore is.

For 1, 2 and 4 ranks (gloo on 127.0.0.1, one process per rank) holding a model of --state-mib MiB of fp32
parameters sharded with FSDP2, plus Adam's two moments (the saved state is ~3x the parameters):

  sync_save_s     dcp.save to the local tier, the loop blocked for all of it
  async_stall_s   ShardedCheckpointer.save: what the training loop waits for (the copy to host memory)
  local_mib_s     the local tier's write rate: the state's bytes over the time from save() to the shards written
                  and hashed (all ranks)
  s3_mib_s        the remote tier's rate: bytes over the copy to S3 (a moto server behind the project's latency
                  proxy, benchmarks/netem.py, its own processes) until the manifest is in
  restore_local_s the same world size restarted on the same disks (a process restart, a rank restart): the newest
                  checkpoint found in the local tier, every file checked against its sha256, loaded
  restore_s       a new formation of the NEXT world size in --ranks (1 -> 2 -> 4 -> 1 by default) on fresh local
                  disks (lost nodes): the newest checkpoint found in S3, downloaded, verified and loaded resharded

With s3torchconnector's DCP extra installed (pip install 's3torchconnector[dcp]==1.5.0', the bench extra), a row
more: its S3StorageWriter saving the same state straight to the same S3 endpoint (tc_s3_mib_s).

    python scripts/bench_checkpoint.py [--state-mib 64] [--ranks 1 2 4] [--latency-ms 20] [--json]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import boto3  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

from benchmarks.netem import free_port, local_s3_behind_latency  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402
from workloads.train.sharded import SaveReport, ShardedCheckpointer, TrainingState  # noqa: E402

BUCKET = "bench-checkpoint"
LAYERS = 4


def _model(state_mib: int) -> nn.Sequential:
    """LAYERS square Linear layers holding state_mib MiB of fp32 weights between them."""
    width = int(((state_mib << 20) / 4 / LAYERS) ** 0.5)
    return nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(LAYERS)))


def _state(state_mib: int, world: int) -> TrainingState:
    torch.manual_seed(0)
    model = _model(state_mib)
    if world > 1:
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = model[0]
    assert isinstance(first, nn.Linear)
    model(torch.randn(2, first.in_features)).sum().backward()
    optimizer.step()  # Adam's moments exist: they are two thirds of the state
    return TrainingState(model, optimizer)


def _init(rank: int, world: int, port: int) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    dist.init_process_group("gloo", rank=rank, world_size=world)


def _save_worker(rank: int, world: int, port: int, args: dict, out: str) -> None:
    _init(rank, world, port)
    state = _state(args["state_mib"], world)
    root = Path(args["work"]) / f"w{world}"
    dist.barrier()
    started = time.perf_counter()
    dcp.save({"state": state}, storage_writer=dcp.FileSystemWriter(root / "sync", sync_files=True))
    dist.barrier()
    sync_s = time.perf_counter() - started
    ckpt = ShardedCheckpointer(root / "local", args["uri"] + f"/w{world}", keep=1, log=lambda line: None)
    dist.barrier()
    report = ckpt.save(state, 1, meta={"world": world})
    ckpt.wait()
    reports: list[SaveReport] = [report] * world  # every rank's, once gathered
    dist.all_gather_object(reports, report)
    if rank == 0:
        Path(out).write_text(json.dumps({
            "sync_save_s": sync_s,
            "async_stall_s": max(r.stall_s for r in reports),
            "state_bytes": report.total_bytes,
            "local_s": max(r.local_write_s or 0.0 for r in reports),
            "s3_s": max(r.remote_s or 0.0 for r in reports),
            "complete": all(r.complete for r in reports),
            "errors": [r.error for r in reports if r.error],
        }))
    dist.barrier()
    dist.destroy_process_group()


def _restore_worker(rank: int, world: int, port: int, args: dict, out: str) -> None:
    _init(rank, world, port)
    state = _state(args["state_mib"], world)
    if args.get("local_only"):  # the disks the save wrote: the local tier alone
        ckpt = ShardedCheckpointer(Path(args["work"]) / f"w{world}" / "local", None, keep=1, log=lambda line: None)
    else:
        local = Path(args["work"]) / f"restore-{world}-{rank}"  # a fresh disk per rank: everything comes from S3
        ckpt = ShardedCheckpointer(local, args["uri"] + f"/w{args['from_world']}", keep=1, local_rank=0,
                                   log=lambda line: None)
    dist.barrier()
    started = time.perf_counter()
    manifest = ckpt.load(state)
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps({"restore_s": time.perf_counter() - started,
                                         "found": manifest is not None}))
    dist.destroy_process_group()


def _spawn(worker, world: int, args: dict) -> dict:  # noqa: ANN001
    out = Path(args["work"]) / f"result-{worker.__name__}-{world}.json"
    mp.spawn(worker, args=(world, free_port(), args, str(out)), nprocs=world, join=True)
    return json.loads(out.read_text())


def _s3torchconnector_rate(state_mib: int, endpoint: str) -> float | str:
    """MiB/s of s3torchconnector's DCP S3StorageWriter saving the 1-rank state to the same endpoint."""
    try:
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client
        from s3torchconnector.dcp import S3FileSystem, S3StorageWriter
    except ImportError as exc:
        return f"skipped ({exc}; pip install 's3torchconnector[dcp]==1.5.0')"
    config = S3ClientConfig(force_path_style=True)
    writer = S3StorageWriter("us-east-1", f"s3://{BUCKET}/tc", s3client_config=config)
    # S3StorageWriter takes no endpoint; its file system takes a client, and the client takes one
    writer.fs = S3FileSystem("us-east-1", s3_client=S3Client("us-east-1", endpoint=endpoint, s3client_config=config))
    state = _state(state_mib, 1)
    started = time.perf_counter()
    dcp.save({"state": state}, storage_writer=writer, no_dist=True)
    seconds = time.perf_counter() - started
    return round(3 * (state_mib << 20) / seconds / (1 << 20), 1)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--state-mib", type=int, default=64, help="fp32 parameters in MiB (default 64)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4], help="world sizes (default 1 2 4)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added S3 round-trip latency (default 20)")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    rows = []
    try:
        with local_s3_behind_latency(args.latency_ms) as s3:
            boto3.client("s3", endpoint_url=s3.direct_url, region_name="us-east-1").create_bucket(Bucket=BUCKET)
            os.environ["AWS_ENDPOINT_URL_S3"] = s3.endpoint_url
            shared = {"state_mib": args.state_mib, "work": str(work), "uri": f"s3://{BUCKET}/run"}
            for position, world in enumerate(args.ranks):
                saved = _spawn(_save_worker, world, shared)
                local = _spawn(_restore_worker, world, {**shared, "from_world": world, "local_only": True})
                after = args.ranks[(position + 1) % len(args.ranks)] if len(args.ranks) > 1 else world
                restored = _spawn(_restore_worker, after, {**shared, "from_world": world})
                mib = saved["state_bytes"] / (1 << 20)
                rows.append({
                    "ranks": world, "state_mib": round(mib, 1), "sync_save_s": round(saved["sync_save_s"], 3),
                    "async_stall_s": round(saved["async_stall_s"], 4),
                    "local_mib_s": round(mib / saved["local_s"], 1), "s3_mib_s": round(mib / saved["s3_s"], 1),
                    "restore_local_s": round(local["restore_s"], 3),
                    "restore_ranks": after, "restore_s": round(restored["restore_s"], 3),
                    "complete": saved["complete"] and restored["found"] and local["found"], "errors": saved["errors"],
                })
                shutil.rmtree(work / f"w{world}", ignore_errors=True)
            tc = _s3torchconnector_rate(args.state_mib, s3.endpoint_url)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"latency_ms": args.latency_ms, "rows": rows, "s3torchconnector_1rank_mib_s": tc}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"state: {args.state_mib} MiB of fp32 parameters + Adam moments; S3: moto behind +{args.latency_ms:g} ms")
    print(f"{'ranks':>5} {'state MiB':>9} {'sync save s':>11} {'async stall s':>13} {'local MiB/s':>11} "
          f"{'S3 MiB/s':>8} {'restore local s':>15} {'restore S3 (ranks) s':>20}")
    for row in rows:
        print(f"{row['ranks']:>5} {row['state_mib']:>9} {row['sync_save_s']:>11} {row['async_stall_s']:>13} "
              f"{row['local_mib_s']:>11} {row['s3_mib_s']:>8} {row['restore_local_s']:>15} "
              f"{row['restore_s']:>15} ({row['restore_ranks']})")
    if not all(row["complete"] for row in rows):
        print("incomplete: " + json.dumps([row for row in rows if not row["complete"]]))
    print(f"s3torchconnector S3StorageWriter, 1 rank: {tc}{' MiB/s' if isinstance(tc, float) else ''}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
