"""The XID table: which NVIDIA XID codes this stack acts on, what they mean, and what to do about each.

Source: NVIDIA's XID catalogue (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, "Resolution
Bucket (Immediate Action)"), as NVIDIA transcribes it for its own health monitor: NVIDIA/NVSentinel@6f8b0fcfa8
`distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv`, line N = code N (columns: code,
mnemonic, immediate action, FATAL/NONFATAL). The EKS-side view of the same codes: aws/eks-node-monitoring-agent
v1.7.0 `monitors/nvidia/dcgm/dcgm_policies.go:35-98` (its well-known codes, which set AcceleratedHardwareReady).

Our action, per code, is what an operator (or node auto repair) does with the node:
- ignore: the application's fault or informational (RESTART_APP / IGNORE / WORKFLOW_XID_45): the Job's own
  restart handles it; an alert only when a GPU keeps producing them (then suspect the node).
- reset: RESET_GPU for driver/firmware timeouts: drain, reset the GPU (on EC2: reboot the node); replace if it
  comes back.
- drain: cordon and drain now, diagnose (DCGM diag level 3) before the node takes work again.
- replace: the hardware is gone or lost memory integrity (RESTART_BM, uncontained/double-bit ECC, NVLink, failed
  row remap): replace the instance ("replace, don't repair").

workloads never import this: it is monitoring data, read by the alert rules (infra/monitoring/alerts.py), the
decision logic (infra/monitoring/health.py) and docs/monitoring.md's table (tests check they agree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

XidAction = Literal["ignore", "reset", "drain", "replace"]
ACTION_ORDER: dict[str, int] = {"ignore": 0, "reset": 1, "drain": 2, "replace": 3}
XID_CATALOGUE = ("NVIDIA/NVSentinel@6f8b0fcfa8 distros/kubernetes/nvsentinel/charts/gpu-health-monitor/"
                 "xiderrorsmapping.csv")


@dataclass(frozen=True)
class Xid:
    code: int
    mnemonic: str  # NVIDIA's
    meaning: str
    nvidia_action: str  # the catalogue's immediate-action bucket
    action: XidAction

    @property
    def source(self) -> str:
        return f"{XID_CATALOGUE}:{self.code}"


XIDS: tuple[Xid, ...] = (
    Xid(13, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (usually the application)", "RESTART_APP",
        "ignore"),
    Xid(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (illegal address in the application)",
        "RESTART_APP", "ignore"),
    Xid(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing the application's channel",
        "IGNORE", "ignore"),
    Xid(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "preemptive cleanup after the application stopped or another "
        "error", "WORKFLOW_XID_45", "ignore"),
    Xid(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "contained ECC error: only the application hit is terminated",
        "RESTART_APP", "ignore"),
    Xid(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing (timeout)", "RESET_GPU", "reset"),
    Xid(62, "PMU_HALT_ERROR", "internal micro-controller halt", "RESET_GPU", "reset"),
    Xid(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout", "RESET_GPU", "reset"),
    Xid(119, "GSP_RPC_TIMEOUT", "GSP firmware RPC timeout", "RESET_GPU", "reset"),
    Xid(120, "GSP_ERROR", "GSP firmware error", "RESET_GPU", "reset"),
    Xid(63, "INFOROM_DRAM_RETIREMENT_EVENT", "a memory row was remapped / page retired (memory is wearing)",
        "IGNORE", "drain"),
    Xid(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "double-bit ECC error", "WORKFLOW_XID_48", "replace"),
    Xid(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "row remap / page retirement failed: no spare memory left",
        "RESET_GPU", "replace"),
    Xid(74, "NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR", "replace"),
    Xid(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus (PCIe)", "RESTART_BM",
        "replace"),
    Xid(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "uncontained ECC error: every process on the GPU is suspect",
        "RESET_GPU", "replace"),
    Xid(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "unrecoverable ECC error escaped containment", "RESET_GPU",
        "replace"),
)
BY_CODE: dict[int, Xid] = {xid.code: xid for xid in XIDS}


def action_of(code: int) -> XidAction:
    """The action for a code; a code not in the table is drained (unknown is not healthy), except 0 (no XID)."""
    if code == 0:
        return "ignore"
    xid = BY_CODE.get(code)
    return xid.action if xid is not None else "drain"


def codes(action: XidAction) -> list[int]:
    return [xid.code for xid in XIDS if xid.action == action]
