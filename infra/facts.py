"""The stack's facts-and-checks phase: every data-source lookup and every cross-check, before any resource exists.

`stack_facts` asks the data sources once (adopted subnets, instance types, the caller's account, EKS add-on
defaults), renders every stack Job once against the cluster facts, and runs every check that spans sections
(derived names, zones, Kueue quotas, Capacity Block ends). A bad reference is a ConfigError naming the field before
anything is registered. What it returns, `StackFacts`, is all infra/stack.py hands the components: the checked
Job manifests among it, so no Job is rendered again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pulumi_aws as aws

from infra.cluster import find_cluster
from infra.config import ConfigError, StackConfig
from infra.config.names import JOBS_NAMESPACE, PACK_SERVICE_ACCOUNT
from infra.config.stackcheck import (
    JobBucketAccess,
    check_stack,
    fsx_team_claims,
    job_bucket_names,
    job_object_store_buckets,
    unpinned_addons_with_minimum,
)
from infra.context import StackContext, SubnetRef
from infra.controllers import check_job_kinds, trainer_runtimes
from infra.existing_cluster import ClusterAnswerError, FoundCluster, existing_cluster_problems
from infra.jobs import check_jobs
from infra.network import lookup_existing_subnets
from infra.nodes.blockend import block_end_problems, spot_notice_problems
from infra.nodes.burnin import gpu_health_selector
from infra.nodes.coldstart import ColdStart, cold_starts, timeout_problems
from infra.nodes.poolplan import PoolPlan, plan_sound_pools, pool_facts
from infra.packing import pack_bucket_keys
from infra.queueing import kueue_facts, stack_job_queues
from infra.quota import check_queueing
from infra.registry import repository_name, repository_url
from infra.storage import job_storage_facts
from infra.tenancy import team_facts
from infra.topology import gpu_topologies, topology_facts, topology_problems
from workloads.cluster_facts import ClusterFacts

Manifest = dict[str, Any]
_T = TypeVar("_T")
ExistingSubnets = tuple[tuple[SubnetRef, ...], tuple[SubnetRef, ...]]  # (private, public)


@dataclass(frozen=True)
class StackFacts:
    """What the data sources said and the checks accepted; the input of every component."""

    existing_subnets: ExistingSubnets | None  # the adopted VPC's subnets (network.existing), looked up
    existing_cluster: FoundCluster | None  # cluster.existing: what DescribeCluster says of it
    pool_plans: tuple[PoolPlan, ...]  # every pool, resolved against its instance types
    account_id: str | None  # EKS: the caller's account
    image_repository: str | None  # the stack's registry URL, when it has one
    gated: bool  # GPU Jobs, Kueue's GPU flavors and the autoscaler's model of a GPU node need the burn-in's label
    gate_labels: dict[str, str]  # that label ({} without the gate)
    bucket_names: dict[str, str]  # logical bucket -> physical name
    pack_keys: tuple[str, ...]  # the buckets dataset packs write to
    job_facts: ClusterFacts  # what Jobs render against (also the jobFacts output)
    rendered_jobs: tuple[tuple[Manifest, ...], ...]  # each stack Job's checked manifests (Job first), in spec order
    job_access: JobBucketAccess  # which buckets the Jobs read and write
    runtimes: tuple[Mapping[str, Any], ...] = ()  # the stack's ClusterTrainingRuntimes (jobControllers.trainer)
    cold_starts: tuple[ColdStart, ...] = ()  # each EKS GPU pool's cold-start budget (infra/nodes/coldstart.py)
    gang_timeout: str | None = None  # kueue.waitForPodsReady.timeout when the stack runs Kueue

    @property
    def has_gpus(self) -> bool:
        return any(plan.is_gpu for plan in self.pool_plans)

    @property
    def max_processes(self) -> int:
        """The most GPUs (so trainer processes) a pod of any pool can have."""
        return max((pool.gpus_per_node for pool in self.job_facts.pools), default=1)


def stack_facts(cfg: StackConfig, ctx: StackContext) -> StackFacts:
    """Look everything up and check everything; raise ConfigError with all the problems found (a check that fails
    does not stop the next: the later checks run on what passed, so one run shows every problem)."""
    existing_subnets = None
    if cfg.network is not None and cfg.network.existing is not None:
        existing_subnets = lookup_existing_subnets(cfg.network.existing)
    existing_cluster = _existing_cluster(cfg)
    # instance-type facts per pool (aws.ec2.get_instance_type); the sound pools are checked on
    pool_plans, pool_problems = plan_sound_pools(cfg)
    found = _Problems()
    account_id = aws.get_caller_identity().account_id if cfg.platform == "eks" else None
    image_repository = (repository_url(account_id, cfg.region, repository_name(ctx.prefix, cfg.registry))
                        if cfg.platform == "eks" and cfg.registry.enabled and account_id and cfg.region else None)
    # The burn-in's gate: GPU Jobs, Kueue's GPU flavors and the autoscaler's model of a new GPU node all carry the
    # label only the burn-in sets (infra/nodes/burnin.py).
    gated = cfg.gpu.health.gated(cfg.protected) and any(plan.is_gpu for plan in pool_plans)
    gate_labels = dict([gpu_health_selector(cfg.label_prefix)]) if gated else {}
    bucket_names = job_bucket_names(cfg, ctx.stack, account_id)
    pack_keys = tuple(pack_bucket_keys(cfg))
    job_facts = _job_facts(cfg, ctx, pool_plans, gated, image_repository, bucket_names, pack_keys)
    # Every derived physical name valid and unique, pools in zones the network has, Jobs' buckets grantable.
    private_zones = ([ref.availability_zone for ref in existing_subnets[0]] if existing_subnets is not None
                     else None)
    found.run(check_job_kinds, cfg.job_controllers, cfg.jobs)  # a JobSet or TrainJob needs its controller
    rendered = found.run(check_jobs, cfg.jobs, job_facts,
                         keep=_jobs_not_about_pools if _gpu_pool_failed(cfg, pool_problems) else None)
    rendered_jobs = tuple(tuple(manifests) for manifests in rendered or ())
    runtimes = found.run(trainer_runtimes, cfg.job_controllers, job_facts) or ()  # built like the Jobs' pods
    addon_defaults = {name: aws.eks.get_addon_version(addon_name=name, kubernetes_version=cfg.kubernetes_version,
                                                      most_recent=False).version
                      for name in unpinned_addons_with_minimum(cfg)}
    job_access = found.run(check_stack, cfg, ctx.stack, account_id, private_zones, rendered_jobs, addon_defaults)
    # Each GPU pool's cold start, and the gang timeout that must cover it.
    budgets = cold_starts(pool_plans, cfg.nodes.cold_start, cfg.nodes.image_pull.parallel, cfg.gpu.health,
                          cfg.gpu.health.runs(cfg.protected), gpu_topologies(cfg.kueue, pool_plans))
    timeout = cfg.kueue.wait_for_pods_ready.timeout if cfg.kueue.enabled else None
    # Flavors known to the pools, team quotas that fit them, every stack Job's gang within its queue's reach (not
    # with a pool missing: its flavor's quotas would be reported as unknown flavors).
    if not pool_problems:
        found.run(check_queueing, cfg.kueue, pool_plans, cfg.label_prefix, rendered_jobs,
                  stack_job_queues(rendered_jobs, cfg.label_prefix))
        found.problems += topology_problems(cfg.kueue, pool_plans)  # a topology flavor that could never admit a gang
        if timeout is not None:  # the gang timeout below a GPU pool's cold start
            found.problems += [("kueue.waitForPodsReady.timeout", problem)
                               for problem in timeout_problems(timeout, budgets)]
    # Jobs that may run on a Capacity Block write their last checkpoint between EKS's drain and EC2's shutdown.
    # and those that may run on Spot, within the two-minute interruption notice (when every Job rendered).
    found.problems += block_end_problems(pool_plans, rendered_jobs)
    if len(rendered_jobs) == len(cfg.jobs):
        found.problems += spot_notice_problems(pool_plans, cfg.jobs, rendered_jobs)
    if pool_problems or found.problems:
        raise ConfigError([*pool_problems, *found.problems])
    assert job_access is not None
    return StackFacts(existing_subnets=existing_subnets, existing_cluster=existing_cluster, pool_plans=pool_plans,
                      account_id=account_id,
                      image_repository=image_repository, gated=gated, gate_labels=gate_labels,
                      bucket_names=bucket_names, pack_keys=pack_keys, job_facts=job_facts,
                      rendered_jobs=rendered_jobs, job_access=job_access, runtimes=runtimes,
                      cold_starts=tuple(budgets), gang_timeout=timeout)


class _Problems:
    """Every check's ConfigError problems, gathered: a failed check yields None and the next one runs."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def run(self, check: Callable[..., _T], *args: Any,
            keep: Callable[[tuple[str, str]], bool] | None = None) -> _T | None:
        try:
            return check(*args)
        except ConfigError as error:
            self.problems += [problem for problem in error.problems if keep is None or keep(problem)]
            return None


def _gpu_pool_failed(cfg: StackConfig, pool_problems: Sequence[tuple[str, str]]) -> bool:
    failed = {int(match.group(1)) for path, _ in pool_problems
              if (match := re.match(r"^nodePools\.(\d+)", path))}
    return any(cfg.node_pools[index].gpu for index in failed if index < len(cfg.node_pools))


def _jobs_not_about_pools(problem: tuple[str, str]) -> bool:
    """With a GPU pool already reported, a Job's complaint that no pool offers its GPUs may only follow from it."""
    path, _ = problem
    return not path.endswith((".gpuType", ".gpus"))


def _existing_cluster(cfg: StackConfig) -> FoundCluster | None:
    """cluster.existing: the cluster read once, and every way it does not fit the stack file a config error."""
    if cfg.cluster is None or not cfg.cluster.existing:
        return None
    assert cfg.network is not None and cfg.network.existing is not None  # the schema requires it
    try:
        found = find_cluster(cfg.cluster.name)
    except ClusterAnswerError as exc:
        raise ConfigError([("cluster.name", f"aws.eks.get_cluster answered a broken cluster: {exc}")]) from None
    problems = existing_cluster_problems(found, cfg.cluster, cfg.network.existing.vpc_id)
    if problems:
        raise ConfigError(problems)
    return found


def _job_facts(cfg: StackConfig, ctx: StackContext, pool_plans: Sequence[PoolPlan], gated: bool,
               image_repository: str | None, bucket_names: dict[str, str], pack_keys: Sequence[str]) -> ClusterFacts:
    """What a Job renders against: the pools, storage, queues, teams and buckets the config declares."""
    storage_facts = job_storage_facts(cfg.storage, is_eks=cfg.platform == "eks")
    return ClusterFacts(stack=ctx.stack, label_prefix=cfg.label_prefix, pools=pool_facts(pool_plans),
                        gpu_health_gate=gated,
                        namespace=JOBS_NAMESPACE, region=cfg.region,
                        object_store_endpoint=storage_facts.object_store_endpoint,
                        object_store_secret=storage_facts.object_store_secret,
                        object_store_buckets=job_object_store_buckets(cfg, ctx.stack),
                        volume_claims=storage_facts.volume_claims, image_repository=image_repository,
                        buckets=bucket_names, **kueue_facts(cfg.kueue),
                        teams=team_facts(cfg.kueue, fsx_team_claims(cfg)) if cfg.kueue.enabled else None,
                        pack_service_account=PACK_SERVICE_ACCOUNT if pack_keys else None,
                        pack_buckets=tuple(sorted(bucket_names[key] for key in pack_keys)),
                        file_systems=storage_facts.file_systems,
                        topology=topology_facts(cfg.kueue, pool_plans))
