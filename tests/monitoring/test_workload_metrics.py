"""The trainer's and the stager's metrics endpoints without a training run: names, flags, env, serving."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workloads.data.__main__ import main as data_main
from workloads.data.moving.metrics import StageMetrics
from workloads.train.__main__ import main as train_main
from workloads.train.__main__ import parse_args
from workloads.train.metrics import RunShape, TrainMetrics, metrics_port_for


def _families(text: str) -> dict[str, dict[str, float]]:
    """{family: {sample name + labels: value}} of a /metrics page."""
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out.setdefault(family.name, {})[f"{sample.name}{{{labels}}}"] = sample.value
    return out


def test_trainer_metrics_are_served_with_units_and_counters() -> None:
    metrics = TrainMetrics()
    metrics.started(RunShape(epochs=2, batches_per_epoch=5, batch_size=8, world_size=1, rank=0))
    metrics.epoch_started(1, first_batch=2)
    metrics.step(data_wait_s=0.25, compute_s=0.75, samples=8, loss=1.5, global_step=41)
    metrics.checkpointed(2.5)
    metrics.checkpointed(-1.0)  # a clock step backwards adds nothing
    port = metrics.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            page = _families(response.read().decode())
    finally:
        metrics.close()
    assert page["ml_train_samples"]["ml_train_samples_total{}"] == 8
    assert page["ml_train_global_step"]["ml_train_global_step{}"] == 41  # the goodput rules' high-water mark
    assert page["ml_train_checkpoint_stall_seconds"]["ml_train_checkpoint_stall_seconds_total{}"] == 2.5
    assert page["ml_train_steps"]["ml_train_steps_total{}"] == 1
    assert page["ml_train_step_seconds"]["ml_train_step_seconds_sum{}"] == 1.0  # wait + compute
    assert page["ml_train_data_wait_seconds"]["ml_train_data_wait_seconds_sum{}"] == 0.25
    assert page["ml_train_data_wait_seconds"]["ml_train_data_wait_seconds_bucket{le=0.25}"] == 1
    assert page["ml_train_epoch"]["ml_train_epoch{}"] == 1
    assert page["ml_train_epoch_batches_done"]["ml_train_epoch_batches_done{}"] == 3  # resumed at 2, one more
    assert page["ml_train_epoch_batches"]["ml_train_epoch_batches{}"] == 5
    assert page["ml_train_loss"]["ml_train_loss{}"] == 1.5
    assert "ml_train_gpu_utilization_ratio" not in page  # no GPU asked for: the series are absent, not zero


def test_gpu_series_are_absent_when_nvml_is_not_there() -> None:
    metrics = TrainMetrics(gpu_index=0)  # this machine has no NVIDIA driver: NVML cannot start
    names = {family.name for family in metrics.registry.collect()}
    assert "ml_train_samples" in names and not any(name.startswith("ml_train_gpu_") for name in names)


def test_each_local_rank_gets_its_own_port() -> None:
    assert [metrics_port_for(9400, rank) for rank in range(3)] == [9400, 9401, 9402]
    assert metrics_port_for(0, 3) == 0
    with pytest.raises(ValueError, match="--metrics-port: 65535 \\+ local rank 1 is not a TCP port"):
        metrics_port_for(65535, 1)


def test_metrics_port_flag_and_env(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_args(["--data", "x"]).metrics_port == 0
    monkeypatch.setenv("METRICS_PORT", "9400")
    monkeypatch.setenv("METRICS_ADDR", "0.0.0.0")
    config = parse_args(["--data", "x"])
    assert (config.metrics_port, config.metrics_addr) == (9400, "0.0.0.0")
    assert parse_args(["--data", "x", "--metrics-port", "0"]).metrics_port == 0
    monkeypatch.setenv("METRICS_PORT", "ninety")
    with pytest.raises(SystemExit) as exited:
        parse_args(["--data", "x"])
    assert exited.value.code == 2
    assert "error: METRICS_PORT: not a port number: 'ninety'" in capsys.readouterr().err


def test_stager_metrics_port_errors_are_one_line(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("STAGE_METRICS_PORT", "70000")
    assert data_main(["stage", "s3://bucket/prefix", "/nonexistent-dest"]) == 2
    err = capsys.readouterr().err
    assert err == "error: STAGE_METRICS_PORT: must be a TCP port (1-65535) or 0 for off, got 70000\n"
    with pytest.raises(SystemExit) as exited:
        data_main(["stage", "s3://bucket/prefix", "/nonexistent-dest", "--metrics-port", "-1"])
    assert exited.value.code == 2


def test_stager_metrics_names() -> None:
    metrics = StageMetrics()
    metrics.dataset(shards=4, total_bytes=4096, budget_bytes=2048)
    metrics.state(ready=2, held_bytes=2048, done=False)
    metrics.shards_evicted.inc()
    get = metrics.registry.get_sample_value
    assert get("ml_stage_window_capacity_bytes") == 2048 and get("ml_stage_window_used_bytes") == 2048
    assert get("ml_stage_shards_ready") == 2 and get("ml_stage_shards_evicted_total") == 1 and get("ml_stage_done") == 0
    assert get("ml_stage_bytes_total") == 0 and get("ml_stage_retries_total") == 0


def test_trainer_cli_serves_while_it_runs_and_frees_the_port_on_a_config_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    assert train_main(["--data", str(tmp_path / "missing"), "--metrics-port", str(port)]) == 2
    assert "error: " in capsys.readouterr().err
    with socket.socket() as sock:  # the endpoint is closed again: the port can be bound
        sock.bind(("127.0.0.1", port))


def test_trainer_cli_reports_a_busy_metrics_port_in_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert train_main(["--data", str(tmp_path), "--metrics-port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --metrics-port: cannot listen on 127.0.0.1:{port}") and err.count("\n") == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
