"""Checkpoints in an object store (the remote tier): a pod rescheduled onto a fresh node resumes from it; an older
trainer's mirrored last.pt still resumes, verified by its sha256 metadata."""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.moto_server import moto_server
from tests.train.legacy import legacy_state, write_last_pt
from tests.train.test_train import _events, _train_here
from workloads.data.moving.s3 import make_client
from workloads.train.checkpoint import CHECKPOINT_NAME, CheckpointMirror
from workloads.train.checkpointer import latest_checkpoint


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


@pytest.fixture
def bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL_S3": s3_endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    name = "ckpt-" + request.node.name.replace("_", "-").lower()[:40].strip("-")
    make_client(s3_endpoint, 2).create_bucket(Bucket=name)
    return name


def test_pull_reports_a_missing_mirror(bucket: str, tmp_path: Path) -> None:
    assert CheckpointMirror(f"s3://{bucket}/none").pull(tmp_path) is False
    assert list(tmp_path.iterdir()) == []


def test_a_run_on_a_new_node_resumes_from_the_remote_tier(tiny_data: dict[str, Path], s3_endpoint: str, bucket: str,
                                                           tmp_path: Path) -> None:
    uri = f"s3://{bucket}/runs/resnet18"
    common = ["--data", str(tiny_data["decoded"]), "--workers", "0", "--deterministic", "--checkpoint-uri", uri]
    first = _train_here([*common, "--epochs", "1", "--checkpoint-dir", str(tmp_path / "node-a"), "--resume"])
    saved = _events(first, "checkpoint")[-1]
    assert saved["uploaded"] == uri and saved["complete"] and saved["mirror_seconds"] >= 0
    folder = f"step-{saved['step']:09d}"
    keys = {entry["Key"] for entry in make_client(s3_endpoint, 2).list_objects_v2(Bucket=bucket)["Contents"]}
    local = {path.name for path in (tmp_path / "node-a" / folder).iterdir()}
    assert keys == {f"runs/resnet18/{folder}/{name}" for name in local}  # every file and the manifest

    # The pod lands on another node: its local directory is empty, the remote tier holds epoch 1's checkpoint.
    second = _train_here([*common, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "node-b"), "--resume"])
    assert _events(second, "resumed")[0] == {"event": "resumed", "epoch": 1, "batch": 0, "step": saved["step"]}
    downloaded = tmp_path / "node-b" / folder  # fetched and verified before it was loaded
    assert {path.name for path in downloaded.iterdir()} == local
    for name in local:
        assert (downloaded / name).read_bytes() == (tmp_path / "node-a" / folder / name).read_bytes(), name
    final = latest_checkpoint(tmp_path / "node-b")
    assert final is not None and final["epoch"] == 2


def _mirrored(tiny_data: dict[str, Path], s3_endpoint: str, bucket: str, tmp_path: Path) -> tuple[str, list[str]]:
    """An older trainer's last.pt in the bucket (with its sha256 metadata, as that trainer uploaded it), and the
    arguments of a run on a new node that resumes from it."""
    uri = f"s3://{bucket}/runs/r"
    common = ["--data", str(tiny_data["decoded"]), "--workers", "0", "--checkpoint-uri", uri]
    run = tmp_path / "run"
    _train_here(["--data", str(tiny_data["decoded"]), "--workers", "0", "--epochs", "1", "--checkpoint-dir",
                 str(run)])
    target = write_last_pt(tmp_path / "legacy", legacy_state(run))
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    make_client(s3_endpoint, 2).put_object(Bucket=bucket, Key="runs/r/" + CHECKPOINT_NAME, Body=target.read_bytes(),
                                           Metadata={"sha256": digest})
    return uri, [*common, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "node-b"), "--resume"]


def test_an_older_trainers_mirrored_last_pt_resumes_and_the_next_save_is_sharded(
    tiny_data: dict[str, Path], s3_endpoint: str, bucket: str, tmp_path: Path
) -> None:
    _, resume = _mirrored(tiny_data, s3_endpoint, bucket, tmp_path)
    lines = _train_here(resume)
    assert _events(lines, "resumed")[0] == {"event": "resumed", "epoch": 1, "batch": 0, "step": 6}
    assert _events(lines, "checkpoint")[-1]["complete"]
    final = latest_checkpoint(tmp_path / "node-b")
    assert final is not None and final["step"] == 12


def _cli(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    from tests.train.test_train import TINY_RUN
    from workloads.train.__main__ import main

    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", "42")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return main([*TINY_RUN, *args])
    finally:
        torch.set_num_threads(threads)


def _flip_a_byte(body: bytes, metadata: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    flipped = bytearray(body)
    flipped[len(flipped) // 2] ^= 0x01
    return bytes(flipped), metadata


def _drop_the_digest(body: bytes, metadata: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return body, {}  # no sha256 metadata


@pytest.mark.parametrize("tamper", [_flip_a_byte, _drop_the_digest])
def test_a_tampered_mirror_object_is_refused(
    tiny_data: dict[str, Path], s3_endpoint: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tamper: Callable[[bytes, dict[str, str]], tuple[bytes, dict[str, str]]],
) -> None:
    uri, resume = _mirrored(tiny_data, s3_endpoint, bucket, tmp_path)
    client = make_client(s3_endpoint, 2)
    key = "runs/r/" + CHECKPOINT_NAME
    got = client.get_object(Bucket=bucket, Key=key)
    body, metadata = tamper(got["Body"].read(), got.get("Metadata", {}))
    client.put_object(Bucket=bucket, Key=key, Body=body, Metadata=metadata)
    assert _cli(resume, monkeypatch) == 42
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("error: ") and "sha256" in err and uri in err
    assert not (tmp_path / "node-b" / CHECKPOINT_NAME).exists()


def test_an_unreachable_mirror_fails_before_training(
    tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: the run trained, then the upload failed after botocore's retries, with a traceback."""

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    for name, value in {"AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{closed}", "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    code = _cli(["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0",
                 "--checkpoint-uri", "s3://nowhere/runs", "--checkpoint-dir", str(tmp_path)], monkeypatch)
    out, err = capsys.readouterr()
    assert code == 1 and err.startswith("error: --checkpoint-uri: s3://nowhere/runs: ") and err.count("\n") == 1
    assert "unreachable" in err and '"event": "config"' not in out


def test_a_missing_bucket_is_a_config_error_before_training(
    tiny_data: dict[str, Path], s3_endpoint: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0",
            "--checkpoint-uri", f"s3://{bucket}-absent/runs", "--checkpoint-dir", str(tmp_path)]
    assert _cli(args, monkeypatch) == 42
    out, err = capsys.readouterr()
    assert err.startswith(f"error: --checkpoint-uri: s3://{bucket}-absent") and err.count("\n") == 1
    assert '"event": "config"' not in out
    assert not list(tmp_path.iterdir())
