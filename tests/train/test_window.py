"""Reading a directory that a rolling-window stager is still filling (see workloads/data/window.py)."""

from __future__ import annotations

import io
import json
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads.data.dataset import DatasetError, HDF5Dataset
from workloads.data.format import READER_STATE, WINDOW_DIR
from workloads.data.window import StagerState, WindowReader, write_stager_state
from workloads.train.__main__ import parse_args
from workloads.train.loop import Reporter, train

SHARDS = ["shard-00000.h5", "shard-00001.h5"]


@pytest.fixture
def staging(tiny_data: dict[str, Path], tmp_path: Path) -> Path:
    dest = tmp_path / "dest"
    shutil.copytree(tiny_data["decoded"], dest)
    return dest


def test_reads_wait_until_the_stager_reports_the_shard_ready(staging: Path, tiny_data: dict[str, Path]) -> None:
    write_stager_state(staging, StagerState(order=SHARDS, ready=SHARDS[:1]))
    dataset = HDF5Dataset(staging)
    assert dataset.window is not None
    published = threading.Event()

    def publish() -> None:
        published.set()  # set first: the reader cannot see the new state before this
        write_stager_state(staging, StagerState(order=SHARDS, ready=SHARDS))

    later = threading.Timer(0.3, publish)
    later.start()
    images, _ = dataset.__getitems__([20, 21])  # shard 1: not ready yet
    assert published.is_set()  # the read could only finish after the stager said the shard was ready
    expected, _ = HDF5Dataset(tiny_data["decoded"]).__getitems__([20, 21])
    assert torch.equal(images, expected)


def test_released_shards_are_closed_when_the_next_one_opens(staging: Path) -> None:
    write_stager_state(staging, StagerState(order=SHARDS, ready=SHARDS))
    dataset = HDF5Dataset(staging)
    dataset.__getitems__([0])
    assert list(dataset._open) == [0]
    WindowReader(staging).mark_consumed(SHARDS[0])
    dataset.__getitems__([20])
    assert list(dataset._open) == [1]  # shard 0's descriptors no longer pin its disk blocks


def test_a_failed_stager_or_a_timeout_is_a_named_error(staging: Path) -> None:
    write_stager_state(staging, StagerState(order=SHARDS, ready=[]))
    with pytest.raises(DatasetError, match="shard-00000.h5: .*not staged after"):
        HDF5Dataset(staging, shard_wait_s=0.1).__getitems__([0])
    write_stager_state(staging, StagerState(order=SHARDS, ready=[], error="s3://b/p: access denied"))
    with pytest.raises(DatasetError, match="stager failed: s3://b/p: access denied"):
        HDF5Dataset(staging).__getitems__([0])


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


def test_training_releases_each_window_once_it_is_read(staging: Path) -> None:
    write_stager_state(staging, StagerState(order=SHARDS, ready=SHARDS, done=True))
    lines = _train(["--data", str(staging), "--epochs", "1", "--window-shards", "1", "--log-every", "1"])
    released = [line for line in lines if line["event"] == "window_released"]
    assert [line["shards"] for line in released] == [[SHARDS[0]], [SHARDS[1]]]
    batches = [line["batch"] for line in lines if line["event"] == "batch"]
    assert len(batches) == 4 + 5  # 17 samples -> 4 batches of 5, 25 -> 5: batches never span two windows
    events = [(line["event"], line.get("batch"), line.get("window")) for line in lines]
    # window 0 is released right after its last batch (batch 3), before window 1's first batch is trained on
    assert events.index(("window_released", None, 0)) == events.index(("batch", 3, None)) + 1
    consumed = json.loads((staging / WINDOW_DIR / READER_STATE).read_text())["consumed"]
    assert consumed == SHARDS
    assert np.isfinite([line["loss"] for line in lines if line["event"] == "batch"]).all()


def test_several_epochs_over_a_rolling_window_are_refused(staging: Path) -> None:
    write_stager_state(staging, StagerState(order=SHARDS, ready=SHARDS))
    with pytest.raises(ValueError, match="--epochs: .*read once"):
        _train(["--data", str(staging), "--epochs", "2"])


def test_trains_through_the_real_stager_with_a_one_shard_window(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stager (workloads.data.stage) against a moto S3 server, with a window that holds one shard only:
    it can fetch the second shard only after training has released the first."""
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
        client.create_bucket(Bucket="train-window")
        for path in sorted(tiny_data["decoded"].iterdir()):
            client.put_object(Bucket="train-window", Key=f"ds/{path.name}", Body=path.read_bytes())
        dest = tmp_path / "dest"
        largest = max(path.stat().st_size for path in tiny_data["decoded"].glob("shard-*.h5"))
        options = StageOptions(workers=2, part_bytes=1 << 20, window_bytes=largest, progress=False)
        failures: list[BaseException] = []

        def run_stager() -> None:
            try:
                stage(client, S3Uri("train-window", "ds"), dest, options)
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        stager = threading.Thread(target=run_stager, daemon=True)
        stager.start()
        lines = _train(["--data", str(dest), "--wait-for-data", "30", "--epochs", "1", "--window-shards", "1"])
        stager.join(60)
        assert not stager.is_alive() and not failures, failures
    finally:
        server.stop()
    (epoch,) = [line for line in lines if line["event"] == "epoch"]
    assert epoch["samples"] == 42 and epoch["batches"] == 9
    released = [line["shards"] for line in lines if line["event"] == "window_released"]
    assert released == [[SHARDS[0]], [SHARDS[1]]]
