"""examples/train_fsdp.py under torchrun on CPU/gloo: FSDP2 on packed token sequences, stopped with a sharded
checkpoint on 2 ranks, resumed on 3 ranks of new "nodes" (empty local tiers) from the shared remote tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.moto_server import free_port
from workloads.data.writing.records_pack import RecordPackOptions
from workloads.data.writing.tokens import pack_tokens

REPO = Path(__file__).resolve().parents[2]


def _torchrun(ranks: int, args: list[str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-addr",
         "127.0.0.1", "--master-port", str(free_port()), str(REPO / "examples" / "train_fsdp.py"), *args],
        capture_output=True, text=True, cwd=REPO, timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "ML_CLUSTER_SHM_BYTES": str(1 << 30)})
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_fsdp_example_stops_with_a_sharded_checkpoint_and_resumes_on_another_world_size(tmp_path: Path) -> None:
    src = tmp_path / "corpus"
    src.mkdir()
    rng = np.random.default_rng(1)
    for doc in range(16):
        start = int(rng.integers(1, 40))
        np.save(src / f"doc{doc:02d}.npy", (np.arange(start, start + 30) % 60 + 1).astype(np.int32))
    data = tmp_path / "packed"
    pack_tokens(src, data, RecordPackOptions(shard_bytes=1 << 10, progress=False), seq_len=17, eos=0)
    common = ["--data", str(data), "--vocab-size", "64", "--dim", "32", "--layers", "2", "--epochs", "2",
              "--global-batch-size", "6", "--checkpoint-uri", str(tmp_path / "efs"), "--checkpoint-every", "2"]
    first = _torchrun(2, [*common, "--checkpoint-dir", str(tmp_path / "node-a"), "--max-steps", "3"])
    events = [json.loads(line) for line in first.stdout.splitlines()]
    assert events[-1] == {"event": "stopped", "step": 3, "complete": True}
    resumed = _torchrun(3, [*common, "--checkpoint-dir", str(tmp_path / "node-b")])
    assert "checkpoint: resumed from step 3 (2 ranks then, 3 now)" in resumed.stderr
    events = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert [event["epoch"] for event in events if event["event"] == "epoch"] == [0, 1]
    assert events[-1]["event"] == "done" and events[-1]["complete"]
    final = f"step-{events[-1]['step']:09d}"  # the last save, on both tiers (node-b started empty: step 3 came
    assert (tmp_path / "node-b" / final / "checkpoint.json").exists()  # from the remote tier)
    assert (tmp_path / "efs" / final / "checkpoint.json").exists()


def _one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                 args: list[str]) -> list[dict]:
    """The example in this process, one rank (no torchrun), on 10 sequences of 17 tokens, 2 a step: its events."""
    import runpy

    src = tmp_path / "corpus"
    src.mkdir()
    for doc in range(6):
        np.save(src / f"doc{doc}.npy", (np.arange(doc, doc + 30) % 60 + 1).astype(np.int32))
    data = tmp_path / "packed"
    pack_tokens(src, data, RecordPackOptions(shard_bytes=1 << 10, progress=False), seq_len=17, eos=0)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "METRICS_PORT", "COLLECTIVE_TIMEOUT_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["train_fsdp.py", "--data", str(data), "--vocab-size", "64", "--dim", "16",
                                      "--layers", "1", "--heads", "2", "--global-batch-size", "2", "--epochs", "1",
                                      "--checkpoint-dir", str(tmp_path / "ckpt"), *args])
    example = runpy.run_path(str(REPO / "examples" / "train_fsdp.py"), run_name="train_fsdp")
    assert example["main"]() == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def test_fsdp_example_reports_its_steps_and_saves_for_measured_goodput(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One process, in this one (no torchrun): the step events measured goodput reads (benchmarks/chaos_goodput.py:
    "batch" with data and compute time, "checkpoint" with the loop's stall), a skip no "checkpoint" event."""
    events = _one_process(tmp_path, monkeypatch, capsys, ["--checkpoint-every", "2", "--max-steps", "4"])
    batches = [event for event in events if event["event"] == "batch"]
    assert [event["step"] for event in batches] == [1, 2, 3, 4]
    assert all(event["data_time"] >= 0 and event["compute_time"] > 0 and event["samples"] == 2 for event in batches)
    saves = [event for event in events if event["event"] == "checkpoint"]
    skipped = [event["step"] for event in events if event["event"] == "checkpoint_skipped"]
    assert sorted([event["step"] for event in saves] + skipped) == [2, 4]  # every 2 steps; step 4 is the stop's
    assert 4 in [event["step"] for event in saves] and all(event["stall_seconds"] >= 0 for event in saves)
    assert events[-1] == {"event": "stopped", "step": 4, "complete": True}


def test_fsdp_example_saves_a_last_step_that_was_a_checkpoint_step_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The run's last step (5: 10 sequences, 2 a step) is also a --checkpoint-every step: its periodic save is the
    run's last checkpoint, waited for at the end, not followed by a second save of the same step."""
    events = _one_process(tmp_path, monkeypatch, capsys, ["--checkpoint-every", "5"])
    assert [event["step"] for event in events if event["event"] == "batch"] == [1, 2, 3, 4, 5]
    assert [event["step"] for event in events if event["event"] == "checkpoint"] == [5]
    # its background write, once over: the in-flight time the goodput model charges a failure with
    (written,) = [event for event in events if event["event"] == "checkpoint_written"]
    assert written["step"] == 5 and written["write_seconds"] > 0 and written["mirror_seconds"] is None
    assert events[-1] == {"event": "done", "step": 5, "complete": True}
    assert [path.name for path in (tmp_path / "ckpt").iterdir() if path.name.startswith("step-")] == [
        "step-000000005"]
    assert (tmp_path / "ckpt" / "step-000000005" / "checkpoint.json").exists()


def test_fsdp_example_saves_its_last_step_at_the_end_when_no_periodic_save_had_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    events = _one_process(tmp_path, monkeypatch, capsys, ["--checkpoint-every", "4"])
    saves = [event["step"] for event in events if event["event"] == "checkpoint"]
    skipped = [event["step"] for event in events if event["event"] == "checkpoint_skipped"]
    assert saves[-1] == 5 and sorted(saves + skipped) == [4, 5]  # step 4's save (or its skip), then the end's
    assert [event["step"] for event in events if event["event"] == "checkpoint_written"] == saves  # each, once
    assert events[-1] == {"event": "done", "step": 5, "complete": True}
