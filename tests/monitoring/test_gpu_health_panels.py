"""The dashboard's GPU health row against a real Prometheus: what dcgm-exporter and kube-state-metrics would expose
for three GPU nodes (one passed its burn-in, one failed it and lost a GPU, one still in burn-in), and what each
panel answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.monitoring.dashboard import build_dashboard, gpu_health_panels
from tests.monitoring.prom import PROMETHEUS, PROMTOOL, prometheus, static_exporter

pytestmark = pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                reason="Debian's prometheus package is not installed (.ci/run installs it)")

GPU = 'gpu="{gpu}",UUID="GPU-{node}-{gpu}",Hostname="{node}"'


def _dcgm() -> str:
    lines = ["# TYPE DCGM_EXP_XID_ERRORS_COUNT gauge"]
    lines += [f'DCGM_EXP_XID_ERRORS_COUNT{{{GPU.format(gpu=3, node="node-b")},xid="79"}} 1',
              f'DCGM_EXP_XID_ERRORS_COUNT{{{GPU.format(gpu=0, node="node-a")},xid="13"}} 0']
    for metric, value_b in (("DCGM_FI_DEV_RETIRED_DBE", 2), ("DCGM_FI_DEV_RETIRED_SBE", 1),
                            ("DCGM_FI_DEV_RETIRED_PENDING", 1), ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 3),
                            ("DCGM_FI_DEV_ROW_REMAP_FAILURE", 1), ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", 9),
                            ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 4),
                            ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 1)):
        lines.append(f"# TYPE {metric} gauge")
        lines.append(f"{metric}{{{GPU.format(gpu=0, node='node-a')}}} 0")
        lines.append(f"{metric}{{{GPU.format(gpu=3, node='node-b')}}} {value_b}")
    return "\n".join(lines) + "\n"


KSM = """\
# TYPE kube_node_labels gauge
kube_node_labels{node="node-a",label_ml_cluster_io_gpu_count="8",label_ml_cluster_io_gpu_health="passed"} 1
kube_node_labels{node="node-b",label_ml_cluster_io_gpu_count="8",label_ml_cluster_io_gpu_health="failed"} 1
kube_node_labels{node="node-c",label_ml_cluster_io_gpu_count="8"} 1
kube_node_labels{node="system-1"} 1
# TYPE kube_node_status_allocatable gauge
kube_node_status_allocatable{node="node-a",resource="nvidia_com_gpu",unit="integer"} 8
kube_node_status_allocatable{node="node-b",resource="nvidia_com_gpu",unit="integer"} 7
kube_node_status_allocatable{node="node-c",resource="nvidia_com_gpu",unit="integer"} 8
# TYPE kube_node_spec_taint gauge
kube_node_spec_taint{node="node-a",key="nvidia.com/gpu",value="true",effect="NoSchedule"} 1
kube_node_spec_taint{node="node-b",key="nvidia.com/gpu",value="true",effect="NoSchedule"} 1
kube_node_spec_taint{node="node-b",key="ml-cluster.io/gpu-health",value="failed",effect="NoSchedule"} 1
"""


def _answers(server, expr: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    result = server.query(expr.replace("$__rate_interval", "1m"))
    assert result["status"] == "success", (expr, result)
    return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1]) for r in result["data"]["result"]}


def test_the_gpu_health_row_on_a_real_prometheus(tmp_path: Path) -> None:
    panels = {panel.title: panel for panel in gpu_health_panels("ml-cluster.io")}
    with static_exporter(_dcgm()) as dcgm, static_exporter(KSM) as ksm:
        targets = [{"job_name": "dcgm", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{dcgm}"]}]},
                   {"job_name": "ksm", "honor_labels": True, "static_configs": [{"targets": [f"127.0.0.1:{ksm}"]}]}]
        with prometheus(tmp_path / "prom", targets, []) as server:
            server.wait_for("up", lambda result: len(result) == 2 and all(r["value"][1] == "1" for r in result))
            server.wait_for("count(kube_node_labels)", lambda result: result and result[0]["value"][1] == "4")
            server.wait_for("rate(DCGM_FI_DEV_RETIRED_DBE[1m])", lambda result: len(result) == 2)
            verdicts = panels["GPU nodes by burn-in verdict"].queries
            assert _answers(server, verdicts[0][0]) == {'{"label_ml_cluster_io_gpu_health": "failed"}': 1.0,
                                                         '{"label_ml_cluster_io_gpu_health": "passed"}': 1.0}
            assert _answers(server, verdicts[1][0]) == {"{}": 1.0}  # node-c: in burn-in
            assert _answers(server, verdicts[2][0]) == {"{}": 1.0}  # node-b: tainted
            assert _answers(server, panels["GPUs offered by nodes short of their type's count"].queries[0][0]) == {
                '{"node": "node-b"}': 7.0}
            assert _answers(server, panels["XIDs by code (per node, exporter window)"].queries[0][0]) == {
                '{"Hostname": "node-b", "xid": "79"}': 1.0}  # the zero count of XID 13 is not drawn
            memory = [_answers(server, expr) for expr, _ in panels["Retired pages and remapped rows (per GPU)"].queries]
            b3 = '{"Hostname": "node-b", "gpu": "3"}'
            assert [answer.get(b3) for answer in memory] == [3.0, 1.0, 3.0, 1.0]
            assert '{"Hostname": "node-a", "gpu": "0"}' not in memory[3]  # no remap failure on node-a
            for expr, _ in panels["NVLink errors/s (per node)"].queries:
                assert set(_answers(server, expr)) == {'{"Hostname": "node-a"}', '{"Hostname": "node-b"}'}


def test_the_row_is_in_the_dashboard() -> None:
    model = build_dashboard("ml-cluster.io").build()
    rows = [panel.title for panel in model.panels if getattr(panel, "type_val", None) == "row"]
    assert rows[-1] == "GPU health"
