"""All-reduce bandwidth across a gang, in nccl-tests' terms, with a pass/fail floor: the acceptance check of a
cluster's interconnect (docs/operations.md, "Verify EFA").

    torchrun ... -m workloads.train.allreduce [--min-bytes 8Mi] [--max-bytes 2Gi] [--iters 20]
                 [--instance-type p5.48xlarge | --floor GBPS | --report-only]

Runs torch.distributed all_reduce (NCCL on GPUs, through aws-ofi-nccl and EFA where the pod has it; gloo on CPU)
over message sizes doubling from --min-bytes to --max-bytes, and prints nccl-tests' all_reduce_perf table: time per
call, algorithm bandwidth (bytes / time) and bus bandwidth (algbw x 2(n-1)/n, nccl-tests doc/PERFORMANCE.md), so
its numbers compare with the published nccl-tests figures that set the floors below. No MPI is needed: torchrun
starts one process per GPU, as the training Jobs do. Rank 0 exits 1 when the bus bandwidth at 2 GiB is below the
floor, or when there is no floor (a type without a published figure and no --floor): the Job fails, since the
check is the Job's success. --report-only prints the table and passes without a verdict.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from workloads.cli import ArgumentParser
from workloads.quantity import quantity_bytes
from workloads.torchenv import torchrun_env

# Bus bandwidth (GB/s) a 2-node all_reduce must reach at 2 GiB: 80% of what AWS published for nccl-tests
# all_reduce_perf on two nodes of the type (aws-samples/awsome-distributed-training@7217859f
# micro-benchmarks/nccl-tests/README.md:222, p5.48xlarge: 443.72 GB/s at 2147483648 B; :187,
# p4de.24xlarge: 78.33 GB/s). p4d has p4de's network (4 x 100 Gbps EFA). Every other type, p5e, p5en and p6
# included, has no published figure (that README and AWS's instance pages give link rates, not nccl-tests
# results): its check FAILs until --floor gives one from a measured run (docs/operations.md, "Verify EFA"), so a
# pool whose EFA silently fell back to TCP can never pass by default.
FLOOR_MESSAGE_BYTES = 2**31
FLOORS_GBPS = {"p5.48xlarge": 355.0, "p4de.24xlarge": 62.7, "p4d.24xlarge": 62.7}
_PUBLISHED = "aws-samples/awsome-distributed-training@7217859f micro-benchmarks/nccl-tests/README.md"
FLOOR_SOURCES = {
    "p5.48xlarge": f"80% of 443.72 GB/s, {_PUBLISHED}:222",
    "p4de.24xlarge": f"80% of 78.33 GB/s, {_PUBLISHED}:187",
    "p4d.24xlarge": "p4de.24xlarge's floor: the same 4 x 100 Gbps EFA network",
}


def floor_for(instance_type: str | None, floor_gbps: float | None) -> tuple[float | None, str]:
    """(floor, why): the floor a check is held to and where it comes from; None with the reason when there is none
    (the verdict is then FAIL: a check without a floor can never pass)."""
    if floor_gbps is not None:
        return floor_gbps, "--floor"
    if not instance_type:
        return None, "no floor: pass --instance-type (a type with a published floor) or --floor GBPS"
    if instance_type in FLOORS_GBPS:
        return FLOORS_GBPS[instance_type], FLOOR_SOURCES[instance_type]
    return None, (f"no published nccl-tests floor for {instance_type}: pass --floor GBPS from a measured 2-node run "
                  "(docs/operations.md, Verify EFA)")


_ROW = re.compile(r"^\s*(?:\S+:\s*|\[\S+\]<stdout>:\s*)?(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+"
                  r"([\d.]+)\s+([\d.]+)\s+(\S+)")


@dataclass(frozen=True)
class Row:
    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


def parse_rows(lines: Iterable[str]) -> list[Row]:
    """The out-of-place rows of an all_reduce_perf table (nccl-tests' or this module's; rank prefixes such as `0:`
    or `[1,0]<stdout>:` allowed), in order."""
    rows = []
    for line in lines:
        match = _ROW.match(line)
        if match and not line.lstrip().startswith("#"):
            rows.append(Row(int(match.group(1)), float(match.group(6)), float(match.group(7)),
                            float(match.group(8))))
    return rows


def verdict(rows: list[Row], floor_gbps: float | None, no_floor: str = "no floor given") -> tuple[bool, str]:
    """(passed, one line): the bus bandwidth at FLOOR_MESSAGE_BYTES against the floor. Without a floor the check
    fails, saying why (`no_floor`), with the largest message's bandwidth reported."""
    if not rows:
        return False, "no all_reduce rows in the output"
    at_floor = [row for row in rows if row.size_bytes == FLOOR_MESSAGE_BYTES]
    row = at_floor[0] if at_floor else max(rows, key=lambda r: r.size_bytes)
    said = f"bus bandwidth {row.busbw_gbps:.2f} GB/s at {row.size_bytes} B"
    if floor_gbps is None:
        return False, f"{said}; {no_floor}"
    if not at_floor:
        return False, f"{said}: the floor is set at {FLOOR_MESSAGE_BYTES} B; measure it (--max-bytes 2Gi)"
    return row.busbw_gbps >= floor_gbps, f"{said} against a floor of {floor_gbps:g} GB/s"


def bus_bandwidth(size_bytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, as nccl-tests computes them for all_reduce."""
    algbw = size_bytes / 1e9 / seconds
    return algbw, algbw * 2 * (ranks - 1) / ranks


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(description="all_reduce bus bandwidth across the gang (nccl-tests' terms)")
    parser.add_argument("--min-bytes", type=quantity_bytes, default=quantity_bytes("8Mi"))
    parser.add_argument("--max-bytes", type=quantity_bytes, default=FLOOR_MESSAGE_BYTES)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    floors = parser.add_mutually_exclusive_group()
    floors.add_argument("--instance-type", help="the nodes' type: its published floor (FLOORS_GBPS); a type without "
                        "one fails the check")
    floors.add_argument("--floor", type=float, metavar="GBPS", help="a floor of your own (from a measured run)")
    floors.add_argument("--report-only", action="store_true",
                        help="print the table and exit 0 with no verdict (not an acceptance check)")
    args = parser.parse_args(argv)
    floor, why = floor_for(args.instance_type, args.floor)
    if floor is not None and not floor > 0:
        print(f"error: --floor: {floor:g} is not a bandwidth (GB/s > 0)", file=sys.stderr)
        return 2
    if not 4 <= args.min_bytes <= args.max_bytes or args.iters < 1 or args.warmup < 0:
        print("error: arguments: need 4 <= --min-bytes <= --max-bytes, --iters >= 1, --warmup >= 0", file=sys.stderr)
        return 2
    return _run(args.min_bytes, args.max_bytes, args.iters, args.warmup, None if args.report_only else (floor, why))


def _run(min_bytes: int, max_bytes: int, iters: int, warmup: int, floor: tuple[float | None, str] | None) -> int:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, ranks = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torchrun_env().local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    lines = ["#       size         count      type   redop    root     time   algbw   busbw #wrong",
             "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"]
    size, rows = min_bytes // 4 * 4, []
    while size <= max_bytes:
        tensor = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize(device)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor)
        if cuda:
            torch.cuda.synchronize(device)
        seconds = (time.perf_counter() - started) / iters
        algbw, busbw = bus_bandwidth(size, seconds, ranks)
        rows.append(Row(size, seconds * 1e6, algbw, busbw))
        lines.append(f"{size:12d}  {size // 4:12d}     float     sum      -1  {seconds * 1e6:8.1f}  {algbw:6.2f}  "
                     f"{busbw:6.2f}      0")
        del tensor
        size *= 2
    dist.destroy_process_group()
    if rank != 0:
        return 0
    print("\n".join(lines))
    print(f"# Avg bus bandwidth    : {sum(row.busbw_gbps for row in rows) / len(rows):.4f}")
    if floor is None:
        print(f"# REPORT: {ranks} ranks (--report-only: no verdict)")
        return 0
    passed, said = verdict(rows, floor[0], floor[1])
    print(f"# {'PASS' if passed else 'FAIL'}: {ranks} ranks, {said}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
