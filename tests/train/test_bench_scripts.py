from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _script(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """scripts/NAME.py as a module, for its main() in-process (the argument checks run before any work, and the
    worker has imported torch already); the sys.path entries the script adds are dropped after the test.
    test_bench_gpu_without_cuda_says_so_and_exits_cleanly runs a script in its own process."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    return importlib.import_module(f"scripts.{name}")


def test_bench_gpu_rejects_unknown_models(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    bench_gpu = _script("bench_gpu", monkeypatch)
    monkeypatch.setattr(sys, "argv", ["scripts/bench_gpu.py", "--models", "vgg16"])
    assert bench_gpu.main() == 2
    assert capsys.readouterr().err.startswith("error: --models: unknown vgg16")


def test_bench_peers_rejects_unknown_contenders(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _script("bench_peers", monkeypatch).main(["--contenders", "ours,tfdata"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --contenders") and "tfdata" in err
    assert len(err.strip().splitlines()) == 1


BENCH_PYTHON = REPO / ".venv-bench" / "bin" / "python"


@pytest.mark.slow  # the peers harness end to end (only where .venv-bench exists)
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


def test_bench_peers_rejects_a_checkout_that_is_not_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert _script("bench_peers", monkeypatch).main(["--checkouts", f"base={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --checkouts:") and str(tmp_path) in err
    assert len(err.strip().splitlines()) == 1


def _row(total: float) -> dict[str, object]:
    return {"status": "ok", "total_20_s": total}


def test_bench_check_compares_each_ratio_with_its_baseline(tmp_path: Path) -> None:
    """The guard's logic on a made-up bench_peers result: a ratio within the tolerance passes, a worse one fails
    naming its check, a row that did not run fails with the reason, and a check without a baseline is new."""
    from benchmarks.regression import compare, contenders, load_baselines, ratios, write_baselines

    assert contenders("encoded") == ["ours", "ours-redecode", "ours-cache40", "litdata", "litdata-cache40"]
    layouts = {"decoded": {"ours": _row(6.0), "litdata": _row(10.0)},
               "encoded": {"ours": _row(4.0), "ours-redecode": _row(13.0), "litdata": _row(10.0),
                           "ours-cache40": {"status": "failed", "reason": "timed out after 600s"},
                           "litdata-cache40": _row(20.0)}}
    measured = ratios(layouts)
    assert measured["decoded"] == 0.6 and measured["encoded-redecode"] == 1.3
    assert measured["staging-cache40"] == "ours-cache40: failed timed out after 600s"
    baselines = {"ratios": {"decoded": 0.55, "encoded-decode-cache": 0.4, "encoded-redecode": 0.9}}
    lines, passed = compare(measured, baselines, 0.3)
    assert not passed
    by_check = {line.split()[0]: line for line in lines[1:]}
    assert by_check["decoded"].endswith("PASS") and by_check["encoded-decode-cache"].endswith("PASS")
    assert "FAIL encoded-redecode: 1.30 > 1.17" in by_check["encoded-redecode"]
    assert "FAIL staging-cache40: ours-cache40: failed" in by_check["staging-cache40"]
    measured["staging-cache40"] = 0.8
    lines, passed = compare({**measured, "encoded-redecode": 1.1}, baselines, 0.3)
    assert passed and lines[-1].endswith("NEW (no baseline)")
    path = tmp_path / "baselines.json"
    write_baselines(path, {**measured, "encoded-redecode": 1.1}, command="scripts/bench_check.py --record",
                    date="2026-11-26 16:00 UTC", load="load average: 1.00", tolerance=0.3)
    recorded = load_baselines(path)
    assert recorded["ratios"]["staging-cache40"] == 0.8 and recorded["command"] == "scripts/bench_check.py --record"
    (tmp_path / "bad.json").write_text('{"ratios": {"decoded": "fast"}}')
    with pytest.raises(ValueError, match="bad.json: not a baselines file"):
        load_baselines(tmp_path / "bad.json")
