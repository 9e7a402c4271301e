"""Packing throughput from object storage: images/s per worker process for our sliced pack, LitData optimize and
Streaming's MDSWriter on the same JPEGs from the same local S3 server, and our pack's scaling over 1, 2, 4 slices.

    .venv-bench/bin/python scripts/bench_pack.py [--images 1024] [--workers 2] [--size 256] [--shard-size 32MiB]
                                                 [--contenders ours,litdata,streaming] [--slices 1,2,4]
                                                 [--records ours-records,litdata-records] [--json]

Run it in the benchmark venv (`make bench-peers` builds it: LitData and Streaming are never in .venv). The server is
benchmarks/s3_server.py on 127.0.0.1 (started and stopped here, by its PID); every contender runs in its own
process (benchmarks/pack_peers.py) and ends with its dataset in the bucket. The machine's core count and load
average are printed with the figures: on a shared machine they say how far the figures can be trusted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_loader import generate  # noqa: E402

from benchmarks.processes import stop_process  # noqa: E402
from tests.moto_server import free_port  # noqa: E402
from workloads.cli import HelpWithDefaults, parse_size  # noqa: E402
from workloads.data.moving.s3 import make_client  # noqa: E402

BUCKET = "bench-pack"


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.s3_server", "-H", "127.0.0.1", "-p", str(port)],
                              cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                make_client(url, 1).list_buckets()
                break
            except Exception:  # noqa: BLE001 - not up yet: any failure is retried until the deadline
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the S3 server did not answer within 60 s") from None
                time.sleep(0.2)
        yield url
    finally:
        stop_process(server, 10)


def _upload_raw(url: str, folder: Path) -> int:
    from concurrent.futures import ThreadPoolExecutor

    client = make_client(url, 16)
    client.create_bucket(Bucket=BUCKET)
    files = sorted(path for path in folder.rglob("*.jpg"))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: client.put_object(Bucket=BUCKET, Key=f"raw/{p.relative_to(folder).as_posix()}",
                                                  Body=p.read_bytes()), files))
    return len(files)


def _upload_tables(url: str, folder: Path, tables: int = 8) -> None:
    """Parquet tables of (image key, caption) rows naming the uploaded JPEGs, for the records row."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = [f"raw/{p.relative_to(folder).as_posix()}" for p in sorted(folder.rglob("*.jpg"))]
    client = make_client(url, 4)
    for number in range(tables):
        part = keys[number::tables]
        buffer = io.BytesIO()
        pq.write_table(pa.table({"image": part, "caption": [f"A  Photo of {k.split('/')[1]}" for k in part]}),
                       buffer, row_group_size=64)
        client.put_object(Bucket=BUCKET, Key=f"tables/t{number:02d}.parquet", Body=buffer.getvalue())


def _run(name: str, params: dict[str, object]) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-m", "benchmarks.pack_peers", name, json.dumps(params)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          check=False, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {done.returncode}: {tail}"}
    return dict(json.loads(lines[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpWithDefaults)
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2, help="worker processes every contender gets")
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--shard-size", default="32MiB")
    parser.add_argument("--contenders", default="ours,litdata,streaming")
    parser.add_argument("--slices", default="1,2,4", help="our pack's scaling: slice processes, 1 worker each")
    parser.add_argument("--records", default="ours-records,litdata-records",
                        help="the records row: Parquet tables naming the same JPEGs (empty: skip)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    shard_bytes = parse_size(args.shard_size, 1 << 20)
    # The local server takes any key; nothing here may reach a real account.
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        os.environ.pop(name, None)
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="bench-pack-") as tmp:
        root = Path(tmp)
        generate(root / "jpegs", args.images)
        with s3_server() as url:
            count = _upload_raw(url, root / "jpegs")
            base = {"endpoint": url, "bucket": BUCKET, "size": args.size, "shard_bytes": shard_bytes}

            def run(name: str, label: str, workers: int, **extra: object) -> None:
                scratch = root / f"scratch-{label}"
                scratch.mkdir()
                load = os.getloadavg()[0]
                result = _run(name, {**base, "workers": workers, "scratch": str(scratch), **extra})
                row: dict[str, object] = {"contender": label, "workers": workers, "load_before": round(load, 2),
                                          **result}
                if "seconds" in result:
                    seconds = float(result["seconds"])  # type: ignore[arg-type]
                    row["images_per_s"] = round(count / seconds, 1)
                    row["images_per_s_per_process"] = round(count / seconds / int(result["processes"]), 1)  # type: ignore[call-overload]
                rows.append(row)

            for name in (text for text in args.contenders.split(",") if text):
                run(name, name, args.workers)
            for slices in (int(text) for text in args.slices.split(",") if text):
                run("ours", f"ours-{slices}-slices", slices, slices=slices)
            if args.records:
                _upload_tables(url, root / "jpegs")
                for name in args.records.split(","):
                    run(name, name, args.workers)
    summary = {"images": args.images, "size": args.size, "shard_bytes": shard_bytes, "cpus": os.cpu_count(),
               "load_after": round(os.getloadavg()[0], 2), "rows": rows}
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{args.images} JPEGs (~500x375) -> {args.size}px uint8, shards of {shard_bytes} bytes; "
          f"{os.cpu_count()} CPUs, load average {summary['load_after']}")
    print(f"{'contender':<20} {'procs':>5} {'seconds':>8} {'images/s':>9} {'per proc':>9}  note")
    for row in rows:
        if "error" in row:
            print(f"{row['contender']:<20} {row['workers']:>5} {'-':>8} {'-':>9} {'-':>9}  {row['error']}")
            continue
        print(f"{row['contender']:<20} {row['processes']:>5} {float(row['seconds']):>8.1f} "  # type: ignore[arg-type]
              f"{row['images_per_s']:>9} {row['images_per_s_per_process']:>9}  load before {row['load_before']}")
    for mine, peers in (("ours", ("litdata", "streaming")), ("ours-records", ("litdata-records",))):
        ours = next((row for row in rows if row["contender"] == mine and "images_per_s" in row), None)
        for row in rows:
            if ours is not None and row["contender"] in peers and "images_per_s" in row:
                ratio = float(ours["images_per_s"]) / float(row["images_per_s"])  # type: ignore[arg-type]
                per = float(ours["images_per_s_per_process"]) / float(row["images_per_s_per_process"])  # type: ignore[arg-type]
                print(f"{mine} / {row['contender']}: {ratio:.2f}x images/s, {per:.2f}x per process")
    return 0


if __name__ == "__main__":
    sys.exit(main())
