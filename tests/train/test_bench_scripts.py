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


def test_bench_check_fails_a_timing_row_only_beyond_the_bases_own_spread() -> None:
    """head's best round against base's best x (1 + max(base spread, floor)): within the base's spread passes, beyond
    it fails, a steady base still allows the floor, and a row without two base rounds fails saying why."""
    from benchmarks.regression import timing_verdict

    noisy = timing_verdict("wall", "decoded", [10.0, 16.0], [15.0, 30.0], 0.25)  # spread 60%: limit 16
    assert noisy.passed and noisy.limit == 16.0 and "base spread 60%" in noisy.note
    slower = timing_verdict("wall", "decoded", [10.0, 16.0], [16.5, 17.0], 0.25)
    assert not slower.passed and slower.line().split()[-1] != "PASS" and " FAIL " in slower.line()
    steady = timing_verdict("cpu", "decoded", [40.0, 41.0, 40.5], [43.9, 50.0, 60.0], 0.10)
    assert steady.passed and steady.limit == 44.0 and "floor 10%" in steady.note
    assert not timing_verdict("cpu", "decoded", [40.0, 41.0, 40.5], [44.5, 45.0, 46.0], 0.10).passed
    missing = timing_verdict("wall", "decoded", [10.0, None], [11.0, 12.0], 0.25)
    assert not missing.passed and missing.limit is None and "base 1 of 2 rounds" in missing.note


def test_bench_check_reader_and_wall_rows_from_the_reports() -> None:
    """calls rows are a plain limit (+10%) on exact counts; cpu rows use the spread rule; a harness row that failed
    for one checkout fails with that checkout's reason."""
    from benchmarks.regression import WALL_ROWS, reader_verdicts, wall_verdicts

    def report(calls: float, us: float) -> dict[str, float]:
        return {"decoded calls/sample": calls, "decoded us/sample": us}

    base = [report(15.2, 40.0), report(15.2, 44.0), report(15.2, 42.0)]
    within = reader_verdicts(base, [report(16.7, 44.0)] * 3, readers=("decoded",), calls_tolerance=0.1,
                             cpu_floor=0.1)
    assert [(v.kind, v.passed) for v in within] == [("calls", True), ("cpu", True)]
    beyond = reader_verdicts(base, [report(16.8, 45.0), None, report(16.8, 90.0)], readers=("decoded",),
                             calls_tolerance=0.1, cpu_floor=0.1)
    assert [(v.kind, v.passed) for v in beyond] == [("calls", False), ("cpu", False)]
    rows = {row.name: row for row in WALL_ROWS}
    layouts = {"encoded": {"ours": {"status": "ok", "round_totals_s": [5.0, 6.0]},
                           "ours@base": {"status": "ok", "round_totals_s": [4.0, 7.0]},
                           "ours-redecode": {"status": "ok", "round_totals_s": [20.0, 19.0]},
                           "ours-redecode@base": {"status": "failed", "reason": "timed out after 600s",
                                                  "round_totals_s": [None, None]}}}
    verdicts = wall_verdicts(layouts, [rows["encoded-decode-cache"], rows["encoded-redecode"]], "base", 0.25)
    assert verdicts[0].passed and not verdicts[1].passed
    assert "ours-redecode@base: failed timed out after 600s" in verdicts[1].note


def test_reader_calls_per_sample_hold_to_the_recorded_figures(tmp_path: Path) -> None:
    """The gate's load-independent guard in its small form: calls per sample of every reader (cProfile, a few hundred
    tiny images) at most the recorded figure + its tolerance. Added per-sample work in a reader fails here; a
    deliberate change re-records (`scripts/bench_check.py --record-small-form`)."""
    from benchmarks.reader_cost import READERS, small_form_calls
    from benchmarks.regression import BASELINES, load_recorded

    recorded = load_recorded(BASELINES)
    calls = small_form_calls(tmp_path)
    assert set(calls) == set(READERS) == set(recorded["small_form_calls"])
    over = {name: (value, recorded["small_form_calls"][name]) for name, value in calls.items()
            if value > recorded["small_form_calls"][name] * (1 + recorded["tolerance"])}
    assert not over, f"calls/sample over the recorded figure + {recorded['tolerance']:.0%}: {over}"


def test_bench_check_rejects_a_base_that_is_not_a_commit(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert _script("bench_check", monkeypatch).main(["--base", "no-such-ref-here", "--wall-rows", "none"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --base: 'no-such-ref-here': not a commit") and len(err.strip().splitlines()) == 1


def test_bench_peers_alternates_which_checkout_runs_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even rounds run this checkout's row before the other checkouts' rows of the same contender, odd rounds after
    them; contenders keep their order."""
    order = _script("bench_peers", monkeypatch)._round_order
    here, there = Path("/here"), Path("/there")
    runs = [("ours", "ours", here), ("ours@base", "ours", there), ("litdata", "litdata", here),
            ("ours-redecode", "ours-redecode", here), ("ours-redecode@base", "ours-redecode", there)]
    assert order(runs, 0) == runs
    assert [label for label, _, _ in order(runs, 1)] == ["ours@base", "ours", "litdata", "ours-redecode@base",
                                                         "ours-redecode"]
