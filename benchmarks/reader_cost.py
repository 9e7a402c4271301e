"""What the packed reader costs per sample, measured in one process (no DataLoader, no S3): CPU microseconds
(`time.process_time`, best of a few passes) and Python function calls (cProfile, one pass). Calls do not move with
the machine's load at all, CPU time far less than wall time does, so both hold on a shared machine where samples/s
swing. scripts/bench_reader_cpu.py prints them; scripts/bench_check.py compares them between two checkouts; the fast
suite holds the small form (`small_form_calls`) to a recorded figure.

Readers (`HDF5Dataset.__getitems__` over the sampler's shuffled batches of 128): `decoded` (uint8 rows),
`encoded` (JPEG decode every read) and `encoded-kept` (the encoded layout read back from a warm decode cache).
"""

from __future__ import annotations

import cProfile
import pstats
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from workloads.data.reading.dataset import HDF5Dataset
from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.data.writing.pack import PackOptions, pack

BATCH = 128
READERS = ("decoded", "encoded", "encoded-kept")
SMALL_IMAGES, SMALL_SIZE = 256, 32  # the fast suite's form: a few hundred tiny images


def per_sample_us(dataset: HDF5Dataset, batches: list[list[int]], repeat: int) -> float:
    """Best of `repeat` passes over `batches` (after one warm pass), CPU microseconds per sample."""
    for batch in batches:
        dataset.__getitems__(batch)
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for batch in batches:
            dataset.__getitems__(batch)
        best = min(best, (time.process_time() - started) / sum(len(b) for b in batches) * 1e6)
    return round(best, 1)


def per_sample_calls(dataset: HDF5Dataset, batches: list[list[int]]) -> float:
    """Python function calls per sample of one pass over `batches` (after a warm pass), counted by cProfile."""
    for batch in batches:
        dataset.__getitems__(batch)
    profile = cProfile.Profile()
    profile.enable()
    for batch in batches:
        dataset.__getitems__(batch)
    profile.disable()
    return round(pstats.Stats(profile).total_calls / sum(len(b) for b in batches), 2)  # type: ignore[attr-defined]


def make_images(folder: Path, count: int, size: int) -> None:
    """`count` seeded JPEGs in 8 class folders, each about 1.5x `size` on a side (so the draft decode scales)."""
    from PIL import Image

    side = size * 3 // 2
    y, x = np.mgrid[0:side, 0:side + size // 4]
    for index in range(count):
        rng = np.random.default_rng(index)
        phase = rng.uniform(0, 6.3, 3)
        base = np.stack([127 + 100 * np.sin(x / (5 + 3 * c) + y / (7 + 2 * c) + phase[c]) for c in range(3)], -1)
        pixels = np.clip(base + rng.normal(0, 18, base.shape), 0, 255).astype(np.uint8)
        directory = folder / f"class{index % 8:02d}"
        directory.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(directory / f"img{index:06d}.jpg", format="JPEG", quality=90)


def prepare(workdir: Path, images: int, size: int, workers: int = 2) -> None:
    """hdf5-decoded/ and hdf5-encoded/ under `workdir` (each in four shards), packed from generated JPEGs unless
    they are there already."""
    folder = workdir / "jpegs"
    for layout in ("decoded", "encoded"):
        out = workdir / f"hdf5-{layout}"
        if (out / "manifest.json").is_file():
            continue
        if not folder.is_dir():
            make_images(folder, images, size)
        shard_bytes = max(1 << 16, images * size * size * 3 // 4) if layout == "decoded" else max(
            1 << 14, sum(path.stat().st_size for path in folder.rglob("*.jpg")) // 4)
        pack(folder, out, PackOptions(layout=layout, image_size=size, shard_bytes=shard_bytes, workers=workers,
                                      progress=False, force=True))


def measure(workdir: Path, size: int, repeat: int, *, calls_only: bool = False,
            batches: dict[str, int] | None = None) -> dict[str, float]:
    """`<reader> us/sample` (unless calls_only) and `<reader> calls/sample` for every reader. `batches` caps the
    batches read per reader (default decoded 8, encoded 2, encoded-kept 8)."""
    counts = {"decoded": 8, "encoded": 2, "encoded-kept": 8, **(batches or {})}
    rows = Path(tempfile.mkdtemp(prefix="reader-cost-rows-"))
    options: dict[str, tuple[str, dict[str, Any]]] = {
        "decoded": ("decoded", {}),
        "encoded": ("encoded", {"image_size": size}),
        "encoded-kept": ("encoded", {"image_size": size, "decode_cache": rows, "decode_cache_bytes": 1 << 30}),
    }
    report: dict[str, float] = {}
    try:
        for name in READERS:
            layout, kwargs = options[name]
            dataset = HDF5Dataset(workdir / f"hdf5-{layout}", **kwargs)
            try:
                sampled = list(ElasticBatchSampler(dataset.shard_sizes, BATCH, seed=0))[:counts[name]]
                if not calls_only:
                    report[f"{name} us/sample"] = per_sample_us(dataset, sampled, repeat)
                report[f"{name} calls/sample"] = per_sample_calls(dataset, sampled)
            finally:
                dataset.close()
    finally:
        shutil.rmtree(rows, ignore_errors=True)
    return report


def small_form_calls(workdir: Path) -> dict[str, float]:
    """Calls per sample of every reader on SMALL_IMAGES generated images of SMALL_SIZE px (the fast suite's form;
    benchmarks/baselines.json records its figures)."""
    prepare(workdir, SMALL_IMAGES, SMALL_SIZE, workers=1)
    report = measure(workdir, SMALL_SIZE, 1, calls_only=True)
    return {name.removesuffix(" calls/sample"): value for name, value in report.items()}
