"""Client CPU per ranged GET: boto3's get_object against a raw http.client GET of a presigned URL.

The stager's small parts (a small cache budget) cost one request each; this shows what a request costs the client,
against the benchmarks' S3 server (benchmarks/s3_server.py) directly, one thread, no latency proxy.

    python scripts/bench_request_cost.py [--requests 300]
"""

from __future__ import annotations

import argparse
import http.client
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.netem import local_s3_behind_latency  # noqa: E402
from workloads.data.moving.s3 import make_client  # noqa: E402

BUCKET = "request-cost"


def _per_request(action, requests: int) -> tuple[float, float]:  # noqa: ANN001
    """(client CPU ms, wall ms) per request."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(requests):
        action()
    return (1000 * (time.process_time() - cpu) / requests, 1000 * (time.perf_counter() - wall) / requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    with local_s3_behind_latency(0) as s3:
        client = make_client(s3.direct_url, 4, botocore_attempts=3)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="k", Body=os.urandom(4 << 20))
        target = client.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": "k"}, ExpiresIn=3600)
        target = target.split(s3.direct_url, 1)[1]
        connection = http.client.HTTPConnection("127.0.0.1", int(s3.direct_url.rsplit(":", 1)[1]), timeout=30)

        def boto3_get(size: int) -> None:
            body = client.get_object(Bucket=BUCKET, Key="k", Range=f"bytes=0-{size - 1}")["Body"]
            for _ in body.iter_chunks(1 << 20):
                pass

        def raw_get(size: int) -> None:
            connection.request("GET", target, headers={"Range": f"bytes=0-{size - 1}"})
            response = connection.getresponse()
            while response.read(1 << 20):
                pass

        print(f"{'range':<8}{'client':<10}{'CPU ms/req':>12}{'wall ms/req':>13}")
        for label, size in (("1 KiB", 1 << 10), ("2 MiB", 2 << 20)):
            for method, get in (("boto3", boto3_get), ("raw", raw_get)):
                get(size)  # warm: connection, service model
                cpu, wall = _per_request(lambda get=get, size=size: get(size), args.requests)
                print(f"{label:<8}{method:<10}{cpu:>12.2f}{wall:>13.2f}")
        connection.close()
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
