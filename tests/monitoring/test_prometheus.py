"""End to end against a real Prometheus: the stager stages a dataset from S3 (moto server), the trainer trains on the
staged copy, both serve their metrics, Prometheus scrapes them; every dashboard query and every alert signal returns
series, every alert rule passes promtool and parses on the server."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from infra.config.monitoring import AlertThresholds
from infra.monitoring.alerts import alert_rules, rule_groups
from infra.monitoring.dashboard import GOODPUT_PANELS, panel_queries
from tests.data.helpers import stage_options, uploaded
from tests.monitoring.prom import PROMETHEUS, PROMTOOL, prometheus, static_exporter
from workloads.data.moving.metrics import StageMetrics
from workloads.data.moving.s3 import make_client
from workloads.data.moving.stage import stage
from workloads.train.__main__ import parse_args
from workloads.train.loop import Reporter, train
from workloads.train.metrics import TrainMetrics

pytestmark = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                reason="Debian's prometheus package is not installed (.ci/run installs it)")

NAMESPACE = "training"
POD = {"namespace": NAMESPACE, "pod": "tiny-3f2a9c1d-0", "job_name": "tiny-3f2a9c1d", "node": "node-a"}

# The GPU health row's series (tests/monitoring/test_gpu_health_panels.py checks its answers): a sick node beside the
# healthy one, so that every panel of the row has something to draw here too.
GPU_HEALTH_STAND_INS = """\
# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge
DCGM_EXP_XID_ERRORS_COUNT{gpu="3",UUID="GPU-3",Hostname="node-b",xid="79"} 1
# TYPE DCGM_FI_DEV_RETIRED_DBE gauge
DCGM_FI_DEV_RETIRED_DBE{gpu="3",UUID="GPU-3",Hostname="node-b"} 2
# TYPE DCGM_FI_DEV_RETIRED_SBE gauge
DCGM_FI_DEV_RETIRED_SBE{gpu="3",UUID="GPU-3",Hostname="node-b"} 1
# TYPE DCGM_FI_DEV_RETIRED_PENDING gauge
DCGM_FI_DEV_RETIRED_PENDING{gpu="3",UUID="GPU-3",Hostname="node-b"} 1
# TYPE DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS gauge
DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{gpu="3",UUID="GPU-3",Hostname="node-b"} 3
# TYPE DCGM_FI_DEV_ROW_REMAP_FAILURE gauge
DCGM_FI_DEV_ROW_REMAP_FAILURE{gpu="3",UUID="GPU-3",Hostname="node-b"} 1
# TYPE DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{gpu="3",UUID="GPU-3",Hostname="node-b"} 9
# TYPE DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{gpu="3",UUID="GPU-3",Hostname="node-b"} 4
# TYPE DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{gpu="3",UUID="GPU-3",Hostname="node-b"} 1
# TYPE kube_node_labels gauge
kube_node_labels{node="node-a",label_ml_cluster_io_gpu_count="8",label_ml_cluster_io_gpu_health="passed"} 1
kube_node_labels{node="node-b",label_ml_cluster_io_gpu_count="8",label_ml_cluster_io_gpu_health="failed"} 1
kube_node_labels{node="node-c",label_ml_cluster_io_gpu_count="8"} 1
# TYPE kube_node_status_allocatable gauge
kube_node_status_allocatable{node="node-a",resource="nvidia_com_gpu",unit="integer"} 8
kube_node_status_allocatable{node="node-b",resource="nvidia_com_gpu",unit="integer"} 7
# TYPE kube_node_spec_taint gauge
kube_node_spec_taint{node="node-b",key="ml-cluster.io/gpu-health",value="failed",effect="NoSchedule"} 1
"""

# What dcgm-exporter (GPU mapped to the training pod, scraped with honorLabels) and kube-state-metrics would expose
# for that pod: neither can run here (no GPU, no API server).
STAND_INS = f"""\
# TYPE DCGM_FI_DEV_GPU_UTIL gauge
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-0",Hostname="node-a",modelName="NVIDIA H100",namespace="{NAMESPACE}",\
pod="{POD['pod']}",container="train"}} 3
# TYPE kube_pod_status_phase gauge
kube_pod_status_phase{{namespace="{NAMESPACE}",pod="{POD['pod']}",phase="Pending"}} 0
kube_pod_status_phase{{namespace="{NAMESPACE}",pod="{POD['pod']}",phase="Running"}} 1
# a gang pod that failed a minute ago: the restart alert's signal (kube-state-metrics)
kube_pod_status_phase{{namespace="{NAMESPACE}",pod="run-1-0-x",phase="Failed"}} 1
# TYPE kube_pod_created gauge
kube_pod_created{{namespace="{NAMESPACE}",pod="run-1-0-x"}} {int(time.time()) - 60}
# TYPE kube_pod_owner gauge
kube_pod_owner{{namespace="{NAMESPACE}",pod="run-1-0-x",owner_kind="Job",owner_name="run-1",\
owner_is_controller="true"}} 1
# TYPE kube_job_spec_parallelism gauge
kube_job_spec_parallelism{{namespace="{NAMESPACE}",job_name="run-1"}} 2
""" + GPU_HEALTH_STAND_INS


SUBSTITUTIONS = {"$__rate_interval": "1m", "$namespace": NAMESPACE, "$job": ".*"}


def _grafana(expr: str) -> str:
    """Template variables replaced as Grafana does before it sends a query."""
    for variable, value in SUBSTITUTIONS.items():
        expr = expr.replace(variable, value)
    return expr


def test_real_prometheus_scrapes_stager_and_trainer(packed: Path, s3_url: str, bucket: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": rule_groups(AlertThresholds(), NAMESPACE)}))
    checked = subprocess.run([str(PROMTOOL), "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    total = sum(len(group["rules"]) for group in rule_groups(AlertThresholds(), NAMESPACE))
    assert total > len(alert_rules(AlertThresholds(), NAMESPACE))  # the GPU-health group rides along
    assert f"SUCCESS: {total} rules found" in checked.stdout

    staged_dir = tmp_path / "staged"
    stage_metrics, train_metrics = StageMetrics(), TrainMetrics(volumes={"shm": "/dev/shm", "data": str(staged_dir)})
    stage_port, train_port = stage_metrics.serve(0, "127.0.0.1"), train_metrics.serve(0, "127.0.0.1")
    try:
        with static_exporter(STAND_INS) as stand_in_port:
            targets = [
                {"job_name": "trainer", "static_configs": [{"targets": [f"127.0.0.1:{train_port}"], "labels": POD}]},
                {"job_name": "stager", "static_configs": [{"targets": [f"127.0.0.1:{stage_port}"], "labels": POD}]},
                {"job_name": "stand-ins", "honor_labels": True,
                 "static_configs": [{"targets": [f"127.0.0.1:{stand_in_port}"]}]},
            ]
            with prometheus(tmp_path / "prom", targets, [rules]) as prom:
                prom.wait_for('sum(up{job=~"trainer|stager"})', lambda r: r and float(r[0]["value"][1]) == 2)
                prom.wait_for("ml_train_steps_total", lambda r: len(r) == 1)  # a sample before the run: rate base
                # Before the run the stand-in GPU idles at 3% beside a trainer that has not finished: idle alert.
                gpu_idle = next(r for r in alert_rules(AlertThresholds(), NAMESPACE) if r.name == "TrainingGpuIdle")
                firing = prom.wait_for(gpu_idle.expr, lambda r: len(r) == 1)
                assert firing[0]["metric"] == {"namespace": NAMESPACE, "pod": POD["pod"]}

                target = uploaded(packed, s3_url, bucket)
                stage(make_client(s3_url, 4), target, staged_dir, stage_options(metrics=stage_metrics))
                threads = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    summary = train(parse_args(["--data", str(staged_dir), "--model", "resnet18", "--width", "8",
                                                "--batch-size", "8", "--crop-size", "32", "--workers", "0",
                                                "--epochs", "2", "--lr", "0.01"]),
                                    Reporter(0, open("/dev/null", "w")), metrics=train_metrics)  # noqa: SIM115
                finally:
                    torch.set_num_threads(threads)
                steps = 2 * summary["batches"]
                prom.wait_for("ml_train_steps_total", lambda r: r and float(r[0]["value"][1]) == steps)
                prom.wait_for("ml_train_done", lambda r: r and float(r[0]["value"][1]) == 1)
                assert float(prom.query("ml_train_global_step")["data"]["result"][0]["value"][1]) == steps

                figures = {}
                for expr in ("sum by (job_name) (rate(ml_train_samples_total[1m]))",
                             'sum by (job_name) (rate(ml_train_data_wait_seconds_sum[1m]))'
                             ' / sum by (job_name) (rate(ml_train_step_seconds_sum[1m]))',
                             "ml_train_samples_total", "ml_stage_bytes_total", "ml_stage_shards_ready",
                             'ml_train_filesystem_used_bytes{volume="data"}'):
                    result = prom.query(expr)["data"]["result"]
                    assert result, expr
                    figures[expr] = float(result[0]["value"][1])
                print("\nqueried figures:", *(f"  {expr} = {value:.6g}" for expr, value in figures.items()), sep="\n")
                assert figures["ml_train_samples_total"] == 2 * 24  # two epochs of the 24-sample dataset
                assert figures["ml_stage_shards_ready"] == len(list(staged_dir.glob("shard-*.h5")))

                goodput = {expr for panel in GOODPUT_PANELS for expr, _ in panel.queries}  # test_goodput_rules.py
                for expr in panel_queries():
                    if expr in goodput:
                        continue
                    answer = prom.query(_grafana(expr))
                    assert answer["status"] == "success", (expr, answer)
                    assert answer["data"]["result"], f"dashboard query returns no series: {expr}"
                for rule in alert_rules(AlertThresholds(), NAMESPACE):
                    assert prom.query(rule.expr)["status"] == "success", rule.name
                    if rule.name != gpu_idle.name:  # its signal (running trainers' GPUs) was checked before the run
                        assert prom.query(rule.signal)["data"]["result"], f"{rule.name}: signal has no series"
                # The trainer has finished: its GPU is released, not idle.
                assert prom.query(gpu_idle.expr)["data"]["result"] == []
    finally:
        stage_metrics.close()
        train_metrics.close()
