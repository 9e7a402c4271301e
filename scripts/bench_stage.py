"""Stager throughput against a local S3 server (moto, its own process) behind a latency proxy (its own process).

Ways to move the same objects through the same proxy:
  sequential    one boto3 get_object stream at a time, written to disk (the study's download loop)
  stager        workloads.data.moving.stage (copy mode): parallel ranged GETs, pwrite, fsync, sha256 verify,
                atomic rename
  ceiling       the same ranged GETs as raw http.client requests from as many threads, bytes discarded
  cache         `stage --budget` of --budget-shards shards (the CLI in its own process, as the Job's sidecar),
                while a reader (CacheReader, as the training node uses it) walks the shards in manifest order for
                --cache-epochs epochs: before each shard it writes the plan (that shard and the rest of the
                epoch, then the next epoch's), waits for it, reads it whole; at the end it writes a done plan. A
                staging cache smaller than the dataset streams every epoch again: the stager evicts what the
                reader is past to fetch what comes next. The rate counts the epochs after the first (`cache-first`
                is the first alone)
  cache-whole   one epoch with a budget that holds the whole dataset (should match the copy-mode stager)

Every method's clock starts after its S3 client is built (building one takes ~0.1 s here, paid once per process in
a real stager) and before its first request (the cache methods: once the stager process has put the manifest in
DEST, where a trainer starts reading); each run opens fresh connections.

    python scripts/bench_stage.py [--objects 16] [--object-mib 16] [--latency-ms 20] [--per-connection-mb-s 20]
                                  [--workers 16] [--part-mib 8] [--budget-shards 2]
                                  [--cache-epochs 3] [--repeats 2] [--skip-sequential] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.netem import local_s3_behind_latency  # noqa: E402
from workloads.data import TOOL_VERSION  # noqa: E402
from workloads.data.format.manifest import MANIFEST_NAME, Manifest, ShardInfo, shard_name  # noqa: E402
from workloads.data.moving.cache import CacheReader  # noqa: E402
from workloads.data.moving.s3 import S3Uri, make_client  # noqa: E402
from workloads.data.moving.stage import StageOptions, stage  # noqa: E402

BUCKET = "bench-stage"
PREFIX = "dataset"


def _seed(client, objects: int, object_bytes: int) -> Manifest:  # noqa: ANN001
    client.create_bucket(Bucket=BUCKET)
    shards = []
    for index in range(objects):
        payload = os.urandom(object_bytes)
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{shard_name(index)}", Body=payload)
        shards.append(
            ShardInfo(
                path=shard_name(index),
                num_samples=1,
                first_index=index,
                bytes=object_bytes,
                sha256=hashlib.sha256(payload).hexdigest(),
            )
        )
    manifest = Manifest(tool_version=TOOL_VERSION, layout="encoded", classes=["x"], num_samples=objects, shards=shards)
    client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{MANIFEST_NAME}", Body=manifest.model_dump_json().encode())
    return manifest


def _sequential(client, manifest: Manifest, dest: Path) -> int:  # noqa: ANN001
    total = 0
    for shard in manifest.shards:
        body = client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{shard.path}")["Body"]
        with open(dest / shard.path, "wb") as handle:
            for chunk in body.iter_chunks(1 << 20):
                handle.write(chunk)
                total += len(chunk)
    return total


def _ceiling(signer, endpoint: str, manifest: Manifest, workers: int, part_bytes: int) -> int:  # noqa: ANN001
    work: queue.Queue[tuple[str, int, int] | None] = queue.Queue()
    for shard in manifest.shards:
        url = signer.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": f"{PREFIX}/{shard.path}"})
        target = url.split(endpoint, 1)[1]  # path + signed query, sent as-is over a raw connection
        for start in range(0, shard.bytes, part_bytes):
            work.put((target, start, min(start + part_bytes, shard.bytes) - 1))
    port = int(endpoint.rsplit(":", 1)[1])
    counted = [0] * workers

    def run(slot: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while (item := work.get()) is not None:
            target, start, end = item
            conn.request("GET", target, headers={"Range": f"bytes={start}-{end}"})
            response = conn.getresponse()
            if response.status != 206:
                raise RuntimeError(f"ceiling GET answered {response.status}: {response.read()[:200]!r}")
            while chunk := response.read(1 << 20):
                counted[slot] += len(chunk)
        conn.close()

    for _ in range(workers):
        work.put(None)
    threads = [threading.Thread(target=run, args=(slot,)) for slot in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counted)


@dataclasses.dataclass
class _CacheRun:
    bytes_read: int
    epoch_seconds: list[float]  # from the reader's first plan of the epoch to its last shard read


def _cache_epochs(endpoint: str, manifest: Manifest, dest: Path, options: StageOptions, epochs: int) -> _CacheRun:
    """`epochs` epochs through the staging cache: the stager (the CLI, in its own process, as the Job's sidecar)
    follows the plan a reader writes as it reads every shard in manifest order, epoch after epoch. The reader
    starts once the stager has put the manifest in DEST, as the trainer does."""
    assert options.budget_bytes is not None
    dest.mkdir(parents=True)
    command = [sys.executable, "-m", "workloads.data", "stage", f"s3://{BUCKET}/{PREFIX}", str(dest),
               "--endpoint-url", endpoint, "--workers", str(options.workers),
               "--part-size", f"{options.part_bytes}B", "--budget", f"{options.budget_bytes}B", "--no-progress"]
    stager = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    read: list[int] = []
    seconds: list[float] = []
    names = [shard.path for shard in manifest.shards]
    buffer = bytearray(max(shard.bytes for shard in manifest.shards))
    cache = CacheReader(dest)  # the training node's reader, with its default polling
    try:
        while not (dest / MANIFEST_NAME).is_file():
            if stager.poll() is not None:
                raise RuntimeError(f"stager exited with {stager.returncode}: {stager.communicate()[1].strip()}")
            time.sleep(cache.poll_interval_s)
        for epoch in range(epochs):
            began = time.perf_counter()
            for position, name in enumerate(names):
                # The shard being read stays first until the reader is past it; the next epoch follows.
                cache.write_plan(names[position:] + (names if epoch + 1 < epochs else []))
                path = cache.wait_ready(name, timeout=600)
                with open(path, "rb", buffering=0) as handle:
                    read.append(handle.readinto(buffer))
            seconds.append(time.perf_counter() - began)
    finally:
        cache.write_plan([], done=True)  # the stager exits (also after a failure)
        _, errors = stager.communicate(timeout=60)
    if stager.returncode != 0:
        raise RuntimeError(f"stager exited with {stager.returncode}: {errors.strip()}")
    return _CacheRun(sum(read), seconds)


def _fresh(directory: Path) -> Path:
    directory.mkdir(parents=True)
    return directory


def _clocked(action: Callable[[], int]) -> tuple[int, float]:
    began = time.perf_counter()
    moved = action()
    return moved, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--object-mib", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added round-trip latency")
    parser.add_argument("--per-connection-mb-s", type=float, default=20.0,
                        help="cap per connection (0 = none); see docs/data-tools.md for why 20")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--part-mib", type=int, default=8)
    parser.add_argument("--budget-shards", "--window-shards", dest="budget_shards", type=int, default=2,
                        help="staging-cache budget of the cache method, in shards")
    parser.add_argument("--cache-epochs", type=int, default=3, help="epochs the cache method's reader walks (>= 2)")
    parser.add_argument("--skip-sequential", action="store_true", help="leave out the slow one-stream method")
    parser.add_argument("--repeats", type=int, default=2, help="runs per method, interleaved; the fastest counts")
    parser.add_argument("--scratch", type=Path, default=Path("/dev/shm") if Path("/dev/shm").is_dir() else None,
                        help="where downloads land (default /dev/shm, standing in for the node's NVMe)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.cache_epochs < 2:
        parser.error("--cache-epochs: at least 2 (the first epoch includes the stager's start)")
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")

    with local_s3_behind_latency(args.latency_ms, args.per_connection_mb_s) as s3, \
            tempfile.TemporaryDirectory(prefix="bench-stage-", dir=args.scratch) as scratch:
        endpoint = s3.endpoint_url
        seeder = make_client(s3.direct_url, 4, botocore_attempts=3)
        manifest = _seed(seeder, args.objects, args.object_mib << 20)
        part_bytes = args.part_mib << 20
        options = StageOptions(workers=args.workers, part_bytes=part_bytes, progress=False)
        cache = dataclasses.replace(options, budget_bytes=args.budget_shards * (args.object_mib << 20))
        whole = dataclasses.replace(options, budget_bytes=args.objects * (args.object_mib << 20))
        source = S3Uri(BUCKET, PREFIX)
        runs: dict[str, tuple[int, float]] = {}

        def keep(method: str, moved: int, seconds: float) -> None:
            if method not in runs or seconds < runs[method][1]:
                runs[method] = (moved, seconds)

        for run in range(args.repeats):
            if not args.skip_sequential:
                client = make_client(endpoint, max_connections=1, botocore_attempts=3)
                dest = _fresh(Path(scratch) / f"sequential{run}")
                keep("sequential", *_clocked(lambda client=client, dest=dest: _sequential(client, manifest, dest)))
            signer = make_client(endpoint, 1)
            keep("ceiling", *_clocked(lambda signer=signer: _ceiling(signer, endpoint, manifest, args.workers,
                                                                     part_bytes)))
            client = make_client(endpoint, 2 * args.workers)  # as the CLI builds it: the urgent lane
            dest = Path(scratch) / f"stager{run}"
            keep("stager", *_clocked(lambda client=client, dest=dest: stage(client, source, dest,
                                                                            options).fetched_bytes))
            cached = _cache_epochs(endpoint, manifest, Path(scratch) / f"cache{run}", cache, args.cache_epochs)
            per_epoch = cached.bytes_read // args.cache_epochs
            keep("cache-first", per_epoch, cached.epoch_seconds[0])
            keep("cache", cached.bytes_read - per_epoch, sum(cached.epoch_seconds[1:]))
            held = _cache_epochs(endpoint, manifest, Path(scratch) / f"whole{run}", whole, 1)
            keep("cache-whole", held.bytes_read, held.epoch_seconds[0])
            for leftover in Path(scratch).iterdir():  # keep at most one run's bytes in scratch (tmpfs is RAM)
                shutil.rmtree(leftover)

    rate = {method: round(moved / seconds / 1e6, 1) for method, (moved, seconds) in runs.items()}
    results = [{"method": method, "mb_per_s": rate[method], "bytes": moved} for method, (moved, _) in runs.items()]
    ratios = {"stager/ceiling": rate["stager"] / rate["ceiling"], "cache/ceiling": rate["cache"] / rate["ceiling"],
              "cache-whole/stager": rate["cache-whole"] / rate["stager"]}
    if "sequential" in rate:
        ratios["stager/sequential"] = rate["stager"] / rate["sequential"]
    load = [round(value, 2) for value in os.getloadavg()]
    if args.json:
        print(json.dumps({"results": results, "ratios": ratios, "latency_ms": args.latency_ms,
                          "budget_shards": args.budget_shards, "cache_epochs": args.cache_epochs,
                          "min_part_bytes": options.min_part_bytes, "load_average": load}))
        return 0
    print(f"{args.objects} objects x {args.object_mib} MiB, +{args.latency_ms:g} ms RTT, "
          f"{args.per_connection_mb_s or 'no'} MB/s per-connection cap, {args.workers} workers, "
          f"{args.part_mib} MiB parts (at least {options.min_part_bytes / (1 << 20):g} MiB), cache budget "
          f"{args.budget_shards} shards over {args.cache_epochs} epochs, best of {args.repeats}")
    print(f"{'method':<14}{'MB/s':>10}{'bytes':>14}{'seconds':>10}")
    for method, (moved, seconds) in runs.items():
        print(f"{method:<14}{rate[method]:>10.1f}{moved:>14}{seconds:>10.2f}")
    if "sequential" in rate:
        print(f"stager / sequential = {ratios['stager/sequential']:.2f}x (target >= 4)")
    print(f"stager / ceiling = {ratios['stager/ceiling']:.0%} (target >= 80%), "
          f"cache / ceiling = {ratios['cache/ceiling']:.0%} (target >= 80%), "
          f"cache-whole / stager = {ratios['cache-whole/stager']:.0%} (target ~100%)")
    print(f"load average (1/5/15 min): {load[0]} {load[1]} {load[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
