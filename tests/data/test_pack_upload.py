"""pack --upload: each shard goes to s3://bucket/prefix as it closes; the remote manifest is published last.

Real packs, a real moto server over HTTP, faults injected through botocore's event hooks in the upload client, and
a real SIGKILLed subprocess behind a latency proxy.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from benchmarks.netem import LatencyProxy
from tests.data.helpers import write_corpus
from tests.moto_server import free_port
from workloads.data.__main__ import main
from workloads.data.format.manifest import MANIFEST_NAME, load_manifest
from workloads.data.format.verify import verify
from workloads.data.moving import s3 as s3_module
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.stage import StageOptions, stage

REPO = Path(__file__).resolve().parents[2]
COMMON = ["--size", "16", "--workers", "1", "--no-progress"]
BOUND = 3  # the shard being written + 2 uploads in flight


def cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main([str(arg) for arg in argv])
    except SystemExit as exc:  # argparse refusing a flag
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


def remote(s3_url: str, bucket: str, prefix: str) -> dict[str, tuple[bytes, dict[str, str]]]:
    """{name under the prefix: (object bytes, user metadata)}."""
    client = make_client(s3_url, 4)
    objects = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            got = client.get_object(Bucket=bucket, Key=item["Key"])
            objects[item["Key"][len(prefix) + 1:]] = (got["Body"].read(), got.get("Metadata", {}))
    return objects


def shard_files(out: Path) -> list[str]:
    """Every shard file pack holds in OUT: final names and hidden temporaries."""
    try:
        return [name for name in os.listdir(out) if name.startswith(("shard-", ".shard-"))]
    except FileNotFoundError:
        return []


def stage_and_verify(s3_url: str, bucket: str, prefix: str, dest: Path) -> int:
    stage(make_client(s3_url, 4), S3Uri(bucket, prefix), dest, StageOptions(progress=False))
    return verify(dest).num_samples


def hook_puts(monkeypatch: pytest.MonkeyPatch, hook: Callable[[dict[str, Any]], None]) -> None:
    """Run `hook(params)` in the uploading thread before every PutObject of a client the CLI makes."""
    real = s3_module.make_client

    def patched(*args: Any, **kwargs: Any) -> Any:
        client = real(*args, **kwargs)
        client.meta.events.register("before-parameter-build.s3.PutObject",
                                    lambda params, **_: hook(params))
        return client

    monkeypatch.setattr(s3_module, "make_client", patched)


def test_objects_equal_pack_then_upload_and_the_prefix_stages(tmp_path: Path, s3_url: str, bucket: str,
                                                              capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=12)
    options = [*COMMON, "--shard-size", "4KiB", "--workers", "2"]
    assert cli(["pack", tmp_path / "src", tmp_path / "plain", *options], capsys)[0] == 0
    assert cli(["upload", tmp_path / "plain", f"s3://{bucket}/plain", "--endpoint-url", s3_url, "--no-progress"],
               capsys)[0] == 0
    code, out, err = cli(["pack", tmp_path / "src", tmp_path / "streamed", *options,
                          "--upload", f"s3://{bucket}/streamed", "--endpoint-url", s3_url], capsys)
    assert code == 0, err

    plain, streamed = remote(s3_url, bucket, "plain"), remote(s3_url, bucket, "streamed")
    assert len(plain) > 4 and streamed == plain  # names, bytes and sha256 metadata, manifest included
    manifest = load_manifest(tmp_path / "plain")
    total = sum(s.bytes for s in manifest.shards)
    summary = out.strip().splitlines()[-1]
    assert f"uploaded {total + len(plain[MANIFEST_NAME][0])} bytes" in summary
    peak = int(re.search(r"peak local shard bytes (\d+)", summary).group(1))  # type: ignore[union-attr]
    assert 0 < peak <= BOUND * max(s.bytes for s in manifest.shards) and peak < total
    # OUT keeps the record: the same manifest and report as the plain pack, and no shard.
    assert sorted(os.listdir(tmp_path / "streamed")) == [MANIFEST_NAME, "pack-report.json"]
    for name in (MANIFEST_NAME, "pack-report.json"):
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    assert stage_and_verify(s3_url, bucket, "streamed", tmp_path / "staged") == 24

    # The same pack again: every shard is already there under its name; only the manifest is sent.
    code, out, err = cli(["pack", tmp_path / "src", tmp_path / "streamed", *options, "--force",
                          "--upload", f"s3://{bucket}/streamed", "--endpoint-url", s3_url], capsys)
    assert code == 0, err
    assert f"uploaded {len(plain[MANIFEST_NAME][0])} bytes (1 objects, {len(plain) - 1} already present)" in out
    assert remote(s3_url, bucket, "streamed") == plain


def test_local_disk_holds_a_bounded_number_of_shards(tmp_path: Path, s3_url: str, bucket: str,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=15)  # 16 px decoded is 768 bytes: one sample per 1 KiB shard
    out = tmp_path / "out"
    seen: list[int] = []
    overlapped = threading.Event()
    first = threading.Lock()

    def slow_put(params: dict[str, Any]) -> None:  # runs in an upload thread while its shard file exists
        seen.append(len(shard_files(out)))
        if params["Key"].endswith("shard-00000.h5") and first.acquire(blocking=False):
            # Packing must go on while this upload is in progress: the next shard is written meanwhile.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not overlapped.is_set():
                if len(shard_files(out)) > 1:
                    overlapped.set()
                time.sleep(0.005)
        time.sleep(0.02)  # a slow network: uploads fall behind and the packer has to wait

    hook_puts(monkeypatch, slow_put)
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            seen.append(len(shard_files(out)))
            time.sleep(0.001)

    watcher = threading.Thread(target=monitor)
    watcher.start()
    try:
        code, stdout, err = cli(["pack", tmp_path / "src", out, *COMMON, "--shard-size", "1KiB",
                                 "--upload", f"s3://{bucket}/many", "--endpoint-url", s3_url], capsys)
    finally:
        stop.set()
        watcher.join()
    assert code == 0, err
    manifest = load_manifest(out)
    assert len(manifest.shards) == 30
    assert overlapped.is_set(), "the packer waited for the first upload instead of writing the next shard"
    assert seen and max(seen) <= BOUND, max(seen)
    assert sorted(os.listdir(out)) == [MANIFEST_NAME, "pack-report.json"]
    peak = int(re.search(r"peak local shard bytes (\d+)", stdout).group(1))  # type: ignore[union-attr]
    assert peak <= BOUND * max(s.bytes for s in manifest.shards)
    assert set(remote(s3_url, bucket, "many")) == {s.path for s in manifest.shards} | {MANIFEST_NAME}


def test_upload_failing_midway_publishes_nothing_and_the_old_dataset_survives(
        tmp_path: Path, s3_url: str, bucket: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "old-src", per_class=6, seed=1)
    assert cli(["pack", tmp_path / "old-src", tmp_path / "old", *COMMON, "--shard-size", "2KiB",
                "--upload", f"s3://{bucket}/ds", "--endpoint-url", s3_url], capsys)[0] == 0
    before = remote(s3_url, bucket, "ds")
    write_corpus(tmp_path / "src", per_class=8, seed=2)
    puts: list[str] = []
    lock = threading.Lock()

    def fail_third_shard(params: dict[str, Any]) -> None:
        with lock:
            puts.append(params["Key"])
            if len(puts) == 3:
                raise botocore.exceptions.ClientError(
                    {"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "PutObject")

    with monkeypatch.context() as patch:
        hook_puts(patch, fail_third_shard)
        code, _, err = cli(["pack", tmp_path / "src", tmp_path / "new", *COMMON, "--shard-size", "2KiB",
                            "--upload", f"s3://{bucket}/ds", "--endpoint-url", s3_url], capsys)
    assert code == 2 and one_line(err), err
    assert err.startswith(f"error: s3://{bucket}/ds/shard-") and "access denied" in err, err
    assert all(MANIFEST_NAME not in key for key in puts)
    after = remote(s3_url, bucket, "ds")
    assert after[MANIFEST_NAME] == before[MANIFEST_NAME]  # no new manifest published
    assert {name: after[name] for name in before} == before  # no shard of the old dataset touched
    assert stage_and_verify(s3_url, bucket, "ds", tmp_path / "staged-old") == 12
    assert os.listdir(tmp_path / "new") == []  # no manifest, no shard, no temporary
    sent = len(after) - len(before)  # whole objects of the new pack, named by no manifest yet
    assert sent >= 1

    # A rerun resumes (what reached the bucket is not sent again) and then the prefix holds the new dataset only.
    code, out, err = cli(["pack", tmp_path / "src", tmp_path / "new", *COMMON, "--shard-size", "2KiB",
                          "--upload", f"s3://{bucket}/ds", "--endpoint-url", s3_url], capsys)
    assert code == 0, err
    assert f"{sent} already present" in out
    manifest = load_manifest(tmp_path / "new")
    assert set(remote(s3_url, bucket, "ds")) == {s.path for s in manifest.shards} | {MANIFEST_NAME}
    assert stage_and_verify(s3_url, bucket, "ds", tmp_path / "staged-new") == 16


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_killed_midway_leaves_the_old_remote_dataset_in_place(signum: int, tmp_path: Path, s3_url: str, bucket: str,
                                                              moto_port: int, capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "old-src", per_class=4, seed=1)
    assert cli(["pack", tmp_path / "old-src", tmp_path / "old", *COMMON, "--shard-size", "2KiB",
                "--upload", f"s3://{bucket}/ds", "--endpoint-url", s3_url], capsys)[0] == 0
    before = remote(s3_url, bucket, "ds")
    write_corpus(tmp_path / "src", per_class=40, seed=2)
    out = tmp_path / "new"
    client = make_client(s3_url, 4)
    with LatencyProxy(moto_port, latency_ms=60) as proxy:
        command = [sys.executable, "-m", "workloads.data", "pack", str(tmp_path / "src"), str(out), *COMMON,
                   "--shard-size", "1KiB", "--upload", f"s3://{bucket}/ds", "--endpoint-url", proxy.url]
        process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                   stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while process.poll() is None and time.monotonic() < deadline and \
                    client.list_objects_v2(Bucket=bucket, Prefix="ds/")["KeyCount"] < len(before) + 3:
                time.sleep(0.01)
            assert process.poll() is None, "pack finished before it could be killed"
            process.send_signal(signum)
            _, err = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    after = remote(s3_url, bucket, "ds")
    assert len(after) > len(before) and {name: after[name] for name in before} == before
    assert stage_and_verify(s3_url, bucket, "ds", tmp_path / "staged") == 8
    if signum == signal.SIGTERM:  # unwinds like Ctrl-C: uploads cancelled, every local file of the run removed
        assert process.returncode == 130 and one_line(err), err
        assert os.listdir(out) == []
    else:
        assert MANIFEST_NAME not in os.listdir(out)
        assert not [name for name in os.listdir(out) if not name.startswith(".")]  # hidden temporaries at most


@pytest.mark.parametrize(("flags", "where", "why"), [
    (["--upload", "bucket/prefix"], "--upload", "expected an s3://bucket/prefix URI"),
    (["--upload", "s3://"], "--upload", "missing bucket name"),
    (["--upload", "s3://b/p", "--endpoint-url", "notaurl"], "--endpoint-url", "not an http(s) URL"),
    (["--endpoint-url", "http://127.0.0.1:9"], "--endpoint-url", "only meaningful with an s3:// SRC or --upload"),
    (["--keep-local"], "--keep-local", "only meaningful with --upload"),
])
def test_bad_upload_arguments_are_one_line(flags: list[str], where: str, why: str, tmp_path: Path, aws_env: None,
                                           capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=2)
    code, _, err = cli(["pack", tmp_path / "src", tmp_path / "out", *COMMON, *flags], capsys)
    assert code == 2 and one_line(err) and where in err and why in err, err
    assert not (tmp_path / "out").exists()


def test_unreachable_endpoint_and_missing_bucket_fail_before_packing(tmp_path: Path, s3_url: str, bucket: str,
                                                                     capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=2)
    dead = f"http://127.0.0.1:{free_port()}"
    code, _, err = cli(["pack", tmp_path / "src", tmp_path / "out", *COMMON, "--upload", f"s3://{bucket}/p",
                        "--endpoint-url", dead], capsys)
    # Nothing answering is a runtime failure (exit 1, retried), a bucket that does not exist a config error (2).
    assert code == 1 and one_line(err) and err.startswith(f"error: s3://{bucket}/p: cannot connect"), err
    assert not (tmp_path / "out").exists()
    code, _, err = cli(["pack", tmp_path / "src", tmp_path / "out", *COMMON, "--upload", "s3://no-such-bucket/p",
                        "--endpoint-url", s3_url], capsys)
    assert (code, err) == (2, "error: s3://no-such-bucket/p: bucket does not exist\n")
    assert not (tmp_path / "out").exists()


def test_keep_local_leaves_the_same_dataset_as_a_plain_pack(tmp_path: Path, s3_url: str, bucket: str,
                                                            capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=6)
    options = [*COMMON, "--shard-size", "2KiB", "--layout", "encoded"]
    assert cli(["pack", tmp_path / "src", tmp_path / "plain", *options], capsys)[0] == 0
    code, out, err = cli(["pack", tmp_path / "src", tmp_path / "kept", *options, "--keep-local",
                          "--upload", f"s3://{bucket}/kept", "--endpoint-url", s3_url], capsys)
    assert code == 0, err
    assert verify(tmp_path / "kept").num_samples == 12

    def files(directory: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}

    assert files(tmp_path / "kept") == files(tmp_path / "plain")
    objects = remote(s3_url, bucket, "kept")
    assert {name: body for name, (body, _) in objects.items()} == \
        {name: body for name, body in files(tmp_path / "kept").items() if name != "pack-report.json"}
    total = sum(s.bytes for s in load_manifest(tmp_path / "kept").shards)
    assert f"peak local shard bytes {total}" in out  # every shard stays
