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
