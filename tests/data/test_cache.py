"""The staging cache: `stage` with a budget serving a reader's plan (workloads/data/moving/cache.py), against moto
over HTTP.

A reader thread plays the training node: it writes the plan (the rest of this epoch, then the next epoch) as it
goes, waits for each shard with CacheReader.wait_ready and hashes what it reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from benchmarks.netem import FaultProxy, LatencyProxy
from tests.data.helpers import FAST_RETRY, write_corpus
from workloads.data.__main__ import main
from workloads.data.format.errors import DataToolError
from workloads.data.format.manifest import CACHE_DIR, MANIFEST_NAME, PLAN_STATE, STAGER_STATE, Manifest, load_manifest
from workloads.data.format.verify import sha256_file
from workloads.data.moving.cache import (
    CacheReader,
    CacheStagerError,
    ReadPlan,
    StagerState,
    cache_dir,
    is_cached,
    read_stager_state,
    write_plan,
    write_stager_state,
)
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.stage import TEMP_SUFFIX, StageOptions, StageResult, part_size, stage
from workloads.data.moving.upload import UploadOptions, upload
from workloads.data.writing.pack import PackOptions, pack

REPO = Path(__file__).resolve().parents[2]
PREFIX = "sets/many"


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eleven shards (the last one smaller), about 3 MB in all: a budget of 40% holds four, and is above the CLI's
    1 MiB minimum."""
    source = tmp_path_factory.mktemp("corpus")
    write_corpus(source, per_class=32)
    out = tmp_path_factory.mktemp("many")
    pack(source, out, PackOptions(layout="decoded", image_size=128, shard_bytes=320_000, workers=1, progress=False))
    shards = load_manifest(out).shards
    assert len(shards) >= 8 and 0.4 * sum(s.bytes for s in shards) > 1 << 20
    return out


def _upload(dataset: Path, s3_url: str, bucket: str) -> S3Uri:
    target = S3Uri(bucket, PREFIX)
    upload(make_client(s3_url, 4, botocore_attempts=3), dataset, target, UploadOptions(workers=4, progress=False))
    return target


def _options(**overrides: Any) -> StageOptions:
    values: dict[str, Any] = {"workers": 4, "part_bytes": 64 << 10, "retry": FAST_RETRY, "progress": False,
                              "poll_interval_s": 0.005, "first_plan_wait_s": 0.0}
    values.update(overrides)
    return StageOptions(**values)


def _names(manifest: Manifest) -> list[str]:
    return [s.path for s in manifest.shards]


def _orders(names: list[str], epochs: int, seed: int = 0) -> list[list[str]]:
    """One seeded permutation per epoch, each different from the others and from manifest order."""
    rng = random.Random(seed)
    orders: list[list[str]] = []
    while len(orders) < epochs:
        order = list(names)
        rng.shuffle(order)
        if order != names and order not in orders:
            orders.append(order)
    return orders


def _plan_from(orders: list[list[str]], epoch: int, position: int) -> list[str]:
    """The node's future reads in first-use order: the rest of this epoch, then the next epoch."""
    order = list(orders[epoch][position:])
    if epoch + 1 < len(orders):
        order += [name for name in orders[epoch + 1] if name not in order]
    return order


def _shard_bytes_on_disk(dest: Path) -> int:
    """Final shards plus temp files: every regular file in DEST but the manifest (the state lives in .cache/)."""
    total = 0
    for path in dest.iterdir():
        with contextlib.suppress(FileNotFoundError):  # evicted or renamed between listing and stat
            if path.is_file() and path.name != MANIFEST_NAME:
                total += path.stat().st_size
    return total


class _Reader(threading.Thread):
    """Reads `orders` (one list per epoch) from DEST as the training node would, then says the plan is done."""

    def __init__(self, dest: Path, orders: list[list[str]], wait_manifest: bool = True) -> None:
        super().__init__(name="cache-reader")
        self.dest, self.orders, self.wait_manifest = dest, orders, wait_manifest
        self.reads: list[tuple[str, str]] = []
        self.evicted_while_read: list[str] = []
        self.cached_before_manifest: bool | None = None
        self.failures: list[BaseException] = []

    def run(self) -> None:
        cache = CacheReader(self.dest, poll_interval_s=0.005)
        try:
            if self.wait_manifest:
                deadline = time.monotonic() + 60
                while not (self.dest / MANIFEST_NAME).exists():
                    assert time.monotonic() < deadline, "no manifest.json in DEST"
                    time.sleep(0.005)
                self.cached_before_manifest = is_cached(self.dest)
            for epoch, order in enumerate(self.orders):
                for position, name in enumerate(order):
                    cache.write_plan(_plan_from(self.orders, epoch, position))
                    path = cache.wait_ready(name, timeout=60)
                    self.reads.append((name, sha256_file(path)))
                    if not cache.is_ready(name):  # the plan still names it first: it must still be here
                        self.evicted_while_read.append(name)
        except BaseException as exc:
            self.failures.append(exc)
        finally:
            cache.write_plan([], done=True)  # also after a failure: a stager without --linger then exits


class _Monitor(threading.Thread):
    def __init__(self, dest: Path) -> None:
        super().__init__(name="disk-monitor")
        self.dest = dest
        self.most = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.most = max(self.most, _shard_bytes_on_disk(self.dest))
            time.sleep(0.0005)


class _Recording:
    """A boto3 client that records every get_object (key, range) it is asked for, in order."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.gets: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def get_object(self, **kwargs: Any) -> Any:
        with self.lock:
            self.gets.append((kwargs["Key"].rsplit("/", 1)[-1], kwargs.get("Range", "")))
        return self.client.get_object(**kwargs)

    def shard_starts(self) -> list[str]:
        """Shards in the order their first byte range was asked for (one entry per download)."""
        with self.lock:
            return [key for key, rng in self.gets if rng.startswith("bytes=0-")]


def _serve(dest: Path, target: S3Uri, client: Any, options: StageOptions,
           orders: list[list[str]]) -> tuple[StageResult, _Reader, _Monitor]:
    dest.mkdir(exist_ok=True)
    reader, monitor = _Reader(dest, orders), _Monitor(dest)
    reader.start()
    monitor.start()
    try:
        result = stage(client, target, dest, options)
    finally:
        reader.join(120)
        monitor.stop.set()
        monitor.join(60)
    return result, reader, monitor


# -- the bound, the order, the plan ---------------------------------------------------------------------------------
def test_budget_bounds_the_cache_over_epochs_of_different_orders(many: Path, s3_url: str, bucket: str,
                                                                 tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names, sha = _names(manifest), {s.path: s.sha256 for s in manifest.shards}
    budget = int(0.4 * sum(s.bytes for s in manifest.shards))
    assert budget >= max(s.bytes for s in manifest.shards)
    orders = _orders(names, 3)
    dest = tmp_path / "dest"
    result, reader, monitor = _serve(dest, target, make_client(s3_url, 4), _options(budget_bytes=budget), orders)
    assert reader.failures == []
    assert [name for name, _ in reader.reads] == [name for order in orders for name in order]
    assert all(digest == sha[name] for name, digest in reader.reads)
    assert reader.evicted_while_read == []
    assert reader.cached_before_manifest is True  # stager.json was there before the reader could start
    assert result.peak_held_bytes <= budget
    assert 0 < monitor.most <= budget
    assert result.evicted and len(result.fetched) > len(names)  # the budget forced evictions and re-fetches
    state = read_stager_state(dest)
    assert state is not None and state.done and state.error is None and state.budget == budget
    assert sum(s.bytes for s in manifest.shards if s.path in state.ready) <= budget
    assert sorted(p.name for p in dest.glob("shard-*.h5")) == sorted(state.ready)
    assert (dest / MANIFEST_NAME).read_bytes() == (many / MANIFEST_NAME).read_bytes()
    assert not list(dest.glob(f".*{TEMP_SUFFIX}"))


def test_a_budget_that_holds_the_dataset_fetches_each_shard_once(many: Path, s3_url: str, bucket: str,
                                                                  tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    budget = sum(s.bytes for s in manifest.shards)
    client = _Recording(make_client(s3_url, 4))
    result, reader, monitor = _serve(tmp_path / "dest", target, client, _options(budget_bytes=budget),
                                     _orders(names, 3))
    assert reader.failures == [] and len(reader.reads) == 3 * len(names)
    assert sorted(result.fetched) == sorted(names) and result.evicted == []
    assert Counter(client.shard_starts()) == Counter(names)  # one download per shard across three epochs
    assert monitor.most <= budget


def test_fetches_follow_a_plan_written_before_the_stager_starts(many: Path, s3_url: str, bucket: str,
                                                                 tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    orders = _orders(names, 1, seed=7)
    dest = tmp_path / "dest"
    write_plan(dest, ReadPlan(order=orders[0]))
    client = _Recording(make_client(s3_url, 1))
    # One worker takes the queued ranged GETs first come first served, so GETs go out in the order fetches start.
    result, reader, _ = _serve(dest, target, client,
                               _options(workers=1, budget_bytes=sum(s.bytes for s in manifest.shards)), orders)
    assert reader.failures == []
    starts = client.shard_starts()
    assert starts[0] == orders[0][0] != names[0]
    assert starts == orders[0]
    assert sorted(result.fetched) == sorted(names)


def test_without_a_plan_a_budget_fills_in_manifest_order(many: Path, s3_url: str, bucket: str,
                                                          tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    budget = int(0.4 * sum(s.bytes for s in manifest.shards))
    prefix, used = [], 0
    for shard in manifest.shards:
        if used + shard.bytes > budget:
            break
        prefix.append(shard.path)
        used += shard.bytes
    with pytest.raises(DataToolError) as failure:  # nobody writes a plan: the stager fills up and gives up
        stage(make_client(s3_url, 4), target, tmp_path / "dest", _options(budget_bytes=budget, wait_timeout_s=0.3))
    assert sorted(p.name for p in (tmp_path / "dest").glob("shard-*.h5")) == sorted(prefix)
    assert failure.value.where == str(tmp_path / "dest" / CACHE_DIR / PLAN_STATE)
    assert "--wait-timeout" in failure.value.why and names[len(prefix)] in failure.value.why
    state = read_stager_state(tmp_path / "dest")  # a reader that starts late fails at once instead of waiting
    assert state is not None and state.error is not None and "--wait-timeout" in state.error
    with pytest.raises(CacheStagerError, match="--wait-timeout"):
        CacheReader(tmp_path / "dest").wait_ready(names[-1], timeout=5)


def test_a_small_budget_still_fetches_each_shard_as_parallel_parts(many: Path, s3_url: str, bucket: str,
                                                                    moto_port: int, tmp_path: Path) -> None:
    """A budget of two shards holds at most one shard in flight while the reader reads the other: unless that
    shard is split into several ranged GETs, most connections sit idle (min_part_bytes is lowered to the test's
    scale)."""
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    budget = 2 * max(s.bytes for s in manifest.shards)
    with FaultProxy(moto_port) as proxy:  # no faults: it only counts the GETs
        result, reader, _ = _serve(tmp_path / "dest", target, make_client(proxy.url, 4),
                                   _options(budget_bytes=budget, min_part_bytes=1024, part_bytes=16 << 20),
                                   [_names(manifest)])
    assert reader.failures == []
    assert result.peak_held_bytes <= budget
    # One GET for the manifest, then at least 2 ranges per shard (the default 16 MiB part would make it 1).
    assert proxy.counts.requests >= 1 + 2 * len(manifest.shards)


@pytest.mark.parametrize(("budget", "expected"), [
    (64 << 20, 2 << 20),  # two 32 MiB shards: 32 parts of 2 MiB keep 16 connections busy twice over
    (8 << 20, 1 << 20),  # never below the 1 MiB floor
    (64 << 30, 16 << 20),  # a real NVMe budget: the largest part
])
def test_a_small_budget_spreads_over_every_connection_with_the_default_options(budget: int, expected: int) -> None:
    assert part_size(StageOptions(workers=16), budget) == expected


def test_a_budget_smaller_than_a_shard_is_refused(many: Path, s3_url: str, bucket: str, tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    with pytest.raises(DataToolError, match="--budget: .*shard-"):
        stage(make_client(s3_url, 4), target, tmp_path / "d", _options(budget_bytes=1000))
    assert not (tmp_path / "d").exists()


# -- failures reach the reader; hostile plans --------------------------------------------------------------------
def _waiting_reader(dest: Path, name: str) -> tuple[threading.Thread, list[BaseException]]:
    caught: list[BaseException] = []

    def wait() -> None:
        try:
            CacheReader(dest, poll_interval_s=0.005).wait_ready(name, timeout=60)
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=wait, name="waiting-reader")
    thread.start()
    return thread, caught


@pytest.mark.parametrize("fault", ["missing", "corrupt"])
def test_a_stager_failure_reaches_a_waiting_reader(fault: str, many: Path, s3_url: str, bucket: str,
                                                   moto_port: int, tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    victim = manifest.shards[1].path
    dest = tmp_path / "dest"
    dest.mkdir()
    budget = sum(s.bytes for s in manifest.shards)
    thread, caught = _waiting_reader(dest, victim)
    try:
        if fault == "missing":
            make_client(s3_url, 4).delete_object(Bucket=bucket, Key=target.key(victim))
            with pytest.raises(DataToolError, match="object not found"):
                stage(make_client(s3_url, 4), target, dest, _options(budget_bytes=budget))
        else:
            with FaultProxy(moto_port, corrupt_every=1, skip_first=1) as proxy, \
                    pytest.raises(DataToolError, match="sha256 does not match the manifest after 3 downloads"):
                stage(make_client(proxy.url, 4), target, dest, _options(budget_bytes=budget))
    finally:
        thread.join(90)
    assert len(caught) == 1 and isinstance(caught[0], CacheStagerError), caught
    assert ("object not found" if fault == "missing" else "sha256 does not match") in str(caught[0])
    assert not list(dest.glob(f".*{TEMP_SUFFIX}"))


def _cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusing a flag
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


BROKEN_PLANS: dict[str, Callable[[Path], None]] = {
    "garbage": lambda cache: (cache / PLAN_STATE).write_bytes(b"\xff\xfe\x00not json"),
    "directory": lambda cache: (cache / PLAN_STATE).mkdir(),
    "deep": lambda cache: (cache / PLAN_STATE).write_bytes(b"[" * 100_000 + b"]" * 100_000),
    "not-an-object": lambda cache: (cache / PLAN_STATE).write_text("[]"),
    "order-not-a-list": lambda cache: (cache / PLAN_STATE).write_text(json.dumps({"order": "shard-00000.h5"})),
    "order-of-numbers": lambda cache: (cache / PLAN_STATE).write_text(json.dumps({"order": [1, 2]})),
}


@pytest.mark.parametrize("kind", sorted(BROKEN_PLANS))
def test_a_broken_plan_is_one_line(kind: str, many: Path, s3_url: str, bucket: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture) -> None:
    _upload(many, s3_url, bucket)
    dest = tmp_path / "dest"
    cache_dir(dest).mkdir(parents=True)
    BROKEN_PLANS[kind](cache_dir(dest))
    code, _, err = _cli(["stage", f"s3://{bucket}/{PREFIX}", str(dest), "--endpoint-url", s3_url, "--budget",
                         "1GiB", "--no-progress"], capsys)
    assert code == 2 and _one_line(err) and f"{CACHE_DIR}/{PLAN_STATE}" in err, err
    state = read_stager_state(dest)
    assert state is not None and state.error is not None and PLAN_STATE in state.error


def test_a_cache_dir_that_is_a_file_is_one_line(many: Path, s3_url: str, bucket: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    _upload(many, s3_url, bucket)
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / CACHE_DIR).write_text("x")
    code, _, err = _cli(["stage", f"s3://{bucket}/{PREFIX}", str(dest), "--endpoint-url", s3_url, "--budget",
                         "1GiB", "--no-progress"], capsys)
    assert code == 2 and _one_line(err) and CACHE_DIR in err, err
    assert (dest / CACHE_DIR).read_text() == "x"


@pytest.mark.parametrize("unknown", ["shard-99999.h5", "../victim.h5", "VICTIM", "x" * 5000])
def test_a_plan_naming_a_shard_outside_the_manifest_is_refused(unknown: str, many: Path, s3_url: str, bucket: str,
                                                               tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    _upload(many, s3_url, bucket)
    victim = tmp_path / "victim.h5"
    victim.write_bytes(b"precious")
    dest = tmp_path / "dest"
    names = _names(load_manifest(many))
    write_plan(dest, ReadPlan(order=[names[0], unknown.replace("VICTIM", str(victim))]))
    code, _, err = _cli(["stage", f"s3://{bucket}/{PREFIX}", str(dest), "--endpoint-url", s3_url, "--budget",
                         "1GiB", "--no-progress"], capsys)
    assert code == 2 and _one_line(err) and f"{CACHE_DIR}/{PLAN_STATE}" in err and "manifest" in err, err
    assert len(err) < 600
    assert victim.read_bytes() == b"precious"


def test_a_plan_turning_hostile_mid_run_stops_the_stager(many: Path, s3_url: str, bucket: str,
                                                         tmp_path: Path) -> None:
    """The plan is read again and again: a later plan is checked as strictly as the first."""
    target = _upload(many, s3_url, bucket)
    names = _names(load_manifest(many))
    dest = tmp_path / "dest"
    dest.mkdir()
    failures: list[BaseException] = []

    def turn() -> None:
        try:
            cache = CacheReader(dest, poll_interval_s=0.005)
            cache.write_plan(names)
            cache.wait_ready(names[0], timeout=60)
            cache.write_plan([names[0], "../../etc/passwd"])
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=turn)
    thread.start()
    try:
        with pytest.raises(DataToolError) as failure:
            stage(make_client(s3_url, 4), target, dest, _options(budget_bytes=1 << 30))
    finally:
        thread.join(60)
    assert failures == []
    assert failure.value.where.endswith(f"{CACHE_DIR}/{PLAN_STATE}") and "../../etc/passwd" in failure.value.why


def test_wait_timeout_says_what_it_waits_for(tmp_path: Path, many: Path, s3_url: str, bucket: str) -> None:
    """No reader: the budget fills, then the stager logs what it waits for and gives up after --wait-timeout."""
    _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    budget = 1 << 20  # the CLI's smallest
    assert sum(s.bytes for s in manifest.shards) > budget
    process = subprocess.run(
        [sys.executable, "-m", "workloads.data", "stage", f"s3://{bucket}/{PREFIX}", str(tmp_path / "dest"),
         "--endpoint-url", s3_url, "--budget", f"{budget}B", "--wait-timeout", "1", "--no-progress"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert process.returncode == 1, process.stderr  # a runtime failure (a Job retries it), not a config error
    lines = process.stderr.strip().splitlines()
    assert any("waiting for" in line and PLAN_STATE in line for line in lines[:-1]), process.stderr
    assert lines[-1].startswith("error: ") and PLAN_STATE in lines[-1] and "--wait-timeout" in lines[-1]


# -- what stays on disk ----------------------------------------------------------------------------------------------
def test_eviction_never_touches_files_the_manifest_does_not_name(many: Path, s3_url: str, bucket: str,
                                                                 tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    dest = tmp_path / "dest"
    dest.mkdir()
    strangers = {"notes.txt": b"mine", "shard-09999.h5": b"not in the manifest",
                 ".shard-09999.h5.1.1.part": b"someone else's temp", "shard-00000.h5.bak": b"backup"}
    for name, payload in strangers.items():
        (dest / name).write_bytes(payload)
    (dest / "subdir").mkdir()
    (dest / "subdir" / names[0]).write_bytes(b"nested")
    stale = dest / f".{names[0]}.999.1{TEMP_SUFFIX}"
    stale.write_bytes(b"a temp of an earlier stager run")
    budget = int(0.4 * sum(s.bytes for s in manifest.shards))
    result, reader, _ = _serve(dest, target, make_client(s3_url, 4), _options(budget_bytes=budget),
                               _orders(names, 2))
    assert reader.failures == [] and result.evicted
    assert {name: (dest / name).read_bytes() for name in strangers} == strangers
    assert (dest / "subdir" / names[0]).read_bytes() == b"nested"
    assert not stale.exists()


def test_resume_keeps_verified_shards_in_plan_order_up_to_the_budget(many: Path, s3_url: str, bucket: str,
                                                                     tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names, size = _names(manifest), {s.path: s.bytes for s in manifest.shards}
    dest = tmp_path / "dest"
    stage(make_client(s3_url, 4), target, dest, _options())  # a whole copy...
    (dest / MANIFEST_NAME).unlink()  # ...that was stopped before its last step (the reader waits for the stager)
    orders = _orders(names, 2, seed=3)
    damaged = dest / orders[0][1]
    damaged.write_bytes(damaged.read_bytes()[:-4] + b"oops")
    (dest / f".{orders[0][0]}.999.1{TEMP_SUFFIX}").write_bytes(b"stale")
    write_plan(dest, ReadPlan(order=_plan_from(orders, 0, 0)))
    budget = int(0.5 * sum(size.values()))
    desired, used = [], 0
    for name in _plan_from(orders, 0, 0):
        if used + size[name] > budget:
            break
        desired.append(name)
        used += size[name]
    result, reader, _ = _serve(dest, target, make_client(s3_url, 4), _options(budget_bytes=budget), orders)
    assert reader.failures == []
    assert set(desired) - {damaged.name} <= set(result.kept) and damaged.name not in result.kept
    assert sum(size[name] for name in result.kept) <= budget and _shard_bytes_on_disk(dest) <= budget
    assert not list(dest.glob(f".*{TEMP_SUFFIX}"))


@pytest.mark.slow
def test_a_stager_killed_mid_fetch_resumes(many: Path, s3_url: str, bucket: str, moto_port: int,
                                           tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    dest = tmp_path / "dest"
    with LatencyProxy(moto_port, latency_ms=0, per_connection_mb_s=0.5) as slow:  # a shard takes ~0.6 s
        command = [sys.executable, "-m", "workloads.data", "stage", f"s3://{bucket}/{PREFIX}", str(dest),
                   "--endpoint-url", slow.url, "--workers", "1", "--budget", "1GiB", "--linger", "--no-progress"]
        process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not (list(dest.glob("shard-*.h5")) and list(dest.glob(f".*{TEMP_SUFFIX}"))):
                assert process.poll() is None, process.communicate()[1]
                assert time.monotonic() < deadline, "never saw a finished shard beside a download in flight"
                time.sleep(0.01)
            process.send_signal(signal.SIGKILL)
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
    finished = sorted(p.name for p in dest.glob("shard-*.h5"))
    temps = list(dest.glob(f".*{TEMP_SUFFIX}"))
    assert finished and temps and len(finished) < len(names)  # killed with a download in flight
    state = read_stager_state(dest)
    assert state is not None and set(state.ready) <= set(finished)  # a shard is published only once in place
    result, reader, _ = _serve(dest, target, make_client(s3_url, 4),
                               _options(budget_bytes=sum(s.bytes for s in manifest.shards)), [names])
    assert reader.failures == []
    assert set(finished) <= set(result.kept)
    assert sorted(result.kept + result.fetched) == sorted(names)
    assert not any(path.exists() for path in temps)
    assert all(sha256_file(dest / s.path) == s.sha256 for s in manifest.shards)


def test_copy_mode_removes_a_stale_cache_state_and_writes_the_manifest_last(many: Path, s3_url: str, bucket: str,
                                                                            tmp_path: Path) -> None:
    target = _upload(many, s3_url, bucket)
    names = _names(load_manifest(many))
    dest = tmp_path / "dest"
    write_stager_state(dest, StagerState(budget=1 << 20, ready=[], error="an earlier cache run failed"))
    write_plan(dest, ReadPlan(order=list(reversed(names))))
    client = _Recording(make_client(s3_url, 1))
    result = stage(client, target, dest, _options(workers=1))
    assert sorted(result.fetched) == sorted(names) and result.evicted == []
    assert not is_cached(dest)  # a reader must not trust the stale ready list (or error) of another run
    assert (cache_dir(dest) / PLAN_STATE).exists()  # the reader's file is the reader's
    assert client.shard_starts() == names  # copy mode: manifest order
    assert CacheReader(dest).wait_ready(names[0], timeout=0) == dest / names[0]


# -- the CLI: a sidecar serving the plan until SIGTERM -------------------------------------------------------------
SUMMARY = re.compile(r"fetched (\d+) shards \((\d+) bytes\), kept (\d+) already verified, evicted (\d+); "
                     r"peak (\d+) bytes held")


@pytest.mark.parametrize("budget", [None, 0.4])
def test_lingering_sidecar_serves_until_sigterm(budget: float | None, many: Path, s3_url: str, bucket: str,
                                                tmp_path: Path) -> None:
    _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    total = sum(s.bytes for s in manifest.shards)
    dest = tmp_path / "dest"
    command = [sys.executable, "-m", "workloads.data", "stage", f"s3://{bucket}/{PREFIX}", str(dest),
               "--endpoint-url", s3_url, "--linger", "--no-progress"]
    if budget is not None:
        command += ["--window", f"{int(budget * total)}B"]  # the alias older Jobs pass
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        reader = _Reader(dest, _orders(names, 3))
        reader.start()
        reader.join(120)
        assert reader.failures == [] and len(reader.reads) == 3 * len(names)
        time.sleep(0.2)  # the plan says done; a lingering sidecar must stay regardless
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    summary = SUMMARY.search(out)
    assert summary, out
    fetched, _, kept, evicted, peak = (int(group) for group in summary.groups())
    state = read_stager_state(dest)
    assert state is not None and state.budget == (None if budget is None else int(budget * total))
    if budget is None:
        assert (fetched, kept, evicted) == (len(names), 0, 0) and peak == total
        assert sorted(state.ready) == sorted(names)
    else:
        assert evicted > 0 and fetched > len(names) and peak <= int(budget * total)


# -- the reader helper ------------------------------------------------------------------------------------------------
def test_reader_trusts_only_the_ready_list(tmp_path: Path) -> None:
    (tmp_path / "shard-00000.h5").write_bytes(b"present but not yet verified")
    write_stager_state(tmp_path, StagerState(budget=1 << 20, ready=[]))
    reader = CacheReader(tmp_path, poll_interval_s=0.001)
    assert not reader.is_ready("shard-00000.h5")
    with pytest.raises(TimeoutError, match="shard-00000.h5.*plan"):
        reader.wait_ready("shard-00000.h5", timeout=0.01)
    write_stager_state(tmp_path, StagerState(budget=1 << 20, ready=["shard-00000.h5"]))
    assert reader.wait_ready("shard-00000.h5", timeout=0) == tmp_path / "shard-00000.h5"
    assert (tmp_path / CACHE_DIR / STAGER_STATE).is_file()


@pytest.mark.parametrize(("flags", "where"), [
    (["--budget", "1GiB", "--window", "1GiB"], "--window"),  # the alias and the flag at once
    (["--wait-timeout", "5"], "--wait-timeout"),  # a copy waits for no reader
])
def test_cli_refuses_contradictory_flags(flags: list[str], where: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture) -> None:
    code, _, err = _cli(["stage", "s3://bucket/prefix", str(tmp_path / "dest"), *flags], capsys)
    assert code == 2 and _one_line(err) and err.startswith(f"error: {where}: "), err
    assert not (tmp_path / "dest").exists()


class _Slow(_Recording):
    """Every GET takes at least `delay` seconds (a far object store), so the order parts are served in shows."""

    def __init__(self, client: Any, delay: float) -> None:
        super().__init__(client)
        self.delay = delay

    def get_object(self, **kwargs: Any) -> Any:
        response = super().get_object(**kwargs)
        time.sleep(self.delay)
        return response


def test_a_shard_the_plan_puts_first_jumps_the_queue(many: Path, s3_url: str, bucket: str, tmp_path: Path) -> None:
    """The reader starts after the stager has queued downloads in manifest order: its first shard gets the next
    free connection instead of waiting behind everything already queued."""
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    dest = tmp_path / "dest"
    client = _Slow(make_client(s3_url, 4), delay=0.3)
    options = _options(workers=4, part_bytes=8 << 20, budget_bytes=sum(s.bytes for s in manifest.shards))
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(stage(client, target, dest, options)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not client.shard_starts() and time.monotonic() < deadline:
        time.sleep(0.005)
    first_needed = names[-1]  # the last in manifest order: without priority it would come last of those queued
    write_plan(dest, ReadPlan(order=[first_needed, *names[:-1]]))
    CacheReader(dest, poll_interval_s=0.005).wait_ready(first_needed, timeout=30)
    ready_before = [name for name in read_stager_state(dest).ready if name != first_needed]  # type: ignore[union-attr]
    write_plan(dest, ReadPlan(order=[], done=True))
    thread.join(60)
    assert results and not thread.is_alive()
    # 8 downloads (2 per connection) were under way when the plan came; 4 run, 1 more waits in the pool: the shard
    # the reader needs goes next, so at most the first two waves of 4 finish before it
    assert len(ready_before) <= 5, ready_before


def test_a_serving_stager_waits_for_the_first_plan_before_fetching(many: Path, s3_url: str, bucket: str,
                                                                   tmp_path: Path) -> None:
    """Until the reader's first plan (or first_plan_wait_s), nothing is fetched: the first GET is the plan's first
    shard, not the manifest's."""
    target = _upload(many, s3_url, bucket)
    manifest = load_manifest(many)
    names = _names(manifest)
    dest = tmp_path / "dest"
    client = _Recording(make_client(s3_url, 4))
    options = _options(first_plan_wait_s=30.0, budget_bytes=sum(s.bytes for s in manifest.shards))
    thread = threading.Thread(target=lambda: stage(client, target, dest, options), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (dest / MANIFEST_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.3)
    assert client.shard_starts() == []  # serving, but no plan yet
    write_plan(dest, ReadPlan(order=[names[-1], *names[:-1]], done=False))
    CacheReader(dest, poll_interval_s=0.005).wait_ready(names[-1], timeout=30)
    write_plan(dest, ReadPlan(order=[], done=True))
    thread.join(60)
    assert client.shard_starts()[0] == names[-1]
