"""Packing throughput: our sliced `pack` against LitData `optimize` and Streaming's `MDSWriter`, from one S3 server.

Every contender reads the same JPEGs from the same local S3 server (benchmarks/s3_server.py), does the same
per-image work (writing.samples.decode_image: full decode, EXIF orientation, RGB, resize + centre crop to S,
uint8 pixels) with the same number of worker processes, and ends with its dataset in the bucket:

    ours       `python -m workloads.data pack s3://B/raw s3://B/ours --shard-count N` x N processes, then
               `--publish` (fetch threads, decoding processes, HDF5 shards uploaded as they close)
    litdata    litdata.optimize(fn=fetch + decode, inputs=keys, num_workers=W) into a local directory, then every
               file uploaded (LitData writes straight to S3 only on Lightning's platform or with its own
               credentials setup; the upload is counted)
    streaming  the conversion Streaming documents for many processes: W processes, each fetching its contiguous
               part of the keys and writing an MDSWriter sub-dataset, then streaming.base.util.merge_index, then
               the upload

The figure is images/s over the whole conversion, and images/s per worker process (per core when W <= cores).

Records (the `--records` row of scripts/bench_pack.py): Parquet tables in the bucket, one row per image (its key and
a caption); every contender fetches each row's image, stores it as records_pack.normalize_image does (the upright
JPEG as it is, anything else re-encoded) and runs `record_map` on the row:

    ours-records      `pack-tables s3://B/tables s3://B/ours-rec --map benchmarks.pack_peers:record_map
                      --image-column image` (one process; image fetches and encodes on threads), then --publish
    litdata-records   litdata.optimize(fn=map + fetch + normalize, inputs=the tables' rows, num_workers=W) into a
                      local directory, then the upload
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _client(endpoint: str) -> Any:
    from workloads.data.moving.s3 import make_client

    return make_client(endpoint, 32, botocore_attempts=5)


@functools.lru_cache(maxsize=1)
def _worker_client(endpoint: str) -> Any:  # one per worker process
    return _client(endpoint)


def fetch_decode(endpoint: str, bucket: str, size: int, key: str) -> bytes:
    """The per-image work every contender does: GET, then pack's own decode_image (pixels)."""
    from workloads.data.writing.samples import decode_image

    raw = _worker_client(endpoint).get_object(Bucket=bucket, Key=key)["Body"].read()
    sample = decode_image(key, 0, raw, "decoded", size)
    if sample.payload is None:
        raise ValueError(f"{key}: {sample.reason}")
    return sample.payload


def listing(endpoint: str, bucket: str, prefix: str) -> list[tuple[str, int]]:
    """(key, label) of every image below prefix/<class>/, sorted, labels from the sorted class names."""
    keys = []
    for page in _client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        keys += [item["Key"] for item in page.get("Contents", [])]
    classes = sorted({key.split("/")[1] for key in keys})
    return sorted((key, classes.index(key.split("/")[1])) for key in keys)


def upload_dir(endpoint: str, bucket: str, folder: Path, prefix: str) -> None:
    client = _client(endpoint)
    files = [path for path in sorted(folder.rglob("*")) if path.is_file()]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(folder).as_posix()}"),
                      files))


def ours(endpoint: str, bucket: str, workers: int, size: int, shard_bytes: int, scratch: Path,
         slices: int = 1) -> dict[str, Any]:
    common = ["--size", str(size), "--shard-size", f"{shard_bytes}B", "--no-progress", "--endpoint-url", endpoint,
              "--scratch", str(scratch)]
    dest = f"s3://{bucket}/ours-{slices}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    per_slice = max(1, workers // slices)
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-m", "workloads.data", "pack", f"s3://{bucket}/raw", dest,
                                   *common, "--workers", str(per_slice), "--shard-count", str(slices),
                                   "--shard-index", str(index)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for index in range(slices)]
    for process in processes:
        _, err = process.communicate()
        if process.returncode:
            raise RuntimeError(f"slice failed: {err.strip().splitlines()[-1:]}")
    sliced = time.perf_counter() - started
    done = subprocess.run([sys.executable, "-m", "workloads.data", "pack", f"s3://{bucket}/raw", dest, *common,
                           "--publish"], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"publish failed: {done.stderr.strip()}")
    return {"seconds": time.perf_counter() - started, "slices_seconds": sliced, "processes": slices * per_slice}


def _lit_fn(endpoint: str, bucket: str, size: int, item: tuple[str, int]) -> dict[str, Any]:
    key, label = item
    return {"image": fetch_decode(endpoint, bucket, size, key), "label": label}


def litdata(endpoint: str, bucket: str, workers: int, size: int, shard_bytes: int, scratch: Path) -> dict[str, Any]:
    import litdata as ld

    started = time.perf_counter()
    inputs = listing(endpoint, bucket, "raw")
    out = scratch / "lit"
    ld.optimize(fn=functools.partial(_lit_fn, endpoint, bucket, size), inputs=inputs, output_dir=str(out),
                chunk_bytes=shard_bytes, num_workers=workers, mode="overwrite")
    upload_dir(endpoint, bucket, out, "lit")
    return {"seconds": time.perf_counter() - started, "processes": workers}


def _mds_part(args: tuple[str, str, int, int, str, list[tuple[str, int]]]) -> None:
    from benchmarks.peers_common import stub_torchvision

    stub_torchvision()  # streaming imports torchvision, which has no CPU build here (as in benchmarks/peers.py)
    from streaming import MDSWriter

    endpoint, bucket, size, shard_bytes, out, items = args
    with MDSWriter(out=out, columns={"image": "bytes", "label": "int"}, size_limit=shard_bytes) as writer:
        for key, label in items:
            writer.write({"image": fetch_decode(endpoint, bucket, size, key), "label": label})


def streaming(endpoint: str, bucket: str, workers: int, size: int, shard_bytes: int,
              scratch: Path) -> dict[str, Any]:
    import multiprocessing

    from benchmarks.peers_common import stub_torchvision

    stub_torchvision()
    from streaming.base.util import merge_index

    started = time.perf_counter()
    items = listing(endpoint, bucket, "raw")
    out = scratch / "mds"
    step = -(-len(items) // workers)
    parts = [(endpoint, bucket, size, shard_bytes, str(out / f"part-{index:03d}"), items[start:start + step])
             for index, start in enumerate(range(0, len(items), step))]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        pool.map(_mds_part, parts)
    merge_index(str(out), keep_local=True)
    upload_dir(endpoint, bucket, out, "mds")
    return {"seconds": time.perf_counter() - started, "processes": workers}


# -- records: Parquet tables of (image key, caption) rows, the same per-record work -------------------------------

def record_map(record: dict[str, Any]) -> dict[str, Any] | None:
    """The per-record user work both record contenders run: a toy tokenizer's normalisation of the caption."""
    return {"image": record["image"], "caption": " ".join(record["caption"].lower().split())}


def table_rows(endpoint: str, bucket: str) -> list[dict[str, Any]]:
    import io

    import pyarrow.parquet as pq

    client, rows = _client(endpoint), []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="tables/"):
        for item in sorted(page.get("Contents", []), key=lambda entry: entry["Key"]):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            rows += pq.read_table(io.BytesIO(body)).to_pylist()
    return rows


def ours_records(endpoint: str, bucket: str, workers: int, size: int, shard_bytes: int, scratch: Path,
                 slices: int = 1) -> dict[str, Any]:
    """pack-tables s3://B/tables s3://B/ours-rec --map ... in `slices` processes, then --publish."""
    fields = json.dumps([{"name": "image", "type": "image"}, {"name": "caption", "type": "text"}])
    common = ["--fields", fields, "--map", "benchmarks.pack_peers:record_map", "--image-column", "image",
              "--images", f"s3://{bucket}", "--shard-rows", "256", "--workers", str(max(2, 4 * workers // slices)),
              "--no-progress", "--endpoint-url", endpoint, "--scratch", str(scratch)]
    dest, env = f"s3://{bucket}/ours-rec-{slices}", {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    processes = [subprocess.Popen([sys.executable, "-m", "workloads.data", "pack-tables", f"s3://{bucket}/tables",
                                   dest, *common, "--shard-count", str(slices), "--shard-index", str(index)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for index in range(slices)]
    for process in processes:
        _, err = process.communicate()
        if process.returncode:
            raise RuntimeError(f"slice failed: {err.strip().splitlines()[-1:]}")
    done = subprocess.run([sys.executable, "-m", "workloads.data", "pack-tables", f"s3://{bucket}/tables", dest,
                           *common, "--publish"], env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"publish failed: {done.stderr.strip()}")
    return {"seconds": time.perf_counter() - started, "processes": slices}


def _lit_record(endpoint: str, bucket: str, row: dict[str, Any]) -> dict[str, Any]:
    from workloads.data.writing.records_pack import normalize_image

    record = record_map(row)
    assert record is not None
    raw = _worker_client(endpoint).get_object(Bucket=bucket, Key=record["image"])["Body"].read()
    return {"image": normalize_image(raw), "caption": record["caption"]}


def litdata_records(endpoint: str, bucket: str, workers: int, size: int, shard_bytes: int,
                    scratch: Path) -> dict[str, Any]:
    import litdata as ld

    started = time.perf_counter()
    rows = table_rows(endpoint, bucket)  # LitData's inputs are a list: the tables are read whole first
    out = scratch / "lit-rec"
    ld.optimize(fn=functools.partial(_lit_record, endpoint, bucket), inputs=rows, output_dir=str(out),
                chunk_bytes=shard_bytes, num_workers=workers, mode="overwrite")
    upload_dir(endpoint, bucket, out, "lit-rec")
    return {"seconds": time.perf_counter() - started, "processes": workers}


CONTENDERS = {"ours": ours, "litdata": litdata, "streaming": streaming, "ours-records": ours_records,
              "litdata-records": litdata_records}


def child_main(argv: list[str]) -> int:
    """`python -m benchmarks.pack_peers NAME JSON`: one contender in this process, one JSON line out."""
    name, params = argv[0], json.loads(argv[1])
    params["scratch"] = Path(params["scratch"])
    try:
        result = CONTENDERS[name](**params)
    except ImportError as exc:
        print(json.dumps({"error": f"not installed: {exc.name}"}))
        return 0
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
