"""moto's S3 server as the benchmarks run it, with ranged GETs that cost what the range costs.

moto keeps each object in a SpooledTemporaryFile and answers a ranged GET by reading the whole object under a
per-object lock, then slicing (moto/s3/models.py FakeKey.value, moto/s3/responses.py _handle_range_header at
moto 5.2.5). So on the stock server a ranged GET of 1 MiB from a 32 MiB object costs a 32 MiB read, and the parts
of one object are served one at a time: small parts lose for the server's sake, not the network's. S3 serves a
range in the time of the range. Here an object's bytes are read once and kept (immutable bytes; a PUT replaces
them), so a range costs its own slice and parts of one object are served in parallel.

    python -m benchmarks.s3_server -H 127.0.0.1 -p PORT     (moto.server's own arguments)
"""

from __future__ import annotations

from typing import Any

from moto.s3.models import FakeKey
from moto.server import main as moto_main

_stock_value = FakeKey.value


def _kept_value(key: Any) -> bytes:
    kept = key.__dict__.get("_bench_value")
    if kept is None:
        kept = _stock_value.fget(key)
        key.__dict__["_bench_value"] = kept
    return kept


def _replace_value(key: Any, new_value: bytes) -> None:
    key.__dict__.pop("_bench_value", None)
    _stock_value.fset(key, new_value)


FakeKey.value = property(_kept_value, _replace_value)  # type: ignore[method-assign,assignment]

if __name__ == "__main__":
    moto_main()
