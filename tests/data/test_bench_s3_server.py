"""The benchmarks' S3 server (moto with ranges served from kept bytes) answers like moto: the right bytes for every
range, and the new bytes after an object is replaced, whether by a PUT or a multipart upload."""

from __future__ import annotations

import os

from benchmarks.netem import local_s3_behind_latency
from workloads.data.moving.s3 import make_client

BUCKET = "bench-server"


def _range(client, key: str, start: int, end: int) -> bytes:  # noqa: ANN001
    return client.get_object(Bucket=BUCKET, Key=key, Range=f"bytes={start}-{end}")["Body"].read()


def test_ranges_and_replaced_objects_serve_the_current_bytes(monkeypatch) -> None:  # noqa: ANN001
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    first, second = os.urandom(6 << 20), os.urandom(6 << 20)  # larger than moto's 5 MiB in-memory spool
    with local_s3_behind_latency(latency_ms=0) as s3:
        client = make_client(s3.direct_url, 4, botocore_attempts=3)
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key="k", Body=first)
        assert _range(client, "k", 0, 99) == first[:100]
        assert _range(client, "k", 5 << 20, (6 << 20) - 1) == first[5 << 20:]
        client.put_object(Bucket=BUCKET, Key="k", Body=second)  # replaces the bytes the server kept
        assert _range(client, "k", 100, 1 << 20) == second[100:(1 << 20) + 1]
        upload = client.create_multipart_upload(Bucket=BUCKET, Key="k")["UploadId"]
        parts = [client.upload_part(Bucket=BUCKET, Key="k", UploadId=upload, PartNumber=number, Body=body)["ETag"]
                 for number, body in ((1, first[: 5 << 20]), (2, first[5 << 20:]))]
        client.complete_multipart_upload(Bucket=BUCKET, Key="k", UploadId=upload, MultipartUpload={
            "Parts": [{"ETag": etag, "PartNumber": number} for number, etag in enumerate(parts, 1)]})
        assert _range(client, "k", (5 << 20) - 10, (5 << 20) + 9) == first[(5 << 20) - 10:(5 << 20) + 10]
        assert client.get_object(Bucket=BUCKET, Key="k")["Body"].read() == first
