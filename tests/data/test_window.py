"""Rolling-window staging: the stager's bound, and the reader helper the HDF5 Dataset uses."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from benchmarks.netem import FaultProxy
from tests.data.helpers import FAST_RETRY, uploaded
from workloads.data.format import MANIFEST_NAME, WINDOW_DIR, load_manifest
from workloads.data.s3 import DataToolError, RetryPolicy, make_client
from workloads.data.stage import StageOptions, stage
from workloads.data.verify import sha256_file
from workloads.data.window import (
    StagerState,
    WindowReader,
    WindowStagerError,
    read_consumed,
    read_stager_state,
    write_stager_state,
)


def _shard_bytes_on_disk(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.iterdir() if p.is_file() and p.name != MANIFEST_NAME)


def test_window_never_exceeds_its_bound(packed: Path, s3_url: str, bucket: str, tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    manifest = load_manifest(packed)
    window = 2 * max(s.bytes for s in manifest.shards)
    assert window < sum(s.bytes for s in manifest.shards)  # the stager must wait for the reader
    dest = tmp_path / "dest"
    dest.mkdir()
    read: dict[str, str] = {}
    most_on_disk = 0
    stop = threading.Event()
    failures: list[BaseException] = []

    def reader() -> None:
        try:
            helper = WindowReader(dest, poll_interval_s=0.005)
            for shard in manifest.shards:
                path = helper.wait_ready(shard.path, timeout=60)
                read[shard.path] = sha256_file(path)
                helper.mark_consumed(shard.path)
        except BaseException as exc:
            failures.append(exc)

    def monitor() -> None:
        nonlocal most_on_disk
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):  # a file vanished between listing and stat
                most_on_disk = max(most_on_disk, _shard_bytes_on_disk(dest))

    threads = [threading.Thread(target=reader), threading.Thread(target=monitor)]
    for thread in threads:
        thread.start()
    try:
        result = stage(make_client(s3_url, 4), target, dest, StageOptions(
            workers=4, part_bytes=4096, window_bytes=window, retry=FAST_RETRY, progress=False,
            poll_interval_s=0.005))
        threads[0].join(60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert failures == []
    assert read == {s.path: s.sha256 for s in manifest.shards}
    assert result.peak_window_bytes <= window
    assert most_on_disk <= window
    state = read_stager_state(dest)
    assert state is not None and state.done and state.order == [s.path for s in manifest.shards]
    assert (dest / MANIFEST_NAME).read_bytes() == (packed / MANIFEST_NAME).read_bytes()


def test_window_smaller_than_a_shard_is_refused(packed: Path, s3_url: str, bucket: str, tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    with pytest.raises(DataToolError, match="--window: .*shard-"):
        stage(make_client(s3_url, 4), target, tmp_path / "d", StageOptions(window_bytes=1000, progress=False))


def test_window_resume_skips_consumed_shards(packed: Path, s3_url: str, bucket: str, tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    names = [s.path for s in load_manifest(packed).shards]
    dest = tmp_path / "dest"
    WindowReader(dest).mark_consumed(names[:2])
    result = stage(make_client(s3_url, 4), target, dest, StageOptions(
        workers=2, part_bytes=4096, window_bytes=10 << 20, retry=FAST_RETRY, progress=False))
    assert sorted(result.fetched) == names[2:]
    assert sorted(p.name for p in dest.glob("shard-*.h5")) == names[2:]


def test_reader_fails_fast_when_the_stager_gives_up(packed: Path, s3_url: str, bucket: str, moto_port: int,
                                                    tmp_path: Path) -> None:
    target = uploaded(packed, s3_url, bucket)
    dest = tmp_path / "dest"
    with FaultProxy(moto_port, slowdown_every=1, skip_first=1) as proxy, pytest.raises(DataToolError):
        stage(make_client(proxy.url, 2), target, dest, StageOptions(
            workers=2, window_bytes=10 << 20, retry=RetryPolicy(2, 0.01, 0.01), progress=False))
    with pytest.raises(WindowStagerError, match="gave up after 2 attempts: SlowDown"):
        WindowReader(dest).wait_ready("shard-00000.h5", timeout=5)


def test_reader_without_window_state_waits_for_the_file(tmp_path: Path) -> None:
    reader = WindowReader(tmp_path, poll_interval_s=0.001)
    with pytest.raises(TimeoutError, match="shard-00000.h5"):
        reader.wait_ready("shard-00000.h5", timeout=0.01)
    (tmp_path / "shard-00000.h5").write_bytes(b"x")
    assert reader.wait_ready(tmp_path / "shard-00000.h5", timeout=0) == tmp_path / "shard-00000.h5"


def test_reader_trusts_only_the_ready_list(tmp_path: Path) -> None:
    (tmp_path / "shard-00000.h5").write_bytes(b"present but not yet verified")
    write_stager_state(tmp_path, StagerState(order=["shard-00000.h5", "shard-00001.h5"], ready=[]))
    reader = WindowReader(tmp_path, poll_interval_s=0.001)
    assert not reader.is_ready("shard-00000.h5")
    write_stager_state(tmp_path, StagerState(order=["shard-00000.h5", "shard-00001.h5"], ready=["shard-00000.h5"]))
    assert reader.is_ready("shard-00000.h5")
    assert reader.order() == ["shard-00000.h5", "shard-00001.h5"]
    with pytest.raises(ValueError, match="not in the stager's order"):
        reader.is_ready("shard-00009.h5")
    reader.mark_consumed("shard-00000.h5")
    (tmp_path / "shard-00000.h5").unlink()  # what the stager does with a consumed shard
    with pytest.raises(ValueError, match="consumed and deleted already"):
        reader.wait_ready("shard-00000.h5", timeout=1)


def test_consumed_marks_from_several_processes_merge(tmp_path: Path) -> None:
    first, second = WindowReader(tmp_path), WindowReader(tmp_path)
    first.mark_consumed("shard-00001.h5")
    second.mark_consumed(tmp_path / "shard-00000.h5")
    first.mark_consumed(["shard-00001.h5", "shard-00002.h5"])
    assert read_consumed(tmp_path) == {"shard-00000.h5", "shard-00001.h5", "shard-00002.h5"}
    assert (tmp_path / WINDOW_DIR / "reader.json").is_file()


def test_lingering_sidecar_keeps_deleting_until_sigterm(packed: Path, s3_url: str, bucket: str,
                                                         tmp_path: Path) -> None:
    uploaded(packed, s3_url, bucket)
    names = [s.path for s in load_manifest(packed).shards]
    dest = tmp_path / "dest"
    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "workloads.data", "stage", f"s3://{bucket}/sets/tiny", str(dest),
               "--endpoint-url", s3_url, "--window", "10MiB", "--linger", "--no-progress"]
    process = subprocess.Popen(command, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reader = WindowReader(dest, poll_interval_s=0.01)
        for name in names:
            reader.wait_ready(name, timeout=60)
        deadline = time.monotonic() + 60  # "done" is written just after the last shard turns ready
        while not ((state := read_stager_state(dest)) is not None and state.done) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state is not None and state.done
        reader.mark_consumed(names[0])
        deadline = time.monotonic() + 60
        while (dest / names[0]).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not (dest / names[0]).exists()  # deleted by the stager after it finished staging
        assert process.poll() is None  # still there, as a native sidecar must be
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err


def test_a_small_window_still_fetches_each_shard_as_parallel_parts(packed: Path, s3_url: str, bucket: str,
                                                                    moto_port: int, tmp_path: Path) -> None:
    """A window of two shards holds at most one shard in flight while the reader reads the other: unless that shard
    is split into several ranged GETs, most connections sit idle (min_part_bytes is lowered to the test's scale)."""
    target = uploaded(packed, s3_url, bucket)
    manifest = load_manifest(packed)
    largest = max(s.bytes for s in manifest.shards)
    dest = tmp_path / "dest"
    dest.mkdir()
    failures: list[BaseException] = []

    def reader() -> None:
        try:
            helper = WindowReader(dest, poll_interval_s=0.005)
            for shard in manifest.shards:
                assert sha256_file(helper.wait_ready(shard.path, timeout=60)) == shard.sha256
                helper.mark_consumed(shard.path)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    with FaultProxy(moto_port) as proxy:  # no faults: it only counts the GETs
        result = stage(make_client(proxy.url, 4), target, dest, StageOptions(
            workers=4, window_bytes=2 * largest, min_part_bytes=1024, retry=FAST_RETRY, progress=False,
            poll_interval_s=0.005))
    thread.join(60)
    assert failures == []
    assert result.peak_window_bytes <= 2 * largest
    # One GET for the manifest, then at least 2 ranges per shard (the default 16 MiB part would make it 1).
    assert proxy.counts.requests >= 1 + 2 * len(manifest.shards)
