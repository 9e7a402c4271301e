"""CPU time per sample of the packed reader (`HDF5Dataset.__getitems__`, one process, no DataLoader) over the
sampler's shuffled batches of 128: the decoded layout, the encoded layout (JPEG decode) and the encoded layout read
back from a warm decode cache (benchmarks/reader_cost.py). process_time measures the reader's own work, so on a
machine shared with other jobs it moves far less than samples/s do. `calls/sample` counts the Python function calls
of one pass under cProfile: it does not move with the machine's load at all, so it shows added per-sample work where
times are too noisy to. `scripts/bench_check.py` runs it for two checkouts (--code), alternating, each on its own
pack of the same generated images.

    python scripts/bench_reader_cpu.py --workdir DIR [--images N] [--size 160] [--repeat 3] [--calls-only]
                                       [--code CHECKOUT] [--serve]

DIR holds hdf5-decoded/ and hdf5-encoded/ as `scripts/bench_loader.py --workdir DIR` leaves them; with --images N
they are generated and packed there first when missing (N seeded JPEGs). Prints one JSON object. --code CHECKOUT
measures (and packs with) another checkout's data path under this harness; --serve measures once unreported,
prints `{"ready": true}`, then one report per `measure` line read from stdin, so a caller can alternate two
checkouts without paying for their imports each round.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parents[1]


def _harness(root: Path) -> ModuleType:
    """This checkout's benchmarks/reader_cost.py, importing the data path (`workloads`) from `root`."""
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("reader_cost_harness", HERE / "benchmarks" / "reader_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--images", type=int, default=0, help="generate and pack this many images when DIR has none")
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--calls-only", action="store_true", help="skip the CPU times (calls/sample only)")
    parser.add_argument("--code", type=Path, default=HERE, help="the checkout whose data path is measured")
    parser.add_argument("--serve", action="store_true", help="one report per `measure` line on stdin")
    args = parser.parse_args(argv)
    if not (args.code / "workloads" / "data" / "reading" / "dataset.py").is_file():
        print(f"error: --code: {args.code} is not a checkout of this project", file=sys.stderr)
        return 2
    if args.images and args.images < 128 or args.repeat < 1 or args.size < 8:
        print("error: --images/--repeat/--size: need images >= 128 (or 0), repeat >= 1, size >= 8", file=sys.stderr)
        return 2
    harness = _harness(args.code.resolve())
    import torch

    if args.images:
        harness.prepare(args.workdir, args.images, args.size)
    for layout in ("decoded", "encoded"):
        if not (args.workdir / f"hdf5-{layout}" / "manifest.json").is_file():
            print(f"error: --workdir: {args.workdir / f'hdf5-{layout}'} holds no packed dataset (give --images N, "
                  "or run scripts/bench_loader.py --workdir DIR first)", file=sys.stderr)
            return 2
    torch.set_num_threads(1)
    if not args.serve:
        print(json.dumps(harness.measure(args.workdir, args.size, args.repeat, calls_only=args.calls_only)))
        return 0
    harness.measure(args.workdir, args.size, 1)  # not reported: a process's first pass is slower than the rest
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip() == "measure":
            report = harness.measure(args.workdir, args.size, args.repeat, calls_only=args.calls_only)
            print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
