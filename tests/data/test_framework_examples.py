"""examples/train_lightning.py and examples/train_accelerate.py on CPU against moto S3, through the staging cache.

Both frameworks are pinned in the project's `examples` extra, which `make setup` installs: the tests never skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.data.moving.cache import ReadPlan, read_plan
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import UploadOptions, upload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"lightning": ROOT / "examples" / "train_lightning.py",
            "accelerate": ROOT / "examples" / "train_accelerate.py"}


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(EXAMPLES))
def test_framework_example_trains_through_the_staging_cache_and_resumes(
    framework: str, packed: Path, s3_url: str, bucket: str, tmp_path: Path
) -> None:
    upload(make_client(s3_url, 2, botocore_attempts=3), packed, S3Uri(bucket, "sets/small"),
           UploadOptions(workers=2, progress=False))
    dest, checkpoints = tmp_path / "cache", tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ML_CLUSTER_SHM_BYTES": str(1 << 30)}

    def run(epochs: int) -> list[dict[str, object]]:
        result = subprocess.run(
            [sys.executable, str(EXAMPLES[framework]), "--data", str(dest), "--remote", f"s3://{bucket}/sets/small",
             "--endpoint-url", s3_url, "--budget", "1MiB", "--epochs", str(epochs), "--batch-size", "8",
             "--workers", "0", "--checkpoint-dir", str(checkpoints)],
            capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        print(result.stdout)
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]

    lines = run(2)
    samples = json.loads((packed / "manifest.json").read_text())
    total = sum(shard["num_samples"] for shard in samples["shards"])
    epochs = [line for line in lines if "epoch" in line and "event" not in line]
    assert [(line["epoch"], line["samples"]) for line in epochs] == [(0, total), (1, total)]
    _assert_steps_reported(lines, epochs[-1]["steps"], epoch_ends=[epochs[0]["steps"], epochs[1]["steps"]])
    assert [line for line in lines if "stager" in line], "the example started the stager and reported it"
    assert read_plan(dest) == ReadPlan(order=[], done=True)  # told the stager that reading is done
    assert any(checkpoints.iterdir())
    # A rerun for one epoch more resumes from the checkpoint: only the third epoch is trained.
    again = run(3)
    assert [line["epoch"] for line in again if "epoch" in line and "event" not in line] == [2]
    steps = [line["step"] for line in again if line.get("event") == "batch"]
    assert steps == list(range(epochs[-1]["steps"] + 1, epochs[-1]["steps"] + 1 + len(steps)))  # continued


def _assert_steps_reported(lines: list[dict], last_step: int, epoch_ends: list[int], every: int = 0) -> None:
    """The step events measured goodput reads (StepReport): one "batch" per optimizer step 1..last_step with its
    data and compute time, and a "checkpoint" with its stall for each save: every `every` steps and each epoch's
    end, each step saved once."""
    batches = [line for line in lines if line.get("event") == "batch"]
    assert [line["step"] for line in batches] == list(range(1, last_step + 1))
    assert all(line["data_time"] >= 0 and line["compute_time"] > 0 and line["samples"] > 0 for line in batches)
    saves = [line for line in lines if line.get("event") == "checkpoint"]
    assert all(line["stall_seconds"] >= 0 for line in saves)
    periodic = [step for step in range(1, last_step + 1) if every and step % every == 0]
    assert [line["step"] for line in saves] == sorted(set(periodic + epoch_ends))


def test_accelerate_example_reports_its_steps_and_saves_for_measured_goodput(
        packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """In this process (a subprocess spends its time importing torch), one process: the events of every step and
    save, as the bundled trainer's. (Lightning's callback is read the same way by the slow test above.)"""
    import runpy

    import torch
    from accelerate.state import AcceleratorState

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ML_CLUSTER_SHM_BYTES", str(1 << 30))
    # 24 samples, 4 a step: the epoch ends on a --checkpoint-every step (6), which is saved once
    monkeypatch.setattr(sys, "argv", ["train_accelerate.py", "--data", str(packed), "--epochs", "1", "--batch-size",
                                      "4", "--workers", "0", "--checkpoint-dir", str(tmp_path / "ckpt"),
                                      "--checkpoint-every", "3"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    capsys.readouterr()
    try:
        runpy.run_path(str(EXAMPLES["accelerate"]), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
        AcceleratorState._reset_state(reset_partial_state=True)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    (epoch,) = [line for line in lines if "epoch" in line and "event" not in line]
    assert epoch["steps"] == 6
    _assert_steps_reported(lines, epoch["steps"], epoch_ends=[epoch["steps"]], every=3)
    assert lines[0]["event"] == "first_step"
