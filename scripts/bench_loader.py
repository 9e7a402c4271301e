"""Loader throughput (samples/s) on the same generated JPEGs: folder of JPEGs (the study's baseline), packed HDF5
(encoded bytes; pre-decoded uint8), WebDataset tar shards, and a raw sequential read of the decoded shards.

Every loader delivers the same uint8 (N, S, S, 3) batches; random-resized-crop, flip and normalisation are per
batch on the training device and identical for all, so they are not part of what is timed here. Decoding:
the folder and WebDataset paths decode as torchvision's ImageFolder and webdataset's "pil" decoder do (full
resolution); the HDF5 encoded path uses libjpeg's reduced-scale decode (simplejpeg where installed, else PIL
draft). The "ablations" entries give the folder and WebDataset paths PIL's draft decode, to separate the storage
effect from the decode effect, and run the HDF5 encoded path with PIL's draft decode instead of simplejpeg.
--decode-only runs just the HDF5 encoded decoders (the decode ablation) at 0 and 2 workers: simplejpeg, PIL's
draft decode, and the decode cache once warm (hdf5-encoded-kept: every epoch after the first reads kept pixels).

    python scripts/bench_loader.py [--quick] [--decode-only] [--json] [--images N] [--size S] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402
from torch.utils.data import default_collate  # noqa: E402

from workloads.data.format.jpeg import (
    decode_bytes,  # noqa: E402
    fast_decoder_available,  # noqa: E402
)
from workloads.data.format.manifest import atomic_write_bytes  # noqa: E402
from workloads.data.reading.dataset import HDF5Dataset, JpegFolderDataset, make_loader, to_tensors  # noqa: E402
from workloads.data.reading.sampler import ElasticBatchSampler  # noqa: E402
from workloads.data.writing.pack import PackOptions, pack  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from svgbars import bar_chart_svg  # noqa: E402

CLASSES = 10
BATCH = 128


def _make_jpeg(task: tuple[Path, int]) -> None:
    """An ImageNet-like JPEG (about 500x375, ~100 KB at quality 90): smooth structure plus sensor-like noise."""
    path, seed = task
    rng = np.random.default_rng(seed)
    width, height = int(rng.integers(400, 501)), int(rng.integers(300, 376))
    if seed % 4 == 0:
        width, height = height, width
    y, x = np.mgrid[0:height, 0:width]
    phase = rng.uniform(0, 6.3, 3)
    base = np.stack([127 + 100 * np.sin(x / (20 + 9 * c) + y / (31 + 7 * c) + phase[c]) for c in range(3)], -1)
    pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="JPEG", quality=90)


def generate(folder: Path, count: int) -> None:
    tasks = []
    for index in range(count):
        directory = folder / f"class{index % CLASSES:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        tasks.append((directory / f"img{index:06d}.jpg", index))
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(_make_jpeg, tasks, chunksize=32))


def write_webdataset(folder: Path, out: Path, shards: int) -> list[str]:
    import webdataset as wds

    dataset = JpegFolderDataset(folder)
    out.mkdir(parents=True, exist_ok=True)
    per_shard = -(-len(dataset) // shards)
    urls = []
    for shard in range(shards):
        url = str(out / f"shard-{shard:04d}.tar")
        with wds.TarWriter(url) as sink:
            for index in range(shard * per_shard, min(len(dataset), (shard + 1) * per_shard)):
                path, label = dataset.samples[index]
                sink.write({"__key__": f"{index:08d}", "jpg": Path(path).read_bytes(), "cls": str(label).encode()})
        urls.append(url)
    return urls


def _wds_sample(size: int, draft: bool, sample: tuple[bytes, bytes]) -> tuple[torch.Tensor, int]:
    payload, label = sample
    return torch.from_numpy(decode_bytes(payload, size, draft=draft)), int(label)


def webdataset_loader(urls: list[str], size: int, draft: bool, workers: int) -> Iterable[Any]:
    import webdataset as wds

    pipeline = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .to_tuple("jpg", "cls")
        .map(partial(_wds_sample, size, draft))
        .batched(BATCH, collation_fn=default_collate)
    )
    return wds.WebLoader(pipeline, batch_size=None, num_workers=workers, persistent_workers=workers > 0)


def map_loader(dataset: Any, workers: int) -> Iterable[Any]:
    sampler = ElasticBatchSampler(getattr(dataset, "shard_sizes", [len(dataset)]), BATCH, seed=0)
    return make_loader(dataset, sampler, workers=workers, persistent_workers=True)


def throughput(loader: Iterable[Any], min_seconds: float) -> float:
    """Samples/s over whole epochs after a warm-up of a few batches (worker start-up is not counted)."""
    for count, batch in enumerate(loader):
        to_tensors(batch)
        if count == 2:
            break
    samples, started = 0, time.perf_counter()
    while True:
        for batch in loader:
            images, _ = to_tensors(batch)
            samples += images.shape[0]
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return samples / elapsed


def raw_read(paths: list[Path], sample_bytes: int, min_seconds: float, fresh_batches: bool) -> float:
    """Samples/s of reading the decoded shard files front to back in batch-sized reads.

    fresh_batches=True reads each batch into newly allocated memory, as any loader that hands out batches must;
    False reuses one buffer (a floor no loader can reach: the memory stays mapped and cache-warm).
    """
    batch_bytes = BATCH * sample_bytes
    reused = memoryview(bytearray(batch_bytes))
    total, started = 0, time.perf_counter()
    while True:
        for path in paths:
            with open(path, "rb", buffering=0) as handle:
                while True:
                    buffer = memoryview(np.empty(batch_bytes, dtype=np.uint8)) if fresh_batches else reused
                    read = handle.readinto(buffer)
                    if not read:
                        break
                    total += read
        elapsed = time.perf_counter() - started
        if elapsed >= min_seconds:
            return total / sample_bytes / elapsed


def run(images: int, size: int, workdir: Path, min_seconds: float, repeats: int,
        decode_only: bool = False) -> dict[str, Any]:
    folder = workdir / "folder"
    if not folder.exists():
        generate(folder, images)
    encoded, decoded = workdir / "hdf5-encoded", workdir / "hdf5-decoded"
    common = {"image_size": size, "shard_bytes": 64 << 20, "workers": 2, "progress": False, "force": True}
    if not (encoded / "manifest.json").exists():
        pack(folder, encoded, PackOptions(layout="encoded", **common))
    if not (decoded / "manifest.json").exists():
        pack(folder, decoded, PackOptions(layout="decoded", **common))
    urls = [] if decode_only else write_webdataset(folder, workdir / "webdataset", shards=8)
    shard_paths = sorted(decoded.glob("shard-*.h5"))
    sample_bytes = size * size * 3

    def kept(workers: int) -> Iterable[Any]:
        """The encoded shards with the decode cache, filled by one epoch first: what every epoch after the first
        reads (a fresh cache directory each time)."""
        rows = workdir / "decoded-rows"
        shutil.rmtree(rows, ignore_errors=True)
        dataset = HDF5Dataset(encoded, image_size=size, decode_cache=rows,
                              decode_cache_bytes=images * (1 + sample_bytes) * 2)
        loader = map_loader(dataset, workers)
        for batch in loader:
            to_tensors(batch)
        return loader

    def loaders(workers: int) -> dict[str, Callable[[], Iterable[Any]]]:
        if decode_only:
            return {
                "hdf5-encoded": lambda: map_loader(HDF5Dataset(encoded, image_size=size), workers),
                "hdf5-encoded-pil-decode": lambda: map_loader(
                    HDF5Dataset(encoded, image_size=size, fast_decode=False), workers),
                "hdf5-encoded-kept": lambda: kept(workers),
            }
        return {
            "folder": lambda: map_loader(JpegFolderDataset(folder, image_size=size), workers),
            "hdf5-encoded": lambda: map_loader(HDF5Dataset(encoded, image_size=size), workers),
            "hdf5-decoded": lambda: map_loader(HDF5Dataset(decoded), workers),
            "webdataset": lambda: webdataset_loader(urls, size, False, workers),
        }

    ablation_loaders = {} if decode_only else {
        "folder-draft-decode": lambda: map_loader(JpegFolderDataset(folder, image_size=size, draft=True), 2),
        "webdataset-draft-decode": lambda: webdataset_loader(urls, size, True, 2),
        "hdf5-encoded-pil-decode": lambda: map_loader(HDF5Dataset(encoded, image_size=size, fast_decode=False), 2),
    }
    # Every configuration runs once per round, rounds interleave, and the best round counts: other processes
    # on a shared machine only ever slow a run down.
    best: dict[tuple[str, int], float] = {}
    for _ in range(repeats):
        for workers in (0, 2):
            for name, make in loaders(workers).items():
                loader = make()
                figure = throughput(loader, min_seconds)
                del loader
                best[name, workers] = max(best.get((name, workers), 0.0), figure)
        for name, make in ablation_loaders.items():
            loader = make()
            best[name, 2] = max(best.get((name, 2), 0.0), throughput(loader, min_seconds))
            del loader
        for name, fresh in () if decode_only else (("raw-read", True), ("raw-read-reused-buffer", False)):
            best[name, 0] = max(best.get((name, 0), 0.0), raw_read(shard_paths, sample_bytes, min_seconds, fresh))
    main_names = {"folder", "hdf5-encoded", "hdf5-decoded", "webdataset", "raw-read"}
    if decode_only:
        main_names = {"hdf5-encoded", "hdf5-encoded-pil-decode", "hdf5-encoded-kept"}
    entries = [{"loader": name, "workers": workers, "samples_per_s": rate} for (name, workers), rate in best.items()]
    return {
        "results": [entry for entry in entries if entry["loader"] in main_names],
        "images": images,
        "image_size": size,
        "batch_size": BATCH,
        "repeats": repeats,
        "ablations": [entry for entry in entries if entry["loader"] not in main_names],
        "load_average": os.getloadavg()[0],
        "cpus": os.cpu_count(),
        "decode_only": decode_only,
        "fast_decoder": fast_decoder_available(),
    }


def ratios(report: dict[str, Any]) -> dict[str, float]:
    at = {(r["loader"], r["workers"]): r["samples_per_s"] for r in report["results"] + report["ablations"]}
    decode = {f"encoded fast decode / PIL draft decode @{workers}": at["hdf5-encoded", workers]
              / at["hdf5-encoded-pil-decode", workers] for workers in (0, 2)
              if ("hdf5-encoded-pil-decode", workers) in at}
    decode |= {f"encoded kept (decode cache, warm) / fast decode @{workers}": at["hdf5-encoded-kept", workers]
               / at["hdf5-encoded", workers] for workers in (0, 2) if ("hdf5-encoded-kept", workers) in at}
    if report.get("decode_only"):
        return decode
    return decode | {
        "decoded/folder @2 (target >= 5)": at["hdf5-decoded", 2] / at["folder", 2],
        "encoded/folder @2 (target >= 1.2)": at["hdf5-encoded", 2] / at["folder", 2],
        "encoded/webdataset @2 (target >= 1.2)": at["hdf5-encoded", 2] / at["webdataset", 2],
        "decoded best / raw read (target >= 0.5)": max(at["hdf5-decoded", 0], at["hdf5-decoded", 2])
        / at["raw-read", 0],
    }


def table(report: dict[str, Any]) -> str:
    rows = [f"{'loader':<26}{'workers':>8}{'samples/s':>12}"]
    for entry in report["results"] + report["ablations"]:
        rows.append(f"{entry['loader']:<26}{entry['workers']:>8}{entry['samples_per_s']:>12.0f}")
    rows.append("")
    rows.extend(f"{name:<44}{value:>8.2f}" for name, value in ratios(report).items())
    rows.append(
        f"\n{report['images']} images, {report['image_size']}px, batch {report['batch_size']}, "
        f"fast decoder (simplejpeg) {'installed' if report['fast_decoder'] else 'missing: PIL everywhere'}, "
        f"load average {report['load_average']:.1f} on {report['cpus']} CPUs"
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small dataset, 3 rounds (under 3 minutes)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--decode-only", action="store_true", help="only the encoded HDF5 decoders (the ablation)")
    parser.add_argument("--images", type=int, default=None)
    parser.add_argument("--size", type=int, default=160, help="decoded image side S")
    parser.add_argument("--plot", type=Path, default=None, help="also write an SVG bar chart here")
    parser.add_argument("--workdir", type=Path, default=None, help="keep generated data here (reused if present)")
    args = parser.parse_args()
    images = args.images or (1000 if args.quick else 4000)
    if images < BATCH * 4 or args.size < 8:
        print(f"error: --images/--size: need at least {BATCH * 4} images and 8px", file=sys.stderr)
        return 2
    min_seconds, repeats = (1.0, 3) if args.quick else (3.0, 5)
    torch.set_num_threads(1)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        report = run(images, args.size, args.workdir, min_seconds, repeats, args.decode_only)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
            report = run(images, args.size, Path(tmp), min_seconds, repeats, args.decode_only)
    report["ratios"] = ratios(report)
    if args.plot:
        bars = [
            (f"{e['loader']} ({e['workers']}w)", e["samples_per_s"]) for e in report["results"] + report["ablations"]
        ]
        title = f"Loader throughput, {images} images at {args.size}px, batch {BATCH}"
        atomic_write_bytes(args.plot, bar_chart_svg(title, bars, "samples/s", log=True).encode())
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
