"""EKS node auto repair for managed node groups: when it is on, its limits, and what it does for the accelerated-
hardware faults the EKS node monitoring agent reports.

Pure: a pool plan in, the `node_repair_config` of aws.eks.NodeGroup (snake_case keys) out.

The agent reports GPU faults as the node condition `AcceleratedHardwareReady` with a reason per fault
(aws/eks-node-monitoring-agent v1.7.0 `pkg/reasons/reasons.yaml:285-378`). An XID sets the condition only for the
codes in the agent's `WellKnownXidCodes`, as reason `NvidiaXID<code>Error`; other codes are only events
(`monitors/nvidia/dcgm/dcgm_policies.go:98,134-147`, template `NvidiaXID%dError` at `reasons.yaml:354-358`). EKS
takes `Replace`, `Reboot` or `NoAction` for an override (EKS API reference, NodeRepairConfigOverrides); for
AcceleratedHardwareReady its default is "Replace or Reboot" after 10 minutes, and only managed node groups can
Reboot (EKS User Guide, "Automatically repair nodes in EKS clusters").

The overrides make the choice explicit, "replace, don't repair" for hardware: a reboot of an EC2 instance resets
its GPUs (NVIDIA's RESET_GPU bucket: reset, then reboot if it persists), but a GPU that lost memory rows, NVLink or
the PCIe bus needs other hardware, which on EC2 is a new instance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.nodes.poolplan import PoolPlan

ACCELERATED_CONDITION = "AcceleratedHardwareReady"
# The oldest agent whose reasons the overrides below name: v1.6.4 made 46, 62, 109 and 110 well-known XIDs and
# dropped the application-caused 13, 31 and 94 (dcgm_policies.go:27 at v1.6.3 and at v1.6.4).
AGENT_MIN_VERSION = (1, 6, 4)
# EKS's own wait for AcceleratedHardwareReady (User Guide: "Repair after 10m").
REPAIR_WAIT_MINUTES = 10
# A GPU that is gone (off the bus, fewer GPUs than the instance has) is not coming back: replace sooner.
GONE_WAIT_MINUTES = 5


@dataclass(frozen=True)
class RepairOverride:
    reason: str
    action: str  # Replace | Reboot | NoAction
    wait_minutes: int
    why: str

    def to_args(self) -> dict[str, Any]:
        return {"node_monitoring_condition": ACCELERATED_CONDITION, "node_unhealthy_reason": self.reason,
                "repair_action": self.action, "min_repair_wait_time_mins": self.wait_minutes}


def _xid(code: int) -> str:
    return f"NvidiaXID{code}Error"


# reasons.yaml line numbers are at v1.7.0; XID buckets from NVIDIA's catalogue (infra/monitoring/xid.py).
ACCELERATED_OVERRIDES: tuple[RepairOverride, ...] = (
    RepairOverride(_xid(79), "Replace", GONE_WAIT_MINUTES, "fallen off the bus (RESTART_BM): a power cycle, not a "
                   "reboot, brings it back; on EC2 that is another host"),
    RepairOverride("NvidiaDeviceCountMismatch", "Replace", GONE_WAIT_MINUTES,
                   "fewer GPUs than the instance type has (reasons.yaml:311-316)"),
    RepairOverride(_xid(48), "Replace", REPAIR_WAIT_MINUTES, "double-bit ECC (WORKFLOW_XID_48)"),
    RepairOverride("NvidiaDoubleBitError", "Replace", REPAIR_WAIT_MINUTES, "double-bit ECC (reasons.yaml:317-321)"),
    RepairOverride(_xid(64), "Replace", REPAIR_WAIT_MINUTES, "row remap / page retirement failed: memory exhausted"),
    RepairOverride(_xid(95), "Replace", REPAIR_WAIT_MINUTES, "uncontained ECC error"),
    RepairOverride(_xid(140), "Replace", REPAIR_WAIT_MINUTES, "unrecoverable ECC error escape"),
    RepairOverride(_xid(74), "Replace", REPAIR_WAIT_MINUTES, "NVLink error (WORKFLOW_NVLINK_ERR)"),
    RepairOverride("NvidiaNVLinkError", "Replace", REPAIR_WAIT_MINUTES, "NVLink errors (reasons.yaml:327-331)"),
    RepairOverride("DCGMDiagnosticFailure", "Replace", REPAIR_WAIT_MINUTES,
                   "a DCGM active diagnostic failed (reasons.yaml:286-290)"),
    # RESET_GPU bucket, firmware/driver timeouts: a reboot resets the GPU; a repeat shows up as a new condition.
    RepairOverride(_xid(46), "Reboot", REPAIR_WAIT_MINUTES, "GPU stopped processing (RESET_GPU)"),
    RepairOverride(_xid(62), "Reboot", REPAIR_WAIT_MINUTES, "internal micro-controller halt (RESET_GPU)"),
    RepairOverride(_xid(109), "Reboot", REPAIR_WAIT_MINUTES, "context switch timeout (RESET_GPU)"),
    RepairOverride(_xid(119), "Reboot", REPAIR_WAIT_MINUTES, "GSP RPC timeout (RESET_GPU)"),
    RepairOverride(_xid(120), "Reboot", REPAIR_WAIT_MINUTES, "GSP error (RESET_GPU)"),
)


def repair_enabled(plan: PoolPlan) -> bool:
    setting = plan.config.node_repair.enabled
    return plan.is_gpu if setting is None else setting


def max_unhealthy(plan: PoolPlan) -> int:
    configured = plan.config.node_repair.max_unhealthy
    return configured if configured is not None else max(1, -(-plan.config.max_size // 5))


def node_repair_config(plan: PoolPlan) -> dict[str, Any]:
    """The node group's node_repair_config: `{"enabled": False}` when off (explicit, so turning it off in config
    turns it off in EKS)."""
    if not repair_enabled(plan):
        return {"enabled": False}
    cfg = plan.config.node_repair
    config: dict[str, Any] = {
        "enabled": True,
        "max_parallel_nodes_repaired_count": min(cfg.max_parallel, max_unhealthy(plan)),
        "max_unhealthy_node_threshold_count": max_unhealthy(plan),
    }
    if plan.is_gpu and cfg.gpu_overrides:
        config["node_repair_config_overrides"] = [override.to_args() for override in ACCELERATED_OVERRIDES]
    return config
