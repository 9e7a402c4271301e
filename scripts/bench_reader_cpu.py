"""CPU time per sample of the packed reader (`HDF5Dataset.__getitems__`, one process, no DataLoader) over the
sampler's shuffled batches of 128: the decoded layout, the encoded layout (JPEG decode) and the encoded layout read
back from a warm decode cache. process_time measures the reader's own work, so on a machine shared with other jobs
it moves far less than samples/s do; run it from two checkouts in turn (PYTHONPATH) to compare a data-path change.
`calls/sample` counts the Python function calls of one pass under cProfile: it does not move with the machine's load
at all, so it shows added per-sample work where times are too noisy to.

    python scripts/bench_reader_cpu.py --workdir DIR [--size 160] [--repeat 3]

DIR holds hdf5-decoded/ and hdf5-encoded/ as `scripts/bench_loader.py --workdir DIR` leaves them.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from workloads.data.reading.dataset import HDF5Dataset  # noqa: E402
from workloads.data.reading.sampler import ElasticBatchSampler  # noqa: E402


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for layout in ("decoded", "encoded"):
        if not (args.workdir / f"hdf5-{layout}" / "manifest.json").is_file():
            print(f"error: --workdir: {args.workdir / f'hdf5-{layout}'} holds no packed dataset (run "
                  "scripts/bench_loader.py --workdir DIR first)", file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    rows = Path(tempfile.mkdtemp(prefix="bench-reader-rows-"))
    cases = [("decoded", "decoded", {}, 8), ("encoded", "encoded", {"image_size": args.size}, 2),
             ("encoded-kept", "encoded", {"image_size": args.size, "decode_cache": rows,
                                          "decode_cache_bytes": 1 << 30}, 8)]
    report = {}
    try:
        for name, layout, options, count in cases:
            dataset = HDF5Dataset(args.workdir / f"hdf5-{layout}", **options)
            batches = list(ElasticBatchSampler(dataset.shard_sizes, 128, seed=0))[:count]
            report[f"{name} us/sample"] = per_sample_us(dataset, batches, args.repeat)
            report[f"{name} calls/sample"] = per_sample_calls(dataset, batches)
            dataset.close()
    finally:
        shutil.rmtree(rows, ignore_errors=True)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
