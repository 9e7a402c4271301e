"""scripts/gpu_evidence.py: the lent GPU's one run. The harness here (a step's deadline kills its whole process group,
the summary names every step even when one fails), and its dry rehearsal end to end (slow)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def evidence(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(sys, "path", list(sys.path))
    return importlib.import_module("scripts.gpu_evidence")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # a zombie nobody reaped yet is dead


def test_a_command_past_its_deadline_is_killed_with_its_children(evidence: Any, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    # the background child outlives its parent's kill unless the whole process group goes
    code, seconds, _ = evidence.run_logged(
        ["bash", "-c", f"sleep 30 & echo $! > {pidfile}; echo started; sleep 30"], tmp_path / "log", timeout_s=1)
    assert code == 124 and time.monotonic() - started < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child)
    log = (tmp_path / "log").read_text()
    assert "started" in log and "[exit 124" in log


def test_every_step_is_in_the_summary_even_when_one_fails(evidence: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def ok(name: str, extra: dict[str, Any] | None = None):  # noqa: ANN202
        def step(*args: Any) -> dict[str, Any]:
            calls.append(name)
            return {"status": "ok", **(extra or {})}
        return step

    def broken(*args: Any) -> dict[str, Any]:
        calls.append("gpu_busy")
        raise RuntimeError("the harness itself broke")

    monkeypatch.setattr(evidence, "step_environment", ok("environment", {"python": {"cuda_available": False}}))
    monkeypatch.setattr(evidence, "step_trainer", ok("trainer"))
    monkeypatch.setattr(evidence, "step_gpu_busy", broken)
    monkeypatch.setattr(evidence, "step_checkpoint", ok("checkpoint"))
    monkeypatch.setattr(evidence, "step_fsdp", ok("fsdp_example"))
    monkeypatch.delenv("GPU_EVIDENCE_DRY", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    code = evidence.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path), "--budget-s", "60"])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert code == 1  # a failed step fails the run, after every other step ran
    assert list(summary["steps"]) == evidence.STEPS
    assert calls == ["environment", "trainer", "gpu_busy", "checkpoint", "fsdp_example"]
    assert summary["steps"]["gpu_busy"] == {"status": "failed", "error": "RuntimeError: the harness itself broke"}
    assert summary["steps"]["allreduce"]["status"].startswith("not measured: this machine has one GPU")


def test_a_spent_budget_skips_the_remaining_steps(evidence: Any, tmp_path: Path) -> None:
    ev = evidence.Evidence(tmp_path, budget_s=5, dry=True)
    result = evidence._guarded(ev, "trainer", lambda: pytest.fail("a step started with under 10 s left"))
    assert result == {"status": "skipped: the run's time budget is spent"}
    assert ev.limit(100) <= 5


def test_trainer_events_keep_what_the_summary_reports(evidence: Any) -> None:
    lines = [
        {"event": "config", "device": "cuda:0", "model": "resnet50"},
        {"event": "resumed", "epoch": 2, "batch": 0, "step": 96},
        {"event": "first_step", "step": 97, "resumed_from": 96, "time": 1.0},
        *({"event": "batch", "step": s, "loss": 1.0, "data_time": 0.0, "compute_time": 0.1, "gpu_utilization": 97}
          for s in range(8, 80, 8)),
        {"event": "checkpoint", "step": 112, "stall_seconds": 0.4, "complete": True},
        {"event": "epoch", "epoch": 2, "throughput": 2800.0, "data_share": 0.01, "gpu_utilization": 96.0},
        {"event": "done", "total_seconds": 9.0, "steps": 144},
    ]
    text = "launch: noise\n" + "\n".join(json.dumps(line) for line in lines) + "\n{not json\n"
    events = evidence._trainer_events(text)
    assert events["device"] == "cuda:0" and events["resumed"]["step"] == 96
    assert events["epochs"][0]["throughput"] == 2800.0 and events["checkpoints"][0]["stall_seconds"] == 0.4
    assert [b["step"] for b in events["batches"]] == [48, 56, 64, 72] and events["done"]["steps"] == 144


@pytest.mark.slow  # the whole rehearsal on this CPU: 4-7 minutes on the shared 2-CPU machine
def test_dry_run_goes_through_every_step_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "GPU_EVIDENCE_DRY": "1", "OUT": str(out), "GPU_EVIDENCE_PYTHON": sys.executable,
           "GPU_EVIDENCE_WHEELS": str(tmp_path / "no-wheels"), "GPU_EVIDENCE_TIMEOUT_S": "1500"}
    result = subprocess.run(["bash", "scripts/gpu_evidence.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=1600)
    summary = json.loads((out / "summary.json").read_text())
    assert result.returncode == 0, result.stdout[-3000:]
    assert list(summary["steps"]) == ["environment", "trainer", "gpu_busy", "checkpoint", "fsdp_example",
                                      "allreduce"]
    steps = summary["steps"]
    assert steps["trainer"]["resume_ok"] and steps["trainer"]["resumed"]["resumed"]["step"] > 0
    assert steps["checkpoint"]["report"]["rows"][1]["restored_equal"]
    assert steps["fsdp_example"]["resume_ok"]
    assert all(not str(step["status"]).startswith("failed") for step in steps.values())
