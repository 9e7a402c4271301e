"""The announced end of a node, for the Jobs that run on it: a Capacity Block's end, and a Spot interruption.

EKS scales a CAPACITY_BLOCK node group to zero 40 minutes before the block ends (a scheduled action on its Auto
Scaling group, "Amazon EKS Node Group Capacity Scaledown Before Reservation End"), which drains the nodes: every pod
gets SIGTERM and its terminationGracePeriodSeconds. EC2 starts shutting the instances down 30 minutes before the end
(awsdocs/amazon-eks-user-guide latest/ug/ml/capacity-blocks-mng.adoc:86-88). That drain is the stop signal: the
trainer's SIGTERM path writes (and mirrors) a last checkpoint and exits with the disruption code, which the Job
retries without spending backoffLimit; the gang resumes from that checkpoint where it is next admitted. The
10 minutes between the two are all a last checkpoint gets, so a Job that may run on a block and needs longer is a
config error: its work since the previous checkpoint would be lost at every block end.

A Spot pool's nodes are reclaimed two minutes after EC2's interruption notice. EKS managed node groups drain a Spot
node on its rebalance recommendation, and at the latest when the two-minute notice arrives before a replacement is
ready (EKS User Guide, managed-node-groups "Managed node group capacity types", Spot), so the stop path may have
only those 120 s. The trainer's stop path waits for the whole save (the local tier and then the copy to the remote
tier: a Spot node's NVMe goes with the instance, so only the remote copy survives it), so what must fit is the stop
base plus both writes of the per-rank share, not only the local write: a Job on a Spot pool that needs longer is a
config error naming the numbers.

This leaves the stop to EKS rather than deriving a Job's activeDeadlineSeconds from the end: a deadline counts from
the Job's start, which Kueue decides later than the plan is rendered, and an expired deadline fails the Job (counted,
not retried), where a drain is a disruption the Job and Kueue already handle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.nodes.poolplan import PoolPlan
from workloads.jobspec.fields import STOP_BASE_S
from workloads.jobspec.kinds import run_pod_spec
from workloads.jobspec.spec import TrainingJobSpec

EKS_DRAIN_BEFORE_END_S = 40 * 60
EC2_SHUTDOWN_BEFORE_END_S = 30 * 60
LAST_CHECKPOINT_WINDOW_S = EKS_DRAIN_BEFORE_END_S - EC2_SHUTDOWN_BEFORE_END_S
SPOT_NOTICE_S = 120  # EC2 reclaims a Spot instance two minutes after its interruption notice


def _lands_on(pod: Mapping[str, Any], plan: PoolPlan) -> bool:
    """Whether the scheduler may put the pod on the pool's nodes (its nodeSelector against the pool's labels)."""
    return all(plan.labels.get(key) == value for key, value in (pod.get("nodeSelector") or {}).items())


def block_end_problems(plans: Sequence[PoolPlan], jobs: Sequence[Sequence[Mapping[str, Any]]],
                       ) -> list[tuple[str, str]]:
    """One problem per stack Job that may run on a Capacity Block pool with a grace period longer than the last
    checkpoint's window at the block's end."""
    blocks = [plan for plan in plans if plan.config.capacity_type == "CAPACITY_BLOCK"]
    problems = []
    for index, manifests in enumerate(jobs):
        pod = run_pod_spec(manifests)
        grace = int(pod.get("terminationGracePeriodSeconds") or 30)
        on = [plan.name for plan in blocks if _lands_on(pod, plan)]
        if on and grace > LAST_CHECKPOINT_WINDOW_S:
            problems.append((f"ml-cluster:jobs[{index}]",
                             f"may run on Capacity Block pool {', '.join(on)}, whose nodes EKS drains 40 min before "
                             f"the block ends and EC2 shuts down 30 min before it: a last checkpoint gets "
                             f"{LAST_CHECKPOINT_WINDOW_S} s, this Job takes up to {grace} s "
                             "(terminationGracePeriodSeconds, from checkpoint.size and writeRate unless set); write "
                             "a smaller or faster checkpoint, or select a pool that is not a block"))
    return problems


def spot_notice_problems(plans: Sequence[PoolPlan], specs: Sequence[TrainingJobSpec],
                         jobs: Sequence[Sequence[Mapping[str, Any]]]) -> list[tuple[str, str]]:
    """One problem per stack Job with a checkpoint that may run on a Spot pool and whose stop (the stop base plus
    the whole save, both tiers) cannot finish within the 120 s interruption notice."""
    spots = [plan for plan in plans if plan.config.capacity_type == "SPOT"]
    problems = []
    for index, (spec, manifests) in enumerate(zip(specs, jobs, strict=True)):
        if spec.checkpoint is None:
            continue
        on = [plan.name for plan in spots if _lands_on(run_pod_spec(manifests), plan)]
        needed = spec.stop_seconds()
        if on and needed > SPOT_NOTICE_S:
            problems.append((f"ml-cluster:jobs[{index}]",
                             f"may run on Spot pool {', '.join(on)}, whose nodes EC2 reclaims {SPOT_NOTICE_S} s "
                             f"after the interruption notice, but its stop takes {needed} s: {STOP_BASE_S} s stop base"
                             f" + {spec.checkpoint_save_reason()} (the stop waits for the remote copy: the "
                             "node's NVMe goes with it); shrink the per-rank share (more ranks, checkpoint.sharded), "
                             "raise checkpoint.localWriteRate or writeRate to what the tiers measure, or select a pool "
                             "that is not Spot"))
    return problems
