"""What checking a decode-cache row costs, per way of checking it: one process reads the rows of a warm cache file
back into a batch, as a DataLoader worker does in the epochs the cache exists for.

Each option reads the same shuffled batches (runs of consecutive samples, as the sampler gives) of a file of
--rows rows of --size px into one reused uint8 batch, and reports microseconds per row and GB/s:

    no check         the rows as they are (the format before rows carried a checksum; not safe: the baseline)
    zlib run         zlib.crc32 of each row after one read per run of kept rows (the format with crc32 rows)
    zlib row         zlib.crc32 of each row right after reading it (the row still in the CPU cache)
    crc32c row       hardware crc32c (the `crc32c` package) of each row right after reading it
    google-crc32c    the same with the `google-crc32c` package
    crc32c block     one crc32c per block of 16 rows: a run shorter than a block reads (and checks) all of it
    mmap crc32c      the file mapped once; crc32c of the mapped row, then one copy into the batch
    bitmap           zlib.crc32 the first time a row is read in this process, never again (a change after that
                     first read is served: this one does not keep the guarantee)

    .venv/bin/python scripts/bench_decode_cache.py [--rows 2048] [--size 160] [--batch 128] [--repeat 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import mmap
import os
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workloads.data.reading.dataset import contiguous_runs  # noqa: E402

BLOCK = 16
Reader = Callable[[int, int, np.ndarray], None]  # (fd, first row, out rows)


def _readers(path: Path, rows: int, row_bytes: int) -> dict[str, Reader]:
    """The read-and-check functions, each over the same file of rows (checksums made up front, per row and block)."""
    fd = os.open(path, os.O_RDONLY)
    data = np.fromfile(path, dtype=np.uint8).reshape(rows, row_bytes)
    zsums = [zlib.crc32(row) for row in data]
    readers: dict[str, Reader] = {}

    def check(ok: bool) -> None:
        if not ok:
            raise RuntimeError("checksum mismatch")

    def none(_fd: int, first: int, out: np.ndarray) -> None:
        os.preadv(fd, [out.data.cast("B")], first * row_bytes)

    def zlib_run(_fd: int, first: int, out: np.ndarray) -> None:
        os.preadv(fd, [out.data.cast("B")], first * row_bytes)
        for k in range(len(out)):
            check(zlib.crc32(out[k]) == zsums[first + k])

    def zlib_row(_fd: int, first: int, out: np.ndarray) -> None:
        for k in range(len(out)):
            view = out[k].data.cast("B")
            os.preadv(fd, [view], (first + k) * row_bytes)
            check(zlib.crc32(view) == zsums[first + k])

    readers.update({"no check": none, "zlib run": zlib_run, "zlib row": zlib_row})
    if importlib.util.find_spec("crc32c"):
        import crc32c

        csums = [crc32c.crc32c(row) for row in data]
        bsums = [crc32c.crc32c(data[b:b + BLOCK]) for b in range(0, rows, BLOCK)]
        mapped = mmap.mmap(fd, rows * row_bytes, prot=mmap.PROT_READ)
        rows_view = np.frombuffer(mapped, dtype=np.uint8).reshape(rows, row_bytes)
        block_buf = np.empty((BLOCK, row_bytes), dtype=np.uint8)

        def crc32c_row(_fd: int, first: int, out: np.ndarray) -> None:
            for k in range(len(out)):
                view = out[k].data.cast("B")
                os.preadv(fd, [view], (first + k) * row_bytes)
                check(crc32c.crc32c(view) == csums[first + k])

        def crc32c_block(_fd: int, first: int, out: np.ndarray) -> None:
            flat = out.reshape(len(out), row_bytes)
            for block in range(first // BLOCK, (first + len(out) - 1) // BLOCK + 1):
                start = block * BLOCK
                count = min(BLOCK, rows - start)
                os.preadv(fd, [block_buf[:count].data.cast("B")], start * row_bytes)
                check(crc32c.crc32c(block_buf[:count]) == bsums[block])
                lo, hi = max(start, first), min(start + count, first + len(out))
                flat[lo - first:hi - first] = block_buf[lo - start:hi - start]

        def mmap_crc32c(_fd: int, first: int, out: np.ndarray) -> None:
            flat = out.reshape(len(out), row_bytes)
            for k in range(len(out)):
                check(crc32c.crc32c(rows_view[first + k]) == csums[first + k])
                flat[k] = rows_view[first + k]

        readers.update({"crc32c row": crc32c_row, "crc32c block": crc32c_block, "mmap crc32c": mmap_crc32c})
    if importlib.util.find_spec("google_crc32c"):
        import google_crc32c

        gsums = [google_crc32c.value(row.tobytes()) for row in data]

        def google_row(_fd: int, first: int, out: np.ndarray) -> None:
            for k in range(len(out)):
                view = out[k].data.cast("B")
                os.preadv(fd, [view], (first + k) * row_bytes)
                check(google_crc32c.value(bytes(view)) == gsums[first + k])  # takes bytes only: a copy

        readers["google-crc32c"] = google_row
    verified = np.zeros(rows, dtype=bool)

    def bitmap(_fd: int, first: int, out: np.ndarray) -> None:
        os.preadv(fd, [out.data.cast("B")], first * row_bytes)
        for k in np.flatnonzero(~verified[first:first + len(out)]):
            check(zlib.crc32(out[k]) == zsums[first + k])
            verified[first + k] = True

    readers["bitmap"] = bitmap
    return readers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--size", type=int, default=160)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5, help="epochs per option (interleaved); the best counts")
    args = parser.parse_args(argv)
    if args.rows < args.batch or args.size < 1 or args.repeat < 1:
        print("error: --rows/--size/--repeat: need rows >= batch, size >= 1, repeat >= 1", file=sys.stderr)
        return 2
    row_bytes = args.size * args.size * 3
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="bench-decode-cache-") as tmp:
        path = Path(tmp) / "rows"
        rng.integers(0, 256, (args.rows, row_bytes), dtype=np.uint8).tofile(path)
        readers = _readers(path, args.rows, row_bytes)
        out = np.empty((args.batch, args.size, args.size, 3), dtype=np.uint8)
        order = rng.permutation(args.rows)
        batches = [order[b:b + args.batch].tolist() for b in range(0, args.rows, args.batch)]
        print(f"{'option':<16}{'us/row':>9}{'GB/s':>7}   ({args.rows} rows of {args.size} px, batches of "
              f"{args.batch}, best of {args.repeat}; load {os.getloadavg()[0]:.2f})")
        best = dict.fromkeys(readers, float("inf"))
        for _ in range(args.repeat):  # options interleaved: a load change hits all of them alike
            for name, read in readers.items():
                started = time.perf_counter()
                for batch in batches:
                    for position, first, length in contiguous_runs(batch):
                        read(0, first, out[position:position + length])
                best[name] = min(best[name], time.perf_counter() - started)
        for name, seconds in best.items():
            print(f"{name:<16}{seconds / args.rows * 1e6:>9.1f}{args.rows * row_bytes / seconds / 1e9:>7.2f}")
        print(f"load average at the end {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
