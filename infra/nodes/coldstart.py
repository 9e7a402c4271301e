"""The cold-start budget of a GPU pool: what a gang on a pool at size 0 waits for before its pods are ready, added
up from stated inputs (infra/config/coldstart.py), and the check that Kueue's `waitForPodsReady.timeout` covers it.

    boot to Ready  +  burn-in checks  +  image pulls (training image, DCGM's)  +  first shard

Which part the timeout must cover depends on when Kueue admits (kubernetes-sigs/kueue v0.19.2, read, not run): the
timeout counts from the Workload's Admitted condition (pkg/controller/core/workload_controller.go:1662-1675). On a
flavor without a topology the gang is admitted on quota alone, before any node exists, so it covers all of it. On a
topology flavor (infra/topology.py) admission waits for Ready nodes that carry the flavor's labels, the burn-in's
`gpu-health=passed` among them, so the boot and the burn-in happen before the clock starts; the timeout covers the
training image's pull and the first shard (counted in full, though the burn-in has usually pulled the same image).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from infra.config.coldstart import ColdStartConfig
from infra.config.nodepools import GpuHealthConfig
from infra.nodes.poolplan import PoolPlan
from workloads.quantity import quantity_bytes

MB = 1_000_000
# Model figures for the burn-in's checks (docs/monitoring.md, "How long it takes": DCGM level 1 about a minute, level 2
# a few minutes, the GPU check well under a minute, EFA seconds), in seconds. Each check's deadline is longer
# (gpu.health.checkMinutes): these are what a healthy node takes, not the worst case.
DIAG_SECONDS = {1: 60, 2: 300}
GPU_CHECK_SECONDS = 60
EFA_CHECK_SECONDS = 30


@dataclass(frozen=True)
class ColdStart:
    """One GPU pool's cold start, in seconds, and what of it the gang timeout must cover."""

    pool: str
    instance_type: str
    boot_s: float
    burn_in_s: float
    image_bytes: int  # the training image
    dcgm_bytes: int  # the burn-in's DCGM image (0 without a burn-in)
    pull_rate_mb_s: float
    parallel_pull: bool
    first_shard_s: float
    after_admission: bool  # topology flavor: boot and burn-in happen before Kueue admits

    @property
    def pull_s(self) -> float:
        return (self.image_bytes + self.dcgm_bytes) / (self.pull_rate_mb_s * MB)

    @property
    def total_s(self) -> float:
        return self.boot_s + self.burn_in_s + self.pull_s + self.first_shard_s

    @property
    def timed_s(self) -> float:
        """What `waitForPodsReady.timeout` must cover."""
        if self.after_admission:
            return self.image_bytes / (self.pull_rate_mb_s * MB) + self.first_shard_s
        return self.total_s

    def row(self) -> dict[str, object]:
        """The plan's `coldStart` output row (minutes, one decimal)."""
        return {"pool": self.pool, "instanceType": self.instance_type, "bootMinutes": _min(self.boot_s),
                "burnInMinutes": _min(self.burn_in_s), "pullMinutes": _min(self.pull_s),
                "pullGB": round((self.image_bytes + self.dcgm_bytes) / 1e9, 1), "pullMBps": self.pull_rate_mb_s,
                "parallelPull": self.parallel_pull, "firstShardMinutes": _min(self.first_shard_s),
                "totalMinutes": _min(self.total_s), "timedMinutes": _min(self.timed_s),
                "timedFrom": "admission after Ready nodes" if self.after_admission else "admission on quota"}


def _min(seconds: float) -> float:
    return round(seconds / 60, 1)


def burn_in_seconds(plan: PoolPlan, health: GpuHealthConfig, runs: bool, cold: ColdStartConfig) -> float:
    """The burn-in from Ready to the gpu-health label: stated, or the checks the pool runs (model figures)."""
    if not runs:
        return 0.0
    if cold.burn_in_minutes is not None:
        return cold.burn_in_minutes * 60
    return DIAG_SECONDS[health.diag_level] + GPU_CHECK_SECONDS + (EFA_CHECK_SECONDS if plan.efa_interfaces else 0)


def pull_rate(plan: PoolPlan, cold: ColdStartConfig, parallel: bool) -> tuple[float, bool]:
    """(MB/s, parallel) for the pool's AMI: parallel pull where it is on and the AMI supports it."""
    ami = plan.ami_type or ""
    if parallel and ami.startswith("BOTTLEROCKET"):
        return cold.bottlerocket_parallel_pull_mb_per_s, True
    if parallel and ami.startswith("AL2023"):
        return cold.al2023_parallel_pull_mb_per_s, True
    return cold.serial_pull_mb_per_s, False


def cold_starts(plans: Sequence[PoolPlan], cold: ColdStartConfig, parallel: bool, health: GpuHealthConfig,
                burn_in_runs: bool, topology_gpu_types: Collection[str] = ()) -> list[ColdStart]:
    """The budget of every EKS GPU pool (onprem's existing nodes never boot cold)."""
    result = []
    for plan in plans:
        if not plan.is_gpu or plan.ami_type is None:
            continue
        instance_type = max(plan.config.instance_types, key=cold.boot)  # the slowest type of the pool
        rate, is_parallel = pull_rate(plan, cold, parallel)
        result.append(ColdStart(
            pool=plan.name, instance_type=instance_type, boot_s=cold.boot(instance_type) * 60,
            burn_in_s=burn_in_seconds(plan, health, burn_in_runs, cold),
            image_bytes=quantity_bytes(cold.image_size),
            dcgm_bytes=quantity_bytes(cold.dcgm_image_size) if burn_in_runs else 0,
            pull_rate_mb_s=rate, parallel_pull=is_parallel, first_shard_s=float(cold.first_shard_seconds),
            after_admission=plan.gpu_type in topology_gpu_types))
    return result


def duration_seconds(duration: str) -> int:
    """A Go duration as the config takes it (90s, 15m, 2h) in seconds."""
    return int(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def timeout_problems(timeout: str, budgets: Sequence[ColdStart]) -> list[str]:
    """`kueue.waitForPodsReady.timeout` below a pool's budget (one line per pool, the field's path left to the
    caller): a cold gang there would be evicted before it starts, and requeued to start cold again."""
    seconds = duration_seconds(timeout)
    problems = []
    for budget in budgets:
        if seconds >= budget.timed_s:
            continue
        pulled = (budget.image_bytes + budget.dcgm_bytes) if not budget.after_admission else budget.image_bytes
        parts = ([] if budget.after_admission else
                 [f"boot {_min(budget.boot_s)} min ({budget.instance_type})", f"burn-in {_min(budget.burn_in_s)} min"])
        parts += [f"image pull {_min(pulled / (budget.pull_rate_mb_s * MB))} min ({pulled / 1e9:.1f} GB at "
                  f"{budget.pull_rate_mb_s:g} MB/s, {'parallel' if budget.parallel_pull else 'serial'})",
                  f"first shard {_min(budget.first_shard_s)} min"]
        need = -(-budget.timed_s // 60)
        problems.append(
            f"{timeout} ({seconds / 60:g} min) is below the cold-start budget of "
            f"pool {budget.pool}: {' + '.join(parts)} = {_min(budget.timed_s)} min; a cold gang would be evicted "
            f"and requeued before it starts (set the timeout to at least {need:.0f}m, or shorten the budget: "
            "nodes.imagePull.parallel, a smaller image, nodes.coldStart)")
    return problems
