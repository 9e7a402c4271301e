"""The training CLI end to end on CPU: a smoke epoch, kill-and-resume equality, the small-/dev/shm path, DDP."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workloads.data.reading.shm import SHM_BYTES_ENV, plan_shared_memory
from workloads.train.__main__ import main, parse_args
from workloads.train.checkpointer import latest_checkpoint
from workloads.train.loop import Reporter, train

REPO = Path(__file__).resolve().parents[2]
TINY_RUN = [
    "--model",
    "resnet18",
    "--width",
    "8",
    "--batch-size",
    "8",
    "--crop-size",
    "32",
    "--lr",
    "0.01",
    "--log-every",
    "1",
]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}
    env.pop(SHM_BYTES_ENV, None)
    env.update(extra)
    return env


def _train(args: list[str], *, env: dict[str, str] | None = None, expect: int = 0) -> list[dict]:
    result = subprocess.run(
        [sys.executable, "-m", "workloads.train", *TINY_RUN, *args],
        capture_output=True,
        text=True,
        env=env or _env(),
        cwd=REPO,
        timeout=240,
    )
    assert result.returncode == expect, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def _events(lines: list[dict], name: str) -> list[dict]:
    return [line for line in lines if line["event"] == name]


@pytest.mark.slow  # a whole epoch; test_shm_plan_keeps_shared_memory_when_it_fits keeps the shm decision in make test
def test_one_epoch_smoke_with_a_too_small_shm(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    """One CPU epoch on encoded shards with 2 workers, /dev/shm simulated at 64 KiB: the study's timings come
    out as JSON lines, the loader switches to the pipe transport, and the epoch-end checkpoint lands."""
    lines = _train(
        [
            "--data",
            str(tiny_data["encoded"] / "manifest.json"),
            "--image-size",
            "32",
            "--epochs",
            "1",
            "--workers",
            "2",
            "--checkpoint-dir",
            str(tmp_path),
        ],
        env=_env(**{SHM_BYTES_ENV: str(64 * 1024)}),
    )
    (check,) = _events(lines, "shm_check")
    assert check["transport"] == "pipe" and check["available_bytes"] == 64 * 1024
    assert check["needed_bytes"] > check["available_bytes"]
    assert _events(lines, "model_loading")[0]["seconds"] > 0
    assert _events(lines, "data_preparation")[0]["samples"] == 42
    (epoch,) = _events(lines, "epoch")
    assert epoch["samples"] == 42 and epoch["batches"] == 6
    assert epoch["epoch_time"] >= epoch["data_time"] + epoch["compute_time"] > 0
    assert epoch["throughput"] > 0 and epoch["gpu_utilization"] is None
    batches = _events(lines, "batch")
    assert len(batches) == 6 and all(b["data_time"] >= 0 and b["compute_time"] > 0 for b in batches)
    state = latest_checkpoint(tmp_path)
    assert state is not None and (state["epoch"], state["batch"], state["step"]) == (1, 0, 6)
    assert not list(tmp_path.rglob(".*tmp"))  # no temp files left behind
    assert [path.name for path in tmp_path.iterdir()] == ["step-000000006"]  # sharded: one folder per checkpoint
    (saved,) = _events(lines, "checkpoint")
    assert saved["complete"] is True
    # the loop's whole blocked time (measured goodput's checkpoint bucket) covers the staging stall
    assert saved["blocked_seconds"] >= saved["stall_seconds"] >= 0


def test_shm_plan_keeps_shared_memory_when_it_fits() -> None:
    batch = 256 * 224 * 224 * 3
    assert plan_shared_memory(batch, workers=8, prefetch_factor=2, available_bytes=8 << 30).transport == "shm"
    small = plan_shared_memory(batch, workers=8, prefetch_factor=2, available_bytes=64 << 20)
    assert small.transport == "pipe" and "64 MiB" in small.message
    assert plan_shared_memory(batch, workers=0, prefetch_factor=2, available_bytes=0).transport == "shm"


def _train_here(args: list[str]) -> list[dict]:
    """Run in this process (single-threaded, as the subprocess runs) and collect the JSON lines."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    stream = io.StringIO()
    torch.set_num_threads(1)
    try:
        train(parse_args([*TINY_RUN, *args]), Reporter(0, stream))
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_killed_then_resumed_run_matches_an_uninterrupted_one(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    common = [
        "--data",
        str(tiny_data["decoded"]),
        "--epochs",
        "2",
        "--workers",
        "0",
        "--deterministic",
        "--checkpoint-every",
        "4",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _train_here([*common, "--checkpoint-dir", str(straight)])
    # SIGKILL at step 9 (batch 3 of epoch 1). The last save started before it is step 8 (batch 2 of epoch 1); it is
    # written in the background, so the kill may land before its manifest: then the epoch-end step 6 is the last
    # complete one. The epoch-end save waited for step 4's; step 8's is skipped when step 6's is still in flight
    # then, and when step 6's is still in flight at the kill too, step 4 is the last complete one.
    killed = _train([*common, "--checkpoint-dir", str(resumed), "--stop-after-steps", "9"], expect=-9)
    assert _events(killed, "killing_self")[0]["step"] == 9
    interrupted = latest_checkpoint(resumed)
    assert interrupted is not None
    position = (interrupted["epoch"], interrupted["batch"], interrupted["step"])
    assert position in ((1, 2, 8), (1, 0, 6), (0, 4, 4)), position
    again = _train_here([*common, "--checkpoint-dir", str(resumed), "--resume"])
    assert _events(again, "resumed")[0] == {"event": "resumed", "epoch": position[0], "batch": position[1],
                                            "step": position[2]}
    expected, actual = latest_checkpoint(straight), latest_checkpoint(resumed)
    assert expected is not None and actual is not None and actual["step"] == expected["step"] == 12
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name
    for key, moments in expected["optimizer"]["state"].items():
        assert torch.equal(moments["momentum_buffer"], actual["optimizer"]["state"][key]["momentum_buffer"])
    # and the interrupted state really differed from the final one
    assert not torch.equal(interrupted["model"]["fc.weight"], expected["model"]["fc.weight"])


def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "missing" in err and err.count("\n") == 1
    assert main(["--data", str(tmp_path), "--resume"]) == 2
    assert "error: --resume: needs --checkpoint-dir" in capsys.readouterr().err


def test_config_errors_use_the_jobs_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", "42")
    assert main(["--data", str(tmp_path / "missing")]) == 42
    with pytest.raises(SystemExit) as exited:
        main(["--data", str(tmp_path), "--batch-size", "0"])
    assert exited.value.code == 42
    assert "error: argument --batch-size: must be positive" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None, reason="no torchrun")
def test_torchrun_two_ranks_on_cpu(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    result = subprocess.run(
        [
            torchrun,
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(_free_port()),
            "-m",
            "workloads.train",
            *TINY_RUN,
            "--data",
            str(tiny_data["decoded"]),
            "--epochs",
            "1",
            "--workers",
            "1",
            "--checkpoint-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=REPO,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert _events(lines, "config")[0]["world_size"] == 2
    (epoch,) = _events(lines, "epoch")  # rank 0 reports; the count covers both ranks
    assert epoch["samples"] == 2 * 21 and epoch["batches"] == 3
    assert latest_checkpoint(tmp_path)["world_size"] == 2


def test_the_cpu_preset_sizes_the_run_for_a_laptop_and_flags_still_win() -> None:
    """`--preset cpu`: ResNet-18 with a narrow stem at 64 px in small batches (the GPU-sized defaults take minutes
    per epoch of a few hundred images on a laptop); a flag given beside it overrides the preset's value."""
    config = parse_args(["--data", "d", "--preset", "cpu"])
    assert (config.model, config.width, config.crop_size, config.batch_size) == ("resnet18", 16, 64, 32)
    config = parse_args(["--data", "d", "--batch-size", "8", "--preset", "cpu"])
    assert (config.model, config.batch_size) == ("resnet18", 8)
    assert parse_args(["--data", "d"]).model == "resnet50"  # no preset: the defaults as they were
