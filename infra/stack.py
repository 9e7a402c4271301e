"""Build the whole stack from its config: network -> cluster -> node pools -> storage -> GPU plumbing -> jobs.

Each capability is one component; this module only wires their typed outputs into the next one's args.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from infra.cluster import EksCluster, EksClusterArgs, ExistingCluster, ExistingClusterArgs
from infra.config import ConfigError, StackConfig
from infra.config.deploy import public_access_cidrs
from infra.config.names import JOBS_NAMESPACE, PACK_SERVICE_ACCOUNT, stack_prefix
from infra.config.stackcheck import (
    check_stack,
    job_bucket_names,
    job_object_store_buckets,
    unpinned_addons_with_minimum,
)
from infra.context import ClusterInfo, NetworkInfo, StackContext
from infra.controllers import JobControllers, JobControllersArgs
from infra.jobs import TrainingJobs, TrainingJobsArgs, TrainingNamespace, TrainingNamespaceArgs, check_jobs
from infra.monitoring.component import Monitoring, MonitoringArgs
from infra.monitoring.reservations import reserved_pools
from infra.network import Network, NetworkArgs, lookup_existing_subnets
from infra.nodes.blockend import block_end_problems
from infra.nodes.burnin import GpuBurnIn, GpuBurnInArgs, burnin_manifests, gpu_health_selector
from infra.nodes.gpu import GpuPlumbing, GpuPlumbingArgs
from infra.nodes.nodepools import NodePools, NodePoolsArgs
from infra.nodes.poolplan import plan_node_pools, pool_facts
from infra.packing import DatasetPacker, DatasetPackerArgs, pack_bucket_keys
from infra.queueing import Queueing, QueueingArgs, check_queueing, kueue_facts, queue_manifests, stack_job_queues
from infra.registry import ImageRegistry, ImageRegistryArgs, repository_name, repository_url
from infra.storage import Storage, StorageArgs, job_storage_facts
from infra.tenancy import Teams, TeamsArgs, team_access_entries, team_access_policy, team_facts, team_manifests
from workloads.cluster_facts import ClusterFacts, facts_to_dict
from workloads.jobspec import metrics_ports

__all__ = ["JOBS_NAMESPACE", "build_stack", "stack_context"]  # JOBS_NAMESPACE: Jobs, claims, the COS Secret


def stack_context(cfg: StackConfig, project: str, stack: str) -> StackContext:
    tags = {"project": project, "stack": stack, "managed-by": "pulumi", **cfg.tags}
    return StackContext(project=project, stack=stack, prefix=stack_prefix(stack), label_prefix=cfg.label_prefix,
                        protected=cfg.protected, region=cfg.region, tags=tags)


def build_stack(cfg: StackConfig, ctx: StackContext) -> dict[str, pulumi.Input[object]]:
    """Create every resource of the stack; return the stack outputs."""
    outputs: dict[str, pulumi.Input[object]] = {"platform": cfg.platform,
                                                "kubernetesVersion": cfg.kubernetes_version}

    # --- facts: every data-source lookup and cross-check runs here, before any resource is registered ---
    existing_subnets = None
    if cfg.network is not None and cfg.network.existing is not None:
        existing_subnets = lookup_existing_subnets(cfg.network.existing)
    pool_plans = plan_node_pools(cfg)  # instance-type facts per pool (aws.ec2.get_instance_type); ConfigError
    storage_facts = job_storage_facts(cfg.storage, is_eks=cfg.platform == "eks")
    account_id = aws.get_caller_identity().account_id if cfg.platform == "eks" else None
    has_registry = cfg.platform == "eks" and cfg.registry.enabled
    image_repository = (repository_url(account_id, cfg.region, repository_name(ctx.prefix, cfg.registry))
                        if has_registry and account_id and cfg.region else None)
    # The burn-in's gate: GPU Jobs, Kueue's GPU flavors and the autoscaler's model of a new GPU node all carry the
    # label only the burn-in sets (infra/nodes/burnin.py).
    has_gpus = any(plan.is_gpu for plan in pool_plans)
    gated = cfg.gpu.health.gated(cfg.protected) and has_gpus
    gate_labels = dict([gpu_health_selector(cfg.label_prefix)]) if gated else {}
    bucket_names = job_bucket_names(cfg, ctx.stack, account_id)
    pack_keys = pack_bucket_keys(cfg)
    job_facts = ClusterFacts(stack=ctx.stack, label_prefix=cfg.label_prefix, pools=pool_facts(pool_plans),
                             gpu_health_gate=gated,
                             namespace=JOBS_NAMESPACE, region=cfg.region,
                             object_store_endpoint=storage_facts.object_store_endpoint,
                             object_store_secret=storage_facts.object_store_secret,
                             object_store_buckets=job_object_store_buckets(cfg, ctx.stack),
                             volume_claims=storage_facts.volume_claims, image_repository=image_repository,
                             buckets=bucket_names, **kueue_facts(cfg.kueue),
                             teams=team_facts(cfg.kueue) if cfg.kueue.enabled else None,
                             pack_service_account=PACK_SERVICE_ACCOUNT if pack_keys else None,
                             pack_buckets=tuple(sorted(bucket_names[key] for key in pack_keys)))
    team_namespaces = {team.name: team.namespace for team in cfg.kueue.tenant_teams if team.namespace is not None}
    # Every derived physical name valid and unique, pools in zones the network has, Jobs' buckets grantable.
    private_zones = ([ref.availability_zone for ref in existing_subnets[0]] if existing_subnets is not None
                     else None)
    try:
        # every stack Job fits the pools it targets (a team's Job: in its team's namespace); ConfigError
        rendered_jobs = check_jobs(cfg.jobs, job_facts)
    except ConfigError as job_error:  # a bad Job must not hide the stack's other problems
        try:
            check_stack(cfg, ctx.stack, account_id, private_zones)
        except ConfigError as other:
            raise ConfigError([*job_error.problems, *other.problems]) from None
        raise
    addon_defaults = {name: aws.eks.get_addon_version(addon_name=name, kubernetes_version=cfg.kubernetes_version,
                                                      most_recent=False).version
                      for name in unpinned_addons_with_minimum(cfg)}
    job_access = check_stack(cfg, ctx.stack, account_id, private_zones, rendered_jobs, addon_defaults)
    # Flavors known to the pools, team quotas that fit them, every stack Job's gang within its queue's reach.
    check_queueing(cfg.kueue, pool_plans, cfg.label_prefix, rendered_jobs,
                   stack_job_queues(rendered_jobs, cfg.label_prefix))
    # Jobs that may run on a Capacity Block write their last checkpoint between EKS's drain and EC2's shutdown.
    block_end = block_end_problems(pool_plans, rendered_jobs)
    if block_end:
        raise ConfigError(block_end)

    # --- network + cluster ---
    network: NetworkInfo | None = None
    cluster: ClusterInfo
    if cfg.platform == "eks":
        assert cfg.network is not None and cfg.cluster is not None
        network = Network(f"{ctx.prefix}-network", NetworkArgs(
            ctx=ctx, config=cfg.network, cluster_name=cfg.cluster.name, existing_subnets=existing_subnets)).info
        eks = EksCluster(f"{ctx.prefix}-cluster", EksClusterArgs(
            ctx=ctx, config=cfg.cluster, network=network,
            public_access_cidrs=tuple(public_access_cidrs(cfg.cluster, cfg.deploy))))
        cluster = eks.info
        outputs.update({
            "region": cfg.region,
            "clusterEndpoint": eks.endpoint,
            "kubeconfig": eks.kubeconfig,
            "vpcId": network.vpc_id,
            "privateSubnetIds": [ref.id for ref in network.private_subnets],
            "publicSubnetIds": [ref.id for ref in network.public_subnets],
            "subnetAzs": pulumi.Output.all(*[ref.id for ref in network.private_subnets]).apply(
                lambda ids: dict(zip(ids, [ref.availability_zone for ref in network.private_subnets], strict=True))),
            "nodeSecurityGroupId": cluster.node_security_group_id,
        })
    else:
        assert cfg.onprem is not None and cfg.kubeconfig is not None
        existing = ExistingCluster(f"{ctx.prefix}-cluster", ExistingClusterArgs(
            ctx=ctx, config=cfg.onprem, kubeconfig=pulumi.Output.secret(cfg.kubeconfig.get_secret_value())))
        cluster = existing.info
        outputs["kubeconfig"] = existing.kubeconfig
    outputs["clusterName"] = cluster.name

    # --- the training image's repository: Jobs with an `imageTag` run <repository>:<tag> ---
    if has_registry:
        registry = ImageRegistry(f"{ctx.prefix}-registry", ImageRegistryArgs(ctx=ctx, config=cfg.registry))
        outputs["imageRepository"] = registry.url

    # --- node pools ---
    node_groups: list[pulumi.Resource] = []
    if network is not None:
        pools = NodePools(f"{ctx.prefix}-nodepools", NodePoolsArgs(
            ctx=ctx, cluster=cluster, network=network, pools=tuple(p for p in pool_plans if p.ami_type),
            gpu_node_labels=gate_labels))
        node_groups = list(pools.node_groups.values())
    outputs["nodePools"] = {plan.name: {
        "gpuType": plan.gpu_type, "gpusPerNode": plan.gpus_per_node, "nvmeGib": plan.nvme_gib,
        "cpuPerGpuMillicores": plan.cpu_per_gpu_millicores, "memoryPerGpuBytes": plan.memory_per_gpu_bytes,
        **({"reservation": plan.config.capacity_reservation.output()}
           if plan.config.capacity_reservation is not None else {}),
    } for plan in pool_plans}

    # --- the Jobs' namespace: storage puts its claims and the COS Secret in it ---
    monitoring = cfg.monitoring
    namespace = TrainingNamespace(ctx, TrainingNamespaceArgs(
        cluster=cluster, facts=job_facts, egress=cfg.job_egress.rules(cfg.platform),
        metrics_namespace=monitoring.namespace if monitoring.enabled else None,
        metrics_ports=metrics_ports(max((pool.gpus_per_node for pool in job_facts.pools), default=1))))

    # --- storage ---
    storage = Storage(ctx, StorageArgs(
        config=cfg.storage, cluster=cluster, network=network, namespace=JOBS_NAMESPACE,
        namespace_resource=namespace.namespace,
        node_pools=node_groups,
        cos_access_key_id=cfg.cos_hmac_access_key_id, cos_secret_access_key=cfg.cos_hmac_secret_access_key))
    outputs["storage"] = storage.outputs(cluster, network)

    # --- metrics collection: before the GPU plumbing, whose DCGM ServiceMonitor needs the operator's CRDs ---
    max_processes = max((pool.gpus_per_node for pool in job_facts.pools), default=1)
    monitors: tuple[pulumi.Resource, ...] = ()
    if monitoring.enabled:
        collection = Monitoring(f"{ctx.prefix}-monitoring", MonitoringArgs(
            ctx=ctx, cluster=cluster, config=monitoring, training_namespace=JOBS_NAMESPACE,
            team_namespaces=tuple(sorted(team_namespaces.values())) if cfg.kueue.enabled else (),
            max_processes_per_pod=max_processes, account_id=account_id, pools=reserved_pools(pool_plans),
            depends_on=(*node_groups, *storage.driver_resources)))
        monitors = (collection.release,)
        outputs["monitoringNamespace"] = monitoring.namespace

    # --- GPU plumbing ---
    gpu = GpuPlumbing(f"{ctx.prefix}-gpu", GpuPlumbingArgs(
        ctx=ctx, cluster=cluster, config=cfg.gpu, pools=pool_plans, cluster_name=cfg.cluster_name,
        kubernetes_version=cfg.kubernetes_version, depends_on=(*node_groups, *storage.driver_resources, *monitors),
        node_monitoring_agent_version={str(k): v for k, v in cfg.storage.addon_versions.items()}.get(
            "eks-node-monitoring-agent"),
        node_groups=tuple(node_groups)))

    # --- GPU burn-in: every new GPU node is checked and labelled before the gate lets a Job onto it ---
    health = cfg.gpu.health
    if health.runs(cfg.protected) and has_gpus:
        image = health.image or f"{image_repository}:{health.image_tag}"
        burn_in = GpuBurnIn(f"{ctx.prefix}-gpu-health", GpuBurnInArgs(
            ctx=ctx, cluster=cluster,
            manifests=tuple(burnin_manifests(health, pool_plans, image, ctx.stack, cfg.label_prefix)),
            depends_on=tuple(node_groups)))
        outputs["gpuHealth"] = {"namespace": health.namespace, "gate": gated,
                                "daemonSets": [d.metadata.name for d in burn_in.daemonsets]}

    # --- teams: a namespace, quota, service account and bucket role of their own (before their LocalQueues) ---
    team_needs: dict[str, list[pulumi.Resource]] = {}
    if cfg.kueue.enabled and cfg.kueue.tenant_teams:
        teams = Teams(f"{ctx.prefix}-teams", TeamsArgs(
            ctx=ctx, cluster=cluster,
            manifests=team_manifests(cfg.kueue, pool_plans, ctx.stack, cfg.label_prefix, job_facts.job_service_account,
                                     egress=cfg.job_egress.rules(cfg.platform),
                                     metrics_namespace=monitoring.namespace if monitoring.enabled else None,
                                     metrics_ports=metrics_ports(max_processes)),
            policies={team.name: team_access_policy(team, bucket_names) for team in cfg.kueue.tenant_teams
                      if cfg.platform == "eks" and team.data},
            access_entries=team_access_entries(cfg.kueue, cfg.label_prefix) if cfg.platform == "eks" else (),
            volumes={team.name: (team, team.volume) for team in cfg.kueue.tenant_teams if team.volume is not None},
            file_system_id=storage.file_system_id, storage_needs=storage.driver_resources))
        team_needs = {team: [namespace_resource, *teams.accounts.get(team, [])]
                      for team, namespace_resource in teams.namespaces.items()}
        outputs["teams"] = {"namespaces": team_namespaces, "roleArns": teams.role_arns}

    # --- Kueue: gang admission and the GPU quota shared between teams ---
    local_queues: dict[str, pulumi.Resource] = {}
    if cfg.kueue.enabled:
        queueing = Queueing(f"{ctx.prefix}-kueue", QueueingArgs(
            ctx=ctx, cluster=cluster, config=cfg.kueue,
            manifests=tuple(queue_manifests(cfg.kueue, pool_plans, JOBS_NAMESPACE, ctx.stack, cfg.label_prefix,
                                            gate_labels)),
            depends_on=(*node_groups, namespace.namespace, *(needs[0] for needs in team_needs.values()))))
        local_queues = queueing.local_queues

    # --- gang controllers: JobSet and Kubeflow Trainer v2 (with the stack's ClusterTrainingRuntimes) ---
    controller_releases: list[pulumi.Resource] = []
    if cfg.job_controllers.jobset.enabled:  # trainer needs it (config)
        controller_releases = JobControllers(f"{ctx.prefix}-controllers", JobControllersArgs(
            ctx=ctx, cluster=cluster, config=cfg.job_controllers, depends_on=tuple(node_groups))).releases

    # --- dataset packs (submit pack): their own account, writing only the packInto buckets ---
    if pack_keys:
        packer = DatasetPacker(ctx, DatasetPackerArgs(
            cluster=cluster, namespace=JOBS_NAMESPACE, namespace_resource=namespace.namespace,
            bucket_arns=dict(storage.bucket_arns), writable=pack_keys))
        outputs["packRoleArn"] = packer.role_arn

    # --- training jobs ---
    # The Jobs were checked against claim names derived from config; they must be the claims Storage made.
    created_claims = {*storage.dataset_claim_names.values(), *storage.shared_claim_names}
    assert created_claims == set(job_facts.volume_claims or ()), "job_storage_facts disagrees with Storage"
    jobs = TrainingJobs(ctx, TrainingJobsArgs(
        cluster=cluster, facts=job_facts, specs=cfg.jobs, namespace=namespace.namespace,
        bucket_arns=dict(storage.bucket_arns), bucket_access=job_access,
        depends_on=(*storage.driver_resources, *storage.kubernetes_objects, *gpu.releases.values(),
                    *controller_releases),
        local_queues=local_queues, team_needs=team_needs))
    outputs["jobFacts"] = facts_to_dict(job_facts)  # `python -m workloads.submit ... --facts` reads this
    outputs["jobs"] = jobs.job_names

    return outputs
