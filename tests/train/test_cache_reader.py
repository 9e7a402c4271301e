"""Reading a directory that a staging cache fills and evicts while training runs (workloads/data/moving/cache.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.moto_server import moto_server
from workloads.data.moving.cache import (
    CacheReader,
    ReadPlan,
    StagerState,
    read_plan,
    working_set_bytes,
    write_stager_state,
)
from workloads.data.reading.dataset import DataUnavailableError, HDF5Dataset
from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.train.__main__ import main, parse_args
from workloads.train.loop import Reporter, train

SHARDS = ["shard-00000.h5", "shard-00001.h5"]


@pytest.fixture
def staging(tiny_data: dict[str, Path], tmp_path: Path) -> Path:
    dest = tmp_path / "dest"
    shutil.copytree(tiny_data["decoded"], dest)
    return dest


def test_reads_wait_until_the_stager_reports_the_shard_ready(staging: Path, tiny_data: dict[str, Path]) -> None:
    write_stager_state(staging, StagerState(ready=SHARDS[:1]))
    dataset = HDF5Dataset(staging)
    assert dataset.cache is not None
    published = threading.Event()

    def publish() -> None:
        published.set()  # set first: the reader cannot see the new state before this
        write_stager_state(staging, StagerState(ready=SHARDS))

    later = threading.Timer(0.3, publish)
    later.start()
    images, _ = dataset.__getitems__([20, 21])  # shard 1: not ready yet
    assert published.is_set()  # the read could only finish after the stager said the shard was ready
    expected, _ = HDF5Dataset(tiny_data["decoded"]).__getitems__([20, 21])
    assert torch.equal(images, expected)


def test_evicted_or_refetched_shards_are_closed_when_the_next_one_opens(staging: Path) -> None:
    write_stager_state(staging, StagerState(ready=SHARDS))
    dataset = HDF5Dataset(staging)
    dataset.__getitems__([0])
    assert list(dataset._open) == [0]
    write_stager_state(staging, StagerState(ready=SHARDS[1:]))  # the stager evicted shard 0
    dataset.__getitems__([20])
    assert list(dataset._open) == [1]  # shard 0's descriptors no longer pin its disk blocks
    fresh = staging / ".fresh"
    shutil.copyfile(staging / SHARDS[1], fresh)
    os.replace(fresh, staging / SHARDS[1])  # shard 1 evicted and fetched again: a new file under the same name
    write_stager_state(staging, StagerState(ready=SHARDS))
    dataset.__getitems__([0])
    assert list(dataset._open) == [0]  # the handle on shard 1's old file was closed too
    dataset.__getitems__([20])
    assert os.fstat(dataset._open[1].fd).st_ino == os.stat(staging / SHARDS[1]).st_ino


def test_a_failed_stager_or_a_timeout_is_a_named_error(staging: Path) -> None:
    """Data that is not there now is a runtime failure (DataUnavailableError: the trainer exits 1 and the Job
    retries), not a config error (DatasetError)."""
    write_stager_state(staging, StagerState(ready=[]))
    with pytest.raises(DataUnavailableError, match="shard-00000.h5: .*not staged after"):
        HDF5Dataset(staging, shard_wait_s=0.1).__getitems__([0])
    write_stager_state(staging, StagerState(ready=[], error="s3://b/p: access denied"))
    with pytest.raises(DataUnavailableError, match="stager failed: s3://b/p: access denied"):
        HDF5Dataset(staging).__getitems__([0])
    (staging / ".cache" / "stager.json").write_text('{"ready": "shard-00000.h5"}')
    with pytest.raises(DataUnavailableError, match="stager.json: ready: must be a list"):
        HDF5Dataset(staging, shard_wait_s=0.1).__getitems__([0])


def _train(args: list[str]) -> list[dict]:
    threads = torch.get_num_threads()
    stream = io.StringIO()
    torch.set_num_threads(1)
    try:
        train(
            parse_args(
                [
                    "--model",
                    "resnet18",
                    "--width",
                    "8",
                    "--batch-size",
                    "5",
                    "--crop-size",
                    "32",
                    "--workers",
                    "0",
                    *args,
                ]
            ),
            Reporter(0, stream),
        )
    finally:
        torch.set_num_threads(threads)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_training_tells_the_stager_what_comes_next_across_epochs(
    staging: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_stager_state(staging, StagerState(ready=SHARDS))
    plans: list[ReadPlan] = []
    real_write = CacheReader.write_plan

    def record(self: CacheReader, order: list[str], done: bool = False) -> None:
        plans.append(ReadPlan(order=list(order), done=done))
        real_write(self, order, done)

    monkeypatch.setattr(CacheReader, "write_plan", record)
    lines = _train(["--data", str(staging), "--epochs", "2", "--shuffle-shards", "1", "--seed", "3"])
    assert [line["samples"] for line in lines if line["event"] == "epoch"] == [42, 42]  # two epochs over a cache
    sampler = ElasticBatchSampler([17, 25], 5, seed=3, shuffle_shards=1)
    epoch0 = [SHARDS[s] for s in sampler.node_shards()[0]]
    sampler.set_epoch(1)
    epoch1 = [SHARDS[s] for s in sampler.node_shards()[0]]
    assert len(epoch0) == len(epoch1) == 2  # shuffle_shards 1: one shard after the other
    # This epoch's shards in reading order; once the first is done, the next epoch's order follows the second.
    expected = [epoch0, [epoch0[1], epoch0[0]], epoch1, [epoch1[1]], []]
    unique = [order for number, order in enumerate(expected) if number == 0 or order != expected[number - 1]]
    assert [plan.order for plan in plans[:-1]] == unique
    assert plans[-1] == ReadPlan(order=[], done=True) == read_plan(staging)
    assert np.isfinite([line["loss"] for line in lines if line["event"] == "batch"]).all()


def test_trains_several_epochs_through_the_real_stager_on_a_budget_below_the_dataset(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stager (workloads.data.moving.stage) against a moto S3 server, with a budget of three of the dataset's seven
    shards: every epoch it must evict shards training is done with and fetch the next ones in the epoch's order."""
    from workloads.data.moving.s3 import S3Uri, make_client
    from workloads.data.moving.stage import StageOptions, stage
    from workloads.data.writing.pack import PackOptions, pack

    credentials = {"AWS_ACCESS_KEY_ID": "t", "AWS_SECRET_ACCESS_KEY": "t", "AWS_DEFAULT_REGION": "us-east-1"}
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    packed = tmp_path / "packed"
    pack(tiny_data["folder"], packed, PackOptions(image_size=32, shard_bytes=20_000, workers=1, progress=False))
    shards = sorted(packed.glob("shard-*.h5"))
    assert len(shards) >= 6
    budget = 3 * max(path.stat().st_size for path in shards)
    dest = tmp_path / "dest"
    with moto_server() as url:
        client = make_client(url, 4)
        client.create_bucket(Bucket="train-cache")
        for path in sorted(packed.iterdir()):
            client.put_object(Bucket="train-cache", Key=f"ds/{path.name}", Body=path.read_bytes())
        options = StageOptions(workers=2, part_bytes=1 << 20, budget_bytes=budget, progress=False)
        failures: list[BaseException] = []
        results = []

        def run_stager() -> None:
            try:
                results.append(stage(client, S3Uri("train-cache", "ds"), dest, options))
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        stager = threading.Thread(target=run_stager, daemon=True)
        stager.start()
        lines = _train(["--data", str(dest), "--wait-for-data", "30", "--epochs", "3", "--shuffle-shards", "1"])
        stager.join(60)
        assert not stager.is_alive() and not failures, failures
    epochs = [line for line in lines if line["event"] == "epoch"]
    assert [epoch["samples"] for epoch in epochs] == [42, 42, 42]
    assert read_plan(dest) == ReadPlan(order=[], done=True)
    (result,) = results
    assert result.peak_held_bytes <= budget
    assert len(result.fetched) > len(shards)  # shards were evicted and fetched again in later epochs


def test_working_set_is_the_most_bytes_in_use_at_once() -> None:
    sizes = [10, 20, 40, 80]
    # shard 0 in batches 0-2, shard 1 in 1-1, shard 2 in 2-5, shard 3 in 3-4: at batch 2, shards 0 and 2 (50);
    # at batches 3-4 shards 2 and 3 (120)
    assert working_set_bytes(sizes, [0, 1, 2, 3], [0, 1, 2, 3], [2, 1, 5, 4]) == 120
    assert working_set_bytes(sizes, [0, 1], [0, 1], [0, 1]) == 20  # one after the other
    assert working_set_bytes(sizes, [], [], []) == 0


def test_a_cache_too_small_for_the_shuffle_span_is_a_config_error(
    staging: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    largest = max((staging / name).stat().st_size for name in SHARDS)
    write_stager_state(staging, StagerState(budget=largest, ready=SHARDS))
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", "42")
    code = main(["--data", str(staging), "--model", "resnet18", "--width", "8", "--batch-size", "5",
                 "--crop-size", "32", "--workers", "0", "--shuffle-shards", "2"])
    err = capsys.readouterr().err
    assert code == 42
    assert err.startswith("error: --shuffle-shards: this node reads shards worth ") and err.count("\n") == 1
    assert f"holds {largest} bytes" in err
    # A batch on the seam between two shards needs both: two shards' worth is the least a cache can hold.
    write_stager_state(staging, StagerState(budget=2 * largest, ready=SHARDS))
    lines = _train(["--data", str(staging), "--shuffle-shards", "1"])
    assert [line["samples"] for line in lines if line["event"] == "epoch"] == [42]
