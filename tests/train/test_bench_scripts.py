from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the benchmark would really run")
def test_bench_gpu_without_cuda_says_so_and_exits_cleanly() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/bench_gpu.py", "--json"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["results"] == [] and "no CUDA device" in report["skipped"]


def test_bench_gpu_rejects_unknown_models() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/bench_gpu.py", "--models", "vgg16"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: --models: unknown vgg16")


def test_bench_peers_rejects_unknown_contenders() -> None:
    result = subprocess.run([sys.executable, "scripts/bench_peers.py", "--contenders", "ours,tfdata"],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: --contenders") and "tfdata" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


BENCH_PYTHON = REPO / ".venv-bench" / "bin" / "python"


@pytest.mark.skipif(not BENCH_PYTHON.exists(), reason="no .venv-bench (make bench-peers builds it)")
def test_bench_peers_tiny_run_reports_every_row(tmp_path: Path) -> None:
    """Ours for real on a tiny set; a peer that is asked for either runs or says why not (never a fake number)."""
    result = subprocess.run(
        [str(BENCH_PYTHON), "scripts/bench_peers.py", "--images", "128", "--epochs", "2", "--rounds", "1",
         "--layouts", "decoded", "--contenders", "ours,s3torchconnector", "--json", "--workdir", str(tmp_path)],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["layouts"]["decoded"]
    assert rows["ours"]["status"] == "ok" and rows["ours"]["samples"] == 128
    assert rows["s3torchconnector"]["status"] in ("n/a", "not installed") and rows["s3torchconnector"]["reason"]
