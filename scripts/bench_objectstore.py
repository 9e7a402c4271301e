"""The source study's setting rebuilt on 127.0.0.1: a JPEG folder in an S3 bucket mounted with s3fs (FUSE) behind
added latency, read directly by the folder-of-JPEGs Dataset, versus the same images packed into HDF5 shards,
staged once to local disk with the parallel stager and read by the HDF5 Dataset.

Reported like the study: per-epoch times of each path, the one-time staging, the total for 20 epochs
(staging + 20 x median epoch) and the ratio. Needs root, /dev/fuse and the Debian package s3fs.

    python scripts/bench_objectstore.py [--images 600] [--epochs 2] [--latency-ms 20] [--layout decoded] [--json]

Every server listens on 127.0.0.1, and everything started or mounted here is stopped or unmounted on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from bench_loader import generate  # noqa: E402
from svgbars import bar_chart_svg  # noqa: E402

from benchmarks.netem import local_s3_behind_latency  # noqa: E402
from workloads.data.format.manifest import atomic_write_bytes  # noqa: E402
from workloads.data.moving.s3 import S3Uri, make_client  # noqa: E402
from workloads.data.moving.stage import StageOptions, stage  # noqa: E402
from workloads.data.moving.upload import UploadOptions, upload  # noqa: E402
from workloads.data.reading.dataset import HDF5Dataset, JpegFolderDataset, make_loader, to_tensors  # noqa: E402
from workloads.data.reading.sampler import ElasticBatchSampler  # noqa: E402
from workloads.data.writing.pack import PackOptions, pack  # noqa: E402

BUCKET = "bench-objectstore"
STUDY_EPOCHS = 20
BATCH = 64
# moto accepts any credentials; these never leave 127.0.0.1 and name no real account.
ACCESS_KEY, SECRET_KEY = "bench", "bench-secret"


class BenchError(Exception):
    pass


@contextlib.contextmanager
def s3fs_mount(bucket: str, endpoint: str, mountpoint: Path, workdir: Path) -> Iterator[Path]:
    """Mount the bucket with s3fs (no local data cache: every epoch reads over the wire, as in the study)."""
    if shutil.which("s3fs") is None:
        raise BenchError("s3fs: not installed (apt-get install -y s3fs)")
    passwd = workdir / "passwd-s3fs"
    passwd.write_text(f"{ACCESS_KEY}:{SECRET_KEY}\n")
    passwd.chmod(0o600)
    mountpoint.mkdir(parents=True, exist_ok=True)
    options = f"url={endpoint},use_path_request_style,passwd_file={passwd},endpoint=us-east-1"
    subprocess.run(["s3fs", bucket, str(mountpoint), "-o", options], check=True, capture_output=True, timeout=60)
    try:
        for _ in range(100):
            if os.path.ismount(mountpoint):
                break
            time.sleep(0.1)
        else:
            raise BenchError(f"{mountpoint}: s3fs did not mount")
        yield mountpoint
    finally:
        for attempt in range(20):
            result = subprocess.run(["fusermount", "-u", str(mountpoint)], capture_output=True, text=True)
            if result.returncode == 0 or not os.path.ismount(mountpoint):
                break
            time.sleep(0.25 * (attempt + 1))
        if os.path.ismount(mountpoint):
            print(f"warning: {mountpoint}: still mounted; run fusermount -u {mountpoint}", file=sys.stderr)


def epoch_times(loader: Iterable[Any], sampler: ElasticBatchSampler, epochs: int) -> list[float]:
    """Wall time of each full epoch, worker start-up included only in the first (as a training run sees it)."""
    times = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        started = time.perf_counter()
        for batch in loader:
            to_tensors(batch)
        times.append(time.perf_counter() - started)
    return times


def upload_folder(client: Any, folder: Path, prefix: str) -> None:
    files = [path for path in sorted(folder.rglob("*")) if path.is_file()]

    def put(path: Path) -> None:
        client.put_object(Bucket=BUCKET, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=path.read_bytes())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, files))


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    folder = workdir / "jpegs"
    generate(folder, args.images)
    packed = workdir / "packed"
    pack(
        folder,
        packed,
        PackOptions(layout=args.layout, image_size=args.size, shard_bytes=32 << 20, workers=2, progress=False),
    )
    with local_s3_behind_latency(args.latency_ms) as s3:
        endpoint = s3.endpoint_url
        direct = make_client(s3.direct_url, 8, botocore_attempts=3)
        direct.create_bucket(Bucket=BUCKET)
        upload_folder(direct, folder, "jpegs")
        upload(direct, packed, S3Uri(BUCKET, "packed"), UploadOptions(progress=False))

        # Path 1: the study's baseline, ImageFolder-style reads through the s3fs mount.
        with s3fs_mount(BUCKET, endpoint, workdir / "mnt", workdir) as mountpoint:
            dataset = JpegFolderDataset(mountpoint / "jpegs", image_size=args.size)
            if len(dataset) != args.images:
                raise BenchError(f"{mountpoint}: s3fs lists {len(dataset)} images, uploaded {args.images}")
            sampler = ElasticBatchSampler([len(dataset)], BATCH, seed=0)
            loader = make_loader(dataset, sampler, workers=args.workers, persistent_workers=True)
            s3fs_epochs = epoch_times(loader, sampler, args.epochs)
            del loader

        # Path 2: stage the packed shards once (parallel ranged GETs through the same proxy), read locally.
        dest = workdir / "staged"
        started = time.perf_counter()
        stage(make_client(endpoint, 16), S3Uri(BUCKET, "packed"), dest, StageOptions(workers=16, progress=False))
        staging_s = time.perf_counter() - started
        dataset_h5 = HDF5Dataset(dest, image_size=args.size if args.layout == "encoded" else None)
        sampler = ElasticBatchSampler(dataset_h5.shard_sizes, BATCH, seed=0)
        loader = make_loader(dataset_h5, sampler, workers=args.workers, persistent_workers=True)
        staged_epochs = epoch_times(loader, sampler, args.epochs)
        del loader

    s3fs_total = STUDY_EPOCHS * statistics.median(s3fs_epochs)
    staged_total = staging_s + STUDY_EPOCHS * statistics.median(staged_epochs)
    return {
        "results": [
            {"path": "s3fs-folder", "epoch_s": s3fs_epochs, "staging_s": 0.0, "total_20_epochs_s": s3fs_total},
            {
                "path": "staged-hdf5",
                "epoch_s": staged_epochs,
                "staging_s": staging_s,
                "total_20_epochs_s": staged_total,
            },
        ],
        "ratio": s3fs_total / staged_total,
        "latency_ms": args.latency_ms,
        "images": args.images,
        "image_size": args.size,
        "layout": args.layout,
        "workers": args.workers,
        "load_average": os.getloadavg()[0],
    }


def table(report: dict[str, Any]) -> str:
    rows = [f"{'path':<14}{'epochs (s)':<28}{'staging (s)':>12}{'20 epochs (s)':>15}"]
    for entry in report["results"]:
        epochs = ", ".join(f"{value:.2f}" for value in entry["epoch_s"])
        rows.append(f"{entry['path']:<14}{epochs:<28}{entry['staging_s']:>12.2f}{entry['total_20_epochs_s']:>15.1f}")
    rows.append(
        f"\nratio {report['ratio']:.1f}x (target >= 36x)  |  {report['images']} images, "
        f"{report['layout']} shards, +{report['latency_ms']:g} ms RTT, {report['workers']} workers, "
        f"load average {report['load_average']:.1f}"
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=600)
    parser.add_argument("--epochs", type=int, default=2, help="epochs measured per path (>= 2)")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added round-trip latency per request")
    parser.add_argument("--layout", choices=["decoded", "encoded"], default="decoded")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, default=None, help="also write an SVG bar chart here")
    args = parser.parse_args()
    if args.epochs < 2 or args.images < BATCH:
        print(f"error: --epochs/--images: need >= 2 epochs and >= {BATCH} images", file=sys.stderr)
        return 2
    if os.geteuid() != 0 or not Path("/dev/fuse").exists():
        print("error: s3fs: needs root and /dev/fuse to mount", file=sys.stderr)
        return 2
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_DEFAULT_REGION="us-east-1")
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-objectstore-") as tmp:
            report = run(args, Path(tmp))
    except (BenchError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.decode(errors="replace").strip() if isinstance(exc, subprocess.CalledProcessError) else ""
        print(f"error: {exc} {detail}".strip(), file=sys.stderr)
        return 2
    if args.plot:
        bars = [(entry["path"], entry["total_20_epochs_s"]) for entry in report["results"]]
        title = f"20 epochs incl. staging: {report['ratio']:.0f}x (+{args.latency_ms:g} ms RTT, {args.images} images)"
        atomic_write_bytes(args.plot, bar_chart_svg(title, bars, "s", log=True).encode())
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
