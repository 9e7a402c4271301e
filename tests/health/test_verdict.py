"""The burn-in's decision on recorded DCGM diagnostic output (tests/health/data/README.md), the GPU and EFA
checks' results, and the node patch that records it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from workloads.health.dcgm import parse_diag
from workloads.health.verdict import (
    EfaCheck,
    Evidence,
    GpuCheck,
    GpuResult,
    Verdict,
    decide,
    node_patch,
    read_gpu_check,
    should_run,
)

DATA = Path(__file__).parent / "data"
PREFIX = "ml-cluster.io"
FIXTURES = sorted(p.name for p in DATA.glob("dcgm-*.json"))


def _diag(name: str):  # type: ignore[no-untyped-def]
    return parse_diag((DATA / name).read_text())


def _healthy_gpus(count: int = 8) -> GpuCheck:
    return GpuCheck(count, tuple(GpuResult(i, "NVIDIA H100 80GB HBM3", True, True) for i in range(count)), True,
                    busbw_gbps=351.2)


@pytest.mark.parametrize("name", FIXTURES)
def test_fixtures_follow_nvidias_schema(name: str) -> None:
    schema = json.loads((DATA / "dcgm_diag_schema-v4.5.3.json").read_text())
    jsonschema.validate(json.loads((DATA / name).read_text()), schema)


def test_a_healthy_p5_passes() -> None:
    report = _diag("dcgm-r2-pass-p5.json")
    assert report.passed and report.tests == ("software", "memory", "pcie") and report.gpus == tuple(range(8))
    assert report.version == "4.5.2"
    verdict = decide(Evidence(expected_gpus=8, expected_efa=32, dcgm=report, dcgm_exit=0, gpu=_healthy_gpus(),
                              gpu_exit=0, efa=EfaCheck(32, True), efa_exit=0))
    assert verdict == Verdict(True, ())


def test_faulty_memory_fails_with_dcgms_words() -> None:
    verdict = decide(Evidence(expected_gpus=8, dcgm=_diag("dcgm-r2-fail-memory.json"), dcgm_exit=226,
                              gpu=_healthy_gpus()))
    assert not verdict.passed
    assert verdict.reasons == (
        "dcgm Deployment/software GPU 3: Fail: GPU 3 had memory errors and row remappings are pending "
        "(DCGM error 85, reset)",
        "dcgm Hardware/memory GPU 3: Fail: Found 4 faulty memory elements on GPU 3 (DCGM error 52, isolate)",
    )


def test_pcie_replays_fail() -> None:
    verdict = decide(Evidence(expected_gpus=8, dcgm=_diag("dcgm-r2-fail-pcie.json"), gpu=_healthy_gpus()))
    assert verdict.reasons == ("dcgm Integration/pcie GPU 5: Fail: Detected more than 8 PCIe replays per minute "
                               "for GPU 5 : 143 (DCGM error 3, isolate)",)


def test_a_gpu_missing_from_the_diagnostic_fails_even_when_every_test_passes() -> None:
    report = _diag("dcgm-r2-seven-gpus.json")
    assert not report.findings
    verdict = decide(Evidence(expected_gpus=8, dcgm=report, gpu=_healthy_gpus(7)))
    assert verdict.reasons == ("dcgm: saw 7 GPUs, the node's type has 8",
                               "gpu: CUDA sees 7 GPUs, the node's type has 8")


def test_a_diagnostic_that_could_not_run_fails() -> None:
    verdict = decide(Evidence(expected_gpus=8, dcgm=_diag("dcgm-runtime-error.json"), dcgm_exit=1,
                              gpu=_healthy_gpus()))
    assert verdict.reasons == ("dcgm: dcgmi: Error: Unable to complete diagnostic for group 2. Return: (-5) Host "
                               "engine is not valid any longer (exit 1)",)


@pytest.mark.parametrize("text", ["", "Error: unable to connect to host engine\n", "{\"DCGM Diagnostic\": [",
                                  "[1, 2]", '{"DCGM Diagnostic": {"test_categories": []}}', "{" * 100000])
def test_unreadable_output_is_a_failure_not_a_crash(text: str) -> None:
    report = parse_diag(text)
    assert report.error and not report.passed
    assert not decide(Evidence(expected_gpus=1, dcgm=report, gpu=_healthy_gpus(1))).passed


def test_missing_evidence_is_never_a_pass() -> None:
    timed_out = decide(Evidence(expected_gpus=8, dcgm=None, dcgm_exit=124, gpu=None, gpu_exit=1,
                                expected_efa=32, efa=None))
    assert timed_out.reasons == ("dcgm: the diagnostic left no output (exit 124, timed out)",
                                 "gpu: the memory/compute check left no result (exit 1)",
                                 "efa: the check left no result")


def test_gpu_compute_allreduce_and_efa_failures_are_each_named() -> None:
    gpus = list(_healthy_gpus().gpus)
    gpus[2] = GpuResult(2, "NVIDIA H100 80GB HBM3", True, False, "its matmul result differs from GPU 0's")
    gpus[6] = GpuResult(6, "NVIDIA H100 80GB HBM3", False, True)
    check = GpuCheck(8, tuple(gpus[:7]), False, "NCCL error: unhandled system error")
    verdict = decide(Evidence(expected_gpus=8, expected_efa=32, dcgm=_diag("dcgm-r2-pass-p5.json"), gpu=check,
                              efa=EfaCheck(31, False, "fi_info exit 61: no data available")))
    assert verdict.reasons == (
        "gpu: no result for GPU 7",
        "gpu 2: its matmul result differs from GPU 0's",
        "gpu 6: memory check failed",
        "nccl: all-reduce across the node's GPUs failed: NCCL error: unhandled system error",
        "efa: fi_info exit 61: no data available",
        "efa: 31 EFA interfaces, the pool expects 32",
        "efa: fi_info -p efa lists no efa provider (libfabric cannot open the interfaces)",
    )


def test_gpu_summary_is_read_strictly() -> None:
    good = {"devices": 2, "gpus": [{"index": 0, "memory_ok": True, "compute_ok": True, "error": None},
                                   {"index": 1, "memory_ok": True, "compute_ok": "yes"}],
            "allreduce": {"ok": True, "busbw_gbps": 120}}
    check = read_gpu_check(good)
    assert check.gpus[1].compute_ok is False and check.busbw_gbps == 120.0  # only a JSON true counts
    for bad, field in (([], "not an object"), ({"devices": -1}, "devices"), ({"devices": 1, "gpus": {}}, "gpus"),
                       ({"devices": 1, "gpus": [{"index": "0"}]}, "gpus[0].index")):
        with pytest.raises(ValueError, match=re.escape(field)):
            read_gpu_check(bad)


def _node(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
          taints: list[dict[str, str]] | None = None, unschedulable: bool = False) -> dict[str, object]:
    return {"metadata": {"name": "ip-10-0-1-5", "resourceVersion": "4711", "labels": labels or {},
                         "annotations": annotations or {}},
            "spec": {"taints": taints or [], "unschedulable": unschedulable}}


def _apply(node: dict[str, object], ops: list[dict[str, object]]) -> dict[str, object]:
    """RFC 6902 as the API server applies these ops (test, then add on existing members = replace)."""
    result = json.loads(json.dumps(node))
    for op in ops:
        path = [part.replace("~1", "/").replace("~0", "~") for part in str(op["path"]).split("/")[1:]]
        parent = result
        for part in path[:-1]:
            parent = parent[part]
        if op["op"] == "test":
            assert parent[path[-1]] == op["value"]
        else:
            assert op["op"] == "add"
            parent[path[-1]] = op["value"]
    return result


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def test_a_failed_node_is_labelled_tainted_cordoned_and_says_why() -> None:
    verdict = decide(Evidence(expected_gpus=8, dcgm=_diag("dcgm-r2-fail-pcie.json"), gpu=_healthy_gpus()))
    node = _node({"ml-cluster.io/gpu-type": "h100"}, taints=[GPU_TAINT])
    ops = node_patch(node, verdict, PREFIX, "2026-11-25T03:00:00Z")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "4711"}
    after = _apply(node, ops)
    assert after["metadata"]["labels"] == {"ml-cluster.io/gpu-type": "h100", "ml-cluster.io/gpu-health": "failed"}
    assert after["spec"] == {"unschedulable": True, "taints": [
        GPU_TAINT, {"key": "ml-cluster.io/gpu-health", "value": "failed", "effect": "NoSchedule"}]}
    assert after["metadata"]["annotations"] == {
        "ml-cluster.io/gpu-health-checked-at": "2026-11-25T03:00:00Z", "ml-cluster.io/gpu-health-cordoned": "true",
        "ml-cluster.io/gpu-health-reason": verdict.reasons[0]}
    assert should_run(after, PREFIX)  # failed is not passed: the next pod on it checks again


def test_a_pass_after_a_failure_lifts_only_what_the_burn_in_put_there() -> None:
    failed = _apply(_node(taints=[GPU_TAINT]), node_patch(_node(taints=[GPU_TAINT]), Verdict(False, ("x",)),
                                                          PREFIX, "t0"))
    failed["metadata"]["resourceVersion"] = "4712"
    passed = _apply(failed, node_patch(failed, Verdict(True), PREFIX, "t1"))
    assert passed["metadata"]["labels"] == {"ml-cluster.io/gpu-health": "passed"}
    assert passed["spec"] == {"taints": [GPU_TAINT], "unschedulable": False}
    assert passed["metadata"]["annotations"] == {"ml-cluster.io/gpu-health-checked-at": "t1"}
    assert not should_run(passed, PREFIX)
    # A node an operator had cordoned before the burn-in stays cordoned when it passes.
    held = _node(unschedulable=True)
    assert _apply(held, node_patch(held, Verdict(True), PREFIX, "t2"))["spec"]["unschedulable"] is True


def test_the_reason_annotation_is_bounded() -> None:
    verdict = Verdict(False, tuple(f"gpu {i}: " + "x" * 400 for i in range(40)))
    after = _apply(_node(), node_patch(_node(), verdict, PREFIX, "t"))
    assert len(after["metadata"]["annotations"]["ml-cluster.io/gpu-health-reason"]) <= 2000


def test_the_scale_down_hold_is_lifted_only_where_the_burn_in_put_it() -> None:
    from workloads.health.verdict import hold_patch

    fresh = _node()
    held = _apply(fresh, hold_patch(fresh, PREFIX))
    assert held["metadata"]["annotations"] == {"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
                                               "ml-cluster.io/gpu-health-holds-scale-down": "true"}
    assert _apply(held, node_patch(held, Verdict(True), PREFIX, "t"))["metadata"]["annotations"] == {
        "ml-cluster.io/gpu-health-checked-at": "t"}
    operators = _node(annotations={"cluster-autoscaler.kubernetes.io/scale-down-disabled": "true"})
    assert hold_patch(operators, PREFIX) == []
    assert _apply(operators, node_patch(operators, Verdict(False, ("x",)), PREFIX, "t"))["metadata"][
        "annotations"]["cluster-autoscaler.kubernetes.io/scale-down-disabled"] == "true"
