"""The burn-in's decision, and how the node records it: pure functions of the checks' results and the Node object.

A node passes only when every check ran and said so: DCGM's diagnostic found nothing and saw every GPU the pool's
instance type has, every GPU passed the memory and compute check, the all-reduce across the node's GPUs returned
the right sum, and (EFA pools) every EFA interface is there and libfabric's EFA provider opens them. A check that
did not run, timed out or left no result is a failure: a node is never labelled on missing evidence.

The record on the node (`node_patch`): the label `<prefix>/gpu-health` = `passed` (training Jobs and Kueue's
flavors require it) or `failed`; on failure also the taint `<prefix>/gpu-health=failed:NoSchedule`, the node
cordoned (so cluster-autoscaler never takes it as the template of its group) and the reasons in the annotation
`<prefix>/gpu-health-reason`. A later pass removes the taint and uncordons the node only if the burn-in cordoned it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from workloads.health.dcgm import DiagReport

HEALTH_LABEL = "gpu-health"  # <prefix>/gpu-health: passed | failed
PASSED, FAILED = "passed", "failed"
REASON_ANNOTATION = "gpu-health-reason"
CHECKED_ANNOTATION = "gpu-health-checked-at"
CORDONED_ANNOTATION = "gpu-health-cordoned"  # "true": the burn-in cordoned the node, so a pass may uncordon it
# cluster-autoscaler never scales down a node with this annotation (kubernetes/autoscaler cluster-autoscaler-1.35.2
# core/scaledown/eligibility/eligibility.go:39). A node in burn-in runs only DaemonSets, so it looks unneeded: the
# burn-in holds it until its verdict, and marks that it did (HELD_ANNOTATION) so it lifts only its own hold.
SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
HELD_ANNOTATION = "gpu-health-holds-scale-down"
MAX_REASON_CHARS = 2000
MAX_REASONS = 12
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class GpuResult:
    index: int
    name: str = ""
    memory_ok: bool = False
    compute_ok: bool = False
    error: str | None = None


@dataclass(frozen=True)
class GpuCheck:
    """gpucheck's summary (rank 0 writes it): the GPUs the processes saw and what each found."""

    devices: int
    gpus: tuple[GpuResult, ...]
    allreduce_ok: bool
    allreduce_error: str | None = None
    busbw_gbps: float | None = None


@dataclass(frozen=True)
class EfaCheck:
    interfaces: int  # EFA devices under /sys/class/infiniband
    provider_ok: bool  # `fi_info -p efa` listed the efa provider
    error: str | None = None
    memlock_kib: int | None = None  # the containers' locked-memory limit when finite; None: unlimited (or not said)


@dataclass(frozen=True)
class Evidence:
    """Everything the checks left behind. None: the check left no result (crashed, timed out, not run)."""

    expected_gpus: int
    expected_efa: int = 0
    dcgm: DiagReport | None = None
    dcgm_exit: int | None = None
    gpu: GpuCheck | None = None
    gpu_exit: int | None = None
    efa: EfaCheck | None = None
    efa_exit: int | None = None


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def value(self) -> str:
        return PASSED if self.passed else FAILED

    def summary(self) -> str:
        return "passed" if self.passed else "failed: " + " | ".join(self.reasons)


def decide(evidence: Evidence) -> Verdict:
    """passed, or failed with one line per reason (every reason, not only the first)."""
    reasons: list[str] = []
    reasons += _judged("dcgm: the diagnostic left no output", evidence.dcgm, evidence.dcgm_exit,
                       lambda report: _dcgm_reasons(report, evidence))
    reasons += _judged("gpu: the memory/compute check left no result", evidence.gpu, evidence.gpu_exit,
                       lambda check: _gpu_reasons(check, evidence.expected_gpus))
    if evidence.expected_efa:
        reasons += _judged("efa: the check left no result", evidence.efa, evidence.efa_exit,
                           lambda check: _efa_reasons(check, evidence.expected_efa))
    return Verdict(not reasons, tuple(reasons))


def _judged(missing: str, result: _Result | None, code: int | None,
            judge: Callable[[_Result], list[str]]) -> list[str]:
    """What `judge` finds wrong in a check's result; a check that left no result is one reason, with its exit."""
    return [f"{missing}{_exit(code)}"] if result is None else judge(result)


def _exit(code: int | None) -> str:
    return "" if code is None else f" (exit {code}{', timed out' if code == 124 else ''})"


def _dcgm_reasons(report: DiagReport, evidence: Evidence) -> list[str]:
    reasons = [finding.line() for finding in report.findings]
    if report.error is not None:
        reasons.insert(0, f"dcgm: {report.error}{_exit(evidence.dcgm_exit)}")
    elif len(report.gpus) < evidence.expected_gpus:
        reasons.append(f"dcgm: saw {len(report.gpus)} GPUs, the node's type has {evidence.expected_gpus}")
    return reasons


def _gpu_reasons(check: GpuCheck, expected_gpus: int) -> list[str]:
    reasons = []
    if check.devices < expected_gpus:
        reasons.append(f"gpu: CUDA sees {check.devices} GPUs, the node's type has {expected_gpus}")
    seen = {gpu.index for gpu in check.gpus}
    missing = sorted(set(range(check.devices)) - seen)
    if missing:
        reasons.append(f"gpu: no result for GPU {', '.join(map(str, missing))}")
    for gpu in sorted(check.gpus, key=lambda gpu: gpu.index):
        if gpu.error:
            reasons.append(f"gpu {gpu.index}: {gpu.error}")
        elif not (gpu.memory_ok and gpu.compute_ok):
            failed = [name for name, ok in (("memory", gpu.memory_ok), ("compute", gpu.compute_ok)) if not ok]
            reasons.append(f"gpu {gpu.index}: {' and '.join(failed)} check failed")
    if not check.allreduce_ok:
        reasons.append(f"nccl: all-reduce across the node's GPUs failed: {check.allreduce_error or 'wrong sum'}")
    return reasons


def _efa_reasons(check: EfaCheck, expected_efa: int) -> list[str]:
    reasons = []
    if check.error:
        reasons.append(f"efa: {check.error}")
    if check.interfaces < expected_efa:
        reasons.append(f"efa: {check.interfaces} EFA interfaces, the pool expects {expected_efa}")
    if not check.provider_ok:
        reasons.append("efa: fi_info -p efa lists no efa provider (libfabric cannot open the interfaces)")
    if check.memlock_kib is not None:
        reasons.append(f"efa: containers get {check.memlock_kib} KiB of locked memory (ulimit -l); libfabric needs "
                       "unlimited (the node's containerd rlimits: docs/architecture.md, EFA)")
    return reasons


def should_run(node: Mapping[str, Any], label_prefix: str) -> bool:
    """Run the checks unless the node already passed: a DaemonSet pod that restarts on a node in service must
    not run a diagnostic on GPUs a training Job is using. Re-running means removing the label first (runbook)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(f"{label_prefix}/{HEALTH_LABEL}") != PASSED


def hold_patch(node: Mapping[str, Any], label_prefix: str) -> list[dict[str, Any]]:
    """Before the checks: keep cluster-autoscaler from removing the node while they run (guarded like node_patch).
    Nothing to do when the node already carries the annotation (an operator's, or an earlier run's)."""
    metadata = node.get("metadata") or {}
    annotations = dict(metadata.get("annotations") or {})
    if annotations.get(SCALE_DOWN_DISABLED) == "true":
        return []
    annotations[SCALE_DOWN_DISABLED] = "true"
    annotations[f"{label_prefix}/{HELD_ANNOTATION}"] = "true"
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": metadata.get("resourceVersion")},
            {"op": "add", "path": "/metadata/annotations", "value": annotations}]


def reason_text(verdict: Verdict) -> str:
    shown = list(verdict.reasons[:MAX_REASONS])
    if len(verdict.reasons) > MAX_REASONS:
        shown.append(f"... {len(verdict.reasons) - MAX_REASONS} more in the burn-in pod's log")
    text = "\n".join(shown)
    return text if len(text) <= MAX_REASON_CHARS else text[:MAX_REASON_CHARS - 3] + "..."


def node_patch(node: Mapping[str, Any], verdict: Verdict, label_prefix: str, checked_at: str) -> list[dict[str, Any]]:
    """A JSON patch (RFC 6902) recording `verdict` on `node`, guarded by the node's resourceVersion: the API
    server refuses it if anyone changed the node since it was read (read again and recompute)."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    label_key = f"{label_prefix}/{HEALTH_LABEL}"
    taint_key = label_key
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                  "value": metadata.get("resourceVersion")}]
    labels = dict(metadata.get("labels") or {})
    annotations = dict(metadata.get("annotations") or {})
    labels[label_key] = verdict.value
    annotations[f"{label_prefix}/{CHECKED_ANNOTATION}"] = checked_at
    reason_key = f"{label_prefix}/{REASON_ANNOTATION}"
    cordoned_key = f"{label_prefix}/{CORDONED_ANNOTATION}"
    if annotations.pop(f"{label_prefix}/{HELD_ANNOTATION}", None) == "true":
        annotations.pop(SCALE_DOWN_DISABLED, None)  # the verdict is in: a failed node may now be scaled down
    taints = [taint for taint in spec.get("taints") or [] if taint.get("key") != taint_key]
    unschedulable = bool(spec.get("unschedulable"))
    if verdict.passed:
        annotations.pop(reason_key, None)
        if annotations.pop(cordoned_key, None) == "true":
            unschedulable = False
    else:
        annotations[reason_key] = reason_text(verdict)
        taints.append({"key": taint_key, "value": FAILED, "effect": "NoSchedule"})
        if not unschedulable:
            unschedulable = True
            annotations[cordoned_key] = "true"
    ops.append({"op": "add", "path": "/metadata/labels", "value": labels})
    ops.append({"op": "add", "path": "/metadata/annotations", "value": annotations})
    ops.append({"op": "add", "path": "/spec/taints", "value": taints})
    ops.append({"op": "add", "path": "/spec/unschedulable", "value": unschedulable})
    return ops


def read_gpu_check(document: Any) -> GpuCheck:
    """gpucheck's JSON summary; ValueError naming the field when it is not one."""
    if not isinstance(document, dict):
        raise ValueError("gpu.json: not an object")
    devices = document.get("devices")
    if not isinstance(devices, int) or devices < 0:
        raise ValueError("gpu.json: devices: not a count")
    gpus = []
    for index, item in enumerate(_items(document.get("gpus"), "gpus")):
        if not isinstance(item.get("index"), int):
            raise ValueError(f"gpu.json: gpus[{index}].index: not an integer")
        gpus.append(GpuResult(item["index"], str(item.get("name") or ""), item.get("memory_ok") is True,
                              item.get("compute_ok") is True,
                              str(item["error"]) if item.get("error") is not None else None))
    found = document.get("allreduce")
    allreduce: dict[str, Any] = found if isinstance(found, dict) else {}
    busbw = allreduce.get("busbw_gbps")
    return GpuCheck(devices, tuple(gpus), allreduce.get("ok") is True,
                    str(allreduce["error"]) if allreduce.get("error") is not None else None,
                    float(busbw) if isinstance(busbw, int | float) else None)


def read_efa_check(document: Any) -> EfaCheck:
    if not isinstance(document, dict) or not isinstance(document.get("interfaces"), int):
        raise ValueError("efa.json: interfaces: not a count")
    memlock = document.get("memlock_kib")
    if memlock is not None and (isinstance(memlock, bool) or not isinstance(memlock, int) or memlock < 0):
        raise ValueError("efa.json: memlock_kib: not a size in KiB")
    return EfaCheck(document["interfaces"], document.get("provider_ok") is True,
                    str(document["error"]) if document.get("error") is not None else None, memlock)


def _items(value: Any, name: str) -> Sequence[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"gpu.json: {name}: not a list of objects")
    return value


def dumps(verdict: Verdict) -> str:
    return json.dumps({"passed": verdict.passed, "reasons": list(verdict.reasons)}, sort_keys=True)
