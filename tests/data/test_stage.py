"""pack -> upload -> stage against moto in server mode, with and without a fault-injecting proxy."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from benchmarks.netem import FaultProxy
from tests.awsstub import without_aws_credentials
from tests.data.helpers import shard_files, stage_options, uploaded
from workloads.data.__main__ import main
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import MANIFEST_NAME, load_manifest
from workloads.data.format.verify import sha256_file
from workloads.data.moving.metrics import StageMetrics
from workloads.data.moving.s3 import RetryPolicy, S3Uri, make_client
from workloads.data.moving.stage import stage
from workloads.data.moving.upload import UploadOptions, upload


def test_round_trip_is_byte_identical_and_idempotent(packed: Path, s3_url: str, bucket: str,
                                                     tmp_path: Path) -> None:
    client = make_client(s3_url, 4, botocore_attempts=3)
    target = S3Uri(bucket, "sets/tiny")
    first = upload(client, packed, target, UploadOptions(workers=4, part_bytes=5 << 20, progress=False))
    manifest = load_manifest(packed)
    assert first.uploaded[-1] == MANIFEST_NAME and len(first.uploaded) == len(manifest.shards) + 1
    again = upload(client, packed, target, UploadOptions(workers=4, progress=False))
    assert again.uploaded == [] and len(again.skipped) == len(manifest.shards) + 1

    dest = tmp_path / "dest"
    metrics = StageMetrics()
    result = stage(make_client(s3_url, 4), target, dest, stage_options(metrics=metrics))
    assert sorted(result.fetched) == [s.path for s in manifest.shards]
    shard_bytes = sum(s.bytes for s in manifest.shards)
    assert _sample(metrics, "ml_stage_bytes_total") == shard_bytes == _sample(metrics, "ml_stage_dataset_bytes")
    assert _sample(metrics, "ml_stage_shards_ready") == len(manifest.shards) == _sample(metrics, "ml_stage_shards")
    assert _sample(metrics, "ml_stage_shards_staged_total") == len(manifest.shards)
    assert _sample(metrics, "ml_stage_window_used_bytes") == shard_bytes  # copy mode: the whole dataset
    assert _sample(metrics, "ml_stage_done") == 1 and _sample(metrics, "ml_stage_retries_total") == 0
    assert shard_files(dest) == shard_files(packed)
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]

    rerun = stage(make_client(s3_url, 4), target, dest, stage_options())
    assert rerun.fetched == [] and len(rerun.kept) == len(manifest.shards)


def test_resume_refetches_only_missing_or_damaged_shards(packed: Path, s3_url: str, bucket: str,
                                                          tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    dest = tmp_path / "dest"
    stage(make_client(s3_url, 4), target, dest, stage_options())
    names = sorted(shard_files(dest))
    (dest / names[0]).unlink()
    damaged = dest / names[1]
    damaged.write_bytes(damaged.read_bytes()[:-10] + b"0123456789")
    stale = dest / f".{names[2]}.999.1.part"
    stale.write_bytes(b"partial")
    result = stage(make_client(s3_url, 4), target, dest, stage_options())
    assert sorted(result.fetched) == names[:2]
    assert not stale.exists()
    assert shard_files(dest) == shard_files(packed)


def test_faults_never_expose_a_partial_file(packed: Path, s3_url: str, bucket: str, moto_port: int,
                                            tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    manifest = load_manifest(packed)
    expected = {s.path: s.sha256 for s in manifest.shards}
    dest = tmp_path / "dest"
    dest.mkdir()
    seen_bad: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # every file that carries a shard's name must already be the verified shard
        while not stop.is_set():
            for path in dest.glob("shard-*.h5"):
                if sha256_file(path) != expected[path.name]:
                    seen_bad.append(path.name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # About a third of GETs fail; 10 attempts per part make giving up a one-in-100,000 event.
        metrics = StageMetrics()
        with FaultProxy(moto_port, slowdown_every=5, drop_every=7) as proxy:
            result = stage(make_client(proxy.url, 4), target, dest,
                           stage_options(part_bytes=8192, retry=RetryPolicy(10, 0.01, 0.05), metrics=metrics))
            counts = proxy.counts
    finally:
        stop.set()
        watcher.join()
    assert counts.slowdowns and counts.drops
    assert _sample(metrics, "ml_stage_retries_total") == counts.slowdowns + counts.drops  # every fault retried once
    assert seen_bad == []
    assert sorted(result.fetched) == sorted(expected)
    assert shard_files(dest) == shard_files(packed)
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]


def test_persistent_throttling_fails_clearly_and_leaves_nothing(packed: Path, s3_url: str, bucket: str,
                                                                moto_port: int, tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    dest = tmp_path / "dest"
    with FaultProxy(moto_port, slowdown_every=1, skip_first=1) as proxy, pytest.raises(DataToolError) as failure:
        stage(make_client(proxy.url, 4), target, dest, stage_options(retry=RetryPolicy(3, 0.01, 0.02)))
    assert proxy.counts.slowdowns >= 3
    assert "shard-0000" in failure.value.where and failure.value.why == "gave up after 3 attempts: SlowDown"
    assert list(dest.iterdir()) == []  # no shard, no temporary, no manifest


def test_corruption_on_every_fetch_is_fatal_after_retries(packed: Path, s3_url: str, bucket: str,
                                                          moto_port: int, tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    dest = tmp_path / "dest"
    with FaultProxy(moto_port, corrupt_every=1, skip_first=1) as proxy, \
            pytest.raises(DataToolError, match="shard-0000.*sha256 does not match the manifest after 3 downloads"):
        stage(make_client(proxy.url, 4), target, dest, stage_options())
    assert proxy.counts.corruptions >= 3
    assert [p.name for p in dest.iterdir()] == []


def test_corrupted_body_is_refetched(packed: Path, s3_url: str, bucket: str, moto_port: int,
                                     tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    dest = tmp_path / "dest"
    metrics = StageMetrics()
    with FaultProxy(moto_port, corrupt_every=2, skip_first=1, max_faults=2) as proxy:
        result = stage(make_client(proxy.url, 4), target, dest, stage_options(part_bytes=8192, metrics=metrics))
    assert proxy.counts.corruptions == 2
    # two corrupted parts cost one re-download when they fall in the same shard
    assert _sample(metrics, "ml_stage_checksum_mismatches_total") in (1, 2)
    assert sorted(result.fetched) == sorted(shard_files(packed))
    assert shard_files(dest) == shard_files(packed)


def test_cli_reports_missing_bucket_and_manifest(s3_url: str, bucket: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture, packed: Path) -> None:
    assert main(["stage", "s3://no-such-bucket-here/x", str(tmp_path / "d"), "--endpoint-url", s3_url,
                 "--attempts", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == "error: s3://no-such-bucket-here/x/manifest.json: bucket does not exist\n"
    assert main(["upload", str(packed), "s3://no-such-bucket-here/x", "--endpoint-url", s3_url,
                 "--no-progress"]) == 2
    assert capsys.readouterr().err == "error: s3://no-such-bucket-here/x: bucket does not exist\n"
    assert main(["stage", f"s3://{bucket}/empty", str(tmp_path / "d"), "--endpoint-url", s3_url,
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: s3://{bucket}/empty/manifest.json: not found") and err.count("\n") == 1


def test_cli_reports_missing_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, moto_port: int,
                                         capsys: pytest.CaptureFixture) -> None:
    without_aws_credentials(monkeypatch, tmp_path)
    assert main(["stage", "s3://bucket-x/p", str(tmp_path / "d"), "--endpoint-url",
                 f"http://127.0.0.1:{moto_port}", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: s3://bucket-x/p/manifest.json: no AWS credentials found") and err.count("\n") == 1


def test_cli_round_trip(packed: Path, s3_url: str, bucket: str, tmp_path: Path,
                        capsys: pytest.CaptureFixture) -> None:
    uri = f"s3://{bucket}/cli"
    assert main(["upload", str(packed), uri, "--endpoint-url", s3_url, "--no-progress"]) == 0
    assert main(["stage", uri, str(tmp_path / "d"), "--endpoint-url", s3_url, "--no-progress"]) == 0
    assert main(["verify", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / MANIFEST_NAME).read_bytes() == (packed / MANIFEST_NAME).read_bytes()


def test_cli_reports_rejected_credentials(monkeypatch: pytest.MonkeyPatch, packed: Path, s3_url: str, bucket: str,
                                          tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # the in-process server now checks keys
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "UNKNOWNTESTKEY000000")
    assert main(["upload", str(packed), f"s3://{bucket}/x", "--endpoint-url", s3_url, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: s3://{bucket}/x: access denied (HTTP 403: credentials rejected or lacking permission)\n"
    assert main(["stage", f"s3://{bucket}/x", str(tmp_path / "d"), "--endpoint-url", s3_url, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: s3://{bucket}/x/manifest.json: credentials rejected (InvalidAccessKeyId)\n"


def test_short_writes_are_completed_not_left_as_holes(packed: Path, s3_url: str, bucket: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """pwrite may write less than asked (a file system close to full does): the rest must still be written."""
    target = S3Uri(bucket, "sets/short")
    upload(make_client(s3_url, 4), packed, target, UploadOptions(workers=2, progress=False))
    real_pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: real_pwrite(fd, bytes(data[:1000]), offset))
    dest = tmp_path / "dest"
    stage(make_client(s3_url, 4), target, dest, stage_options())
    assert shard_files(dest) == shard_files(packed)


def _sample(metrics: StageMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)
