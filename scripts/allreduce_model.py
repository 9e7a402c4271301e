"""When does the network, not the data, starve the GPU? The all-reduce time per step of the bundled models' gradients
over EFA and over TCP, for a gang of N nodes x G GPUs, and the per-GPU step rate at which it equals the compute.

    python scripts/allreduce_model.py [--nodes 2] [--gpus 8] [--batch 256] [--model NAME=PARAMS ...] [--json]

Gradient bytes: the models' real parameter counts (workloads.train.models), 4 bytes each (DDP reduces fp32
gradients, also under bf16 autocast). Time of a ring all-reduce of S bytes: S x 2(n-1)/n / busbw (nccl-tests'
bus-bandwidth definition). EFA busbw: AWS's published nccl-tests all_reduce_perf rows for 2 x p5.48xlarge and
2 x p4de.24xlarge (tests/jobs/data, awsome-distributed-training README) at the nearest measured message size.
TCP: NCCL's socket transport over the primary interface alone, at that interface's line rate, 100 Gbps on both types
(a best case: sockets reach less). The break-even rate is the per-GPU samples/s at which a step's compute takes as
long as its all-reduce: below it the network hides behind backward (DDP overlaps them), above it the GPU waits.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.cli import ArgumentParser  # noqa: E402
from workloads.train.allreduce import parse_rows  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "tests" / "jobs" / "data"
PUBLISHED = {"p5.48xlarge": "nccl-tests-2x-p5.48xlarge.txt", "p4de.24xlarge": "nccl-tests-2x-p4de.24xlarge.txt"}
PRIMARY_INTERFACE_GBPS = 100.0  # network card 0 of p5.48xlarge and p4de.24xlarge (EC2 User Guide, network cards)


def efa_busbw(instance_type: str, size_bytes: int) -> float:
    rows = parse_rows((DATA / PUBLISHED[instance_type]).read_text().splitlines())
    nearest = min(rows, key=lambda row: abs(row.size_bytes - size_bytes))
    return nearest.busbw_gbps


def allreduce_seconds(size_bytes: int, ranks: int, busbw_gbps: float) -> float:
    return size_bytes * 2 * (ranks - 1) / ranks / (busbw_gbps * 1e9)


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="all-reduce time per step: EFA against TCP")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--batch", type=int, default=256, help="samples per GPU per step")
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PARAMS",
                        help="another model by its parameter count, e.g. llm-1.3b=1.3e9")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from workloads.train.models import MODELS

    models = {name: sum(p.numel() for p in build(1000, 64).parameters()) for name, build in MODELS.items()}
    for item in args.model:
        name, _, count = item.partition("=")
        try:
            models[name] = int(float(count))
        except ValueError:
            print(f"error: --model: {item!r} is not NAME=PARAMS", file=sys.stderr)
            return 2
    ranks = args.nodes * args.gpus
    rows = []
    for name, params in models.items():
        size = params * 4
        for instance_type in PUBLISHED:
            efa = allreduce_seconds(size, ranks, efa_busbw(instance_type, size))
            tcp = allreduce_seconds(size, ranks, PRIMARY_INTERFACE_GBPS / 8)
            rows.append({"model": name, "params": params, "gradient_mb": round(size / 1e6, 1),
                         "instance_type": instance_type, "ranks": ranks,
                         "efa_ms": round(efa * 1e3, 2), "tcp_ms": round(tcp * 1e3, 2),
                         "break_even_efa": round(args.batch / efa), "break_even_tcp": round(args.batch / tcp)})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{args.nodes} nodes x {args.gpus} GPUs, {args.batch} samples per GPU per step")
    print(f"{'model':9} {'grad MB':>8} {'type':14} {'EFA ms':>7} {'TCP ms':>7} {'break-even samples/s/GPU':>26}")
    for row in rows:
        print(f"{row['model']:9} {row['gradient_mb']:8.1f} {row['instance_type']:14} {row['efa_ms']:7.2f} "
              f"{row['tcp_ms']:7.2f} {row['break_even_efa']:>12} EFA {row['break_even_tcp']:>7} TCP")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
