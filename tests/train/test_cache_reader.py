"""Reading a directory that a staging cache fills and evicts while training runs (see workloads/data/cache.py)."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads.data.cache import CacheReader, Plan, StagerState, read_plan, write_stager_state
from workloads.data.dataset import DatasetError, HDF5Dataset
from workloads.data.sampler import ElasticBatchSampler
from workloads.train.__main__ import parse_args
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
    write_stager_state(staging, StagerState(ready=[]))
    with pytest.raises(DatasetError, match="shard-00000.h5: .*not staged after"):
        HDF5Dataset(staging, shard_wait_s=0.1).__getitems__([0])
    write_stager_state(staging, StagerState(ready=[], error="s3://b/p: access denied"))
    with pytest.raises(DatasetError, match="stager failed: s3://b/p: access denied"):
        HDF5Dataset(staging).__getitems__([0])
    (staging / ".cache" / "stager.json").write_text('{"ready": "shard-00000.h5"}')
    with pytest.raises(DatasetError, match="stager.json: ready: must be a list"):
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
    plans: list[Plan] = []
    real_write = CacheReader.write_plan

    def record(self: CacheReader, order: list[str], done: bool = False) -> None:
        plans.append(Plan(order=list(order), done=done))
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
    assert plans[-1] == Plan(order=[], done=True) == read_plan(staging)
    assert np.isfinite([line["loss"] for line in lines if line["event"] == "batch"]).all()


def test_trains_several_epochs_through_the_real_stager_with_a_one_shard_budget(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stager (workloads.data.stage) against a moto S3 server, with a budget that holds one shard only: it
    can fetch the next shard only after training is past the last use of the one it holds, every epoch."""
    from moto.server import ThreadedMotoServer

    from workloads.data.s3 import S3Uri, make_client
    from workloads.data.stage import StageOptions, stage

    for name, value in {
        "AWS_ACCESS_KEY_ID": "t",
        "AWS_SECRET_ACCESS_KEY": "t",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        client = make_client(f"http://127.0.0.1:{port}", 4)
        client.create_bucket(Bucket="train-cache")
        for path in sorted(tiny_data["decoded"].iterdir()):
            client.put_object(Bucket="train-cache", Key=f"ds/{path.name}", Body=path.read_bytes())
        dest = tmp_path / "dest"
        largest = max(path.stat().st_size for path in tiny_data["decoded"].glob("shard-*.h5"))
        options = StageOptions(workers=2, part_bytes=1 << 20, budget_bytes=largest, progress=False)
        failures: list[BaseException] = []

        def run_stager() -> None:
            try:
                stage(client, S3Uri("train-cache", "ds"), dest, options)
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        stager = threading.Thread(target=run_stager, daemon=True)
        stager.start()
        lines = _train(["--data", str(dest), "--wait-for-data", "30", "--epochs", "3", "--shuffle-shards", "1"])
        stager.join(60)
        assert not stager.is_alive() and not failures, failures
    finally:
        server.stop()
    epochs = [line for line in lines if line["event"] == "epoch"]
    assert [epoch["samples"] for epoch in epochs] == [42, 42, 42]
    assert read_plan(dest) == Plan(order=[], done=True)
