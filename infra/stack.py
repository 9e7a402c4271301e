"""Build the whole stack from its config: facts and checks -> network -> cluster -> node pools -> storage -> GPU
plumbing -> jobs.

`infra.facts.stack_facts` runs first: every data-source lookup and cross-check, before any resource is registered,
and every stack Job rendered once. Each capability is then one component; this module only wires their typed
outputs into the next one's args.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi

from infra.cluster import (
    EksCluster,
    EksClusterArgs,
    ExistingCluster,
    ExistingClusterArgs,
    ExistingEksCluster,
    ExistingEksClusterArgs,
)
from infra.config import StackConfig
from infra.config.deploy import public_access_cidrs
from infra.config.names import JOBS_NAMESPACE, stack_prefix
from infra.config.stackcheck import fsx_team_associations
from infra.context import ClusterInfo, NetworkInfo, StackContext
from infra.controllers import JobControllers, JobControllersArgs
from infra.facts import StackFacts, stack_facts
from infra.jobfacts import publish_job_facts
from infra.jobs import TrainingJobs, TrainingJobsArgs, TrainingNamespace, TrainingNamespaceArgs
from infra.monitoring.component import Monitoring, MonitoringArgs
from infra.monitoring.reservations import reserved_pools
from infra.network import Network, NetworkArgs
from infra.nodes.burnin import GpuBurnIn, GpuBurnInArgs, burnin_manifests
from infra.nodes.gpu import GpuPlumbing, GpuPlumbingArgs
from infra.nodes.nodepools import NodePools, NodePoolsArgs
from infra.packing import DatasetPacker, DatasetPackerArgs
from infra.queueing import Queueing, QueueingArgs, kueue_manifests
from infra.registry import ImageRegistry, ImageRegistryArgs
from infra.storage import Storage, StorageArgs, fsx_boot_scripts
from infra.tenancy import (
    Teams,
    TeamsArgs,
    kueue_viewer_role,
    team_access_entries,
    team_access_policy,
    team_manifests,
)
from infra.topology import provisioning_on
from workloads.cluster_facts import facts_to_dict
from workloads.jobspec import metrics_ports
from workloads.jobspec.prediction import GOODPUT_OUTPUT, job_goodput_output

__all__ = ["JOBS_NAMESPACE", "build_stack", "stack_context"]  # JOBS_NAMESPACE: Jobs, claims, the COS Secret

Outputs = dict[str, pulumi.Input[object]]


def stack_context(cfg: StackConfig, project: str, stack: str) -> StackContext:
    tags = {"project": project, "stack": stack, "managed-by": "pulumi", **cfg.tags}
    return StackContext(project=project, stack=stack, prefix=stack_prefix(stack), label_prefix=cfg.label_prefix,
                        protected=cfg.protected, region=cfg.region, tags=tags)


def build_stack(cfg: StackConfig, ctx: StackContext) -> Outputs:
    """Check everything, then create every resource of the stack; return the stack outputs."""
    facts = stack_facts(cfg, ctx)  # ConfigError before any resource is registered
    outputs: Outputs = {"platform": cfg.platform, "kubernetesVersion": cfg.kubernetes_version}
    network, cluster = _network_and_cluster(cfg, ctx, facts, outputs)
    # --- the training image's repository: Jobs with an `imageTag` run <repository>:<tag> ---
    if cfg.platform == "eks" and cfg.registry.enabled:
        registry = ImageRegistry(f"{ctx.prefix}-registry", ImageRegistryArgs(ctx=ctx, config=cfg.registry))
        outputs["imageRepository"] = registry.url
    node_groups = _node_pools(ctx, facts, cluster, network, outputs, fsx_boot_scripts(cfg.storage, facts.pool_plans),
                              cfg.nodes.image_pull.parallel, cfg.nodes.autoscaler.scale_down_unneeded_time)

    # --- the Jobs' namespace: storage puts its claims and the COS Secret in it ---
    monitoring = cfg.monitoring
    namespace = TrainingNamespace(ctx, TrainingNamespaceArgs(
        cluster=cluster, facts=facts.job_facts, egress=cfg.job_egress.rules(cfg.platform),
        metrics_namespace=monitoring.prometheus_namespace if monitoring.enabled else None,
        metrics_ports=metrics_ports(facts.max_processes)))
    storage = Storage(ctx, StorageArgs(
        config=cfg.storage, cluster=cluster, network=network, namespace=JOBS_NAMESPACE,
        namespace_resource=namespace.namespace,
        node_pools=node_groups,
        cos_access_key_id=cfg.cos_hmac_access_key_id, cos_secret_access_key=cfg.cos_hmac_secret_access_key,
        fsx_team_associations=tuple(dra for _, dra in fsx_team_associations(cfg))))
    outputs["storage"] = storage.outputs(cluster, network)

    monitors = _monitoring(cfg, ctx, facts, cluster, (*node_groups, *storage.driver_resources), outputs)
    gpu = _gpu_plumbing(cfg, ctx, facts, cluster, node_groups, (*node_groups, *storage.driver_resources, *monitors),
                        outputs)
    team_needs = _teams(cfg, ctx, facts, cluster, storage, outputs)
    local_queues = _queueing(cfg, ctx, facts, cluster, (*node_groups, namespace.namespace,
                                                        *(needs[0] for needs in team_needs.values())))

    # --- gang controllers: JobSet and Kubeflow Trainer v2 (with the stack's ClusterTrainingRuntimes) ---
    controller_releases: list[pulumi.Resource] = []
    if cfg.job_controllers.jobset.enabled:  # trainer needs it (config)
        controller_releases = JobControllers(f"{ctx.prefix}-controllers", JobControllersArgs(
            ctx=ctx, cluster=cluster, config=cfg.job_controllers, runtimes=facts.runtimes,
            depends_on=tuple(node_groups))).releases

    # --- dataset packs (submit pack): their own account, writing only the packInto buckets ---
    if facts.pack_keys:
        packer = DatasetPacker(ctx, DatasetPackerArgs(
            cluster=cluster, namespace=JOBS_NAMESPACE, namespace_resource=namespace.namespace,
            bucket_arns=dict(storage.bucket_arns), writable=list(facts.pack_keys)))
        outputs["packRoleArn"] = packer.role_arn

    # --- training jobs: the manifests checked in the facts phase, not rendered again ---
    # The Jobs were checked against claim names derived from config; they must be the claims Storage made.
    created_claims = {*storage.dataset_claim_names.values(), *storage.shared_claim_names}
    assert created_claims == set(facts.job_facts.volume_claims or ()), "job_storage_facts disagrees with Storage"
    jobs = TrainingJobs(ctx, TrainingJobsArgs(
        cluster=cluster, facts=facts.job_facts, specs=cfg.jobs, rendered=facts.rendered_jobs,
        namespace=namespace.namespace, bucket_arns=dict(storage.bucket_arns), bucket_access=facts.job_access,
        depends_on=(*storage.driver_resources, *storage.kubernetes_objects, *gpu.releases.values(),
                    *controller_releases),
        local_queues=local_queues, team_needs=team_needs))
    outputs["jobFacts"] = facts_to_dict(facts.job_facts)  # `python -m workloads.submit ... --facts` reads this
    # ... and the same in the cluster, where submit reads it through a kubeconfig alone
    publish_job_facts(ctx, cluster, facts.job_facts, namespace.namespace,
                      {team: needs[0] for team, needs in team_needs.items()})
    outputs["jobs"] = jobs.job_names
    outputs[GOODPUT_OUTPUT] = job_goodput_output(cfg.jobs, facts.job_facts)  # the plan summary's prediction
    return outputs


def _network_and_cluster(cfg: StackConfig, ctx: StackContext, facts: StackFacts,
                         outputs: Outputs) -> tuple[NetworkInfo | None, ClusterInfo]:
    """EKS: the VPC (created or adopted) and the cluster; onprem: the existing cluster, reached by its kubeconfig."""
    if cfg.platform != "eks":
        assert cfg.onprem is not None and cfg.kubeconfig is not None
        existing = ExistingCluster(f"{ctx.prefix}-cluster", ExistingClusterArgs(
            ctx=ctx, config=cfg.onprem, kubeconfig=pulumi.Output.secret(cfg.kubeconfig.get_secret_value())))
        outputs["kubeconfig"] = existing.kubeconfig
        outputs["clusterName"] = existing.info.name
        return None, existing.info
    assert cfg.network is not None and cfg.cluster is not None
    network = Network(f"{ctx.prefix}-network", NetworkArgs(
        ctx=ctx, config=cfg.network, cluster_name=cfg.cluster.name, existing_subnets=facts.existing_subnets)).info
    eks: EksCluster | ExistingEksCluster
    if facts.existing_cluster is not None:  # read, never owned: no cluster, VPC or subnet in the plan
        eks = ExistingEksCluster(f"{ctx.prefix}-cluster", ExistingEksClusterArgs(
            ctx=ctx, config=cfg.cluster, network=network, found=facts.existing_cluster))
    else:
        eks = EksCluster(f"{ctx.prefix}-cluster", EksClusterArgs(
            ctx=ctx, config=cfg.cluster, network=network,
            public_access_cidrs=tuple(public_access_cidrs(cfg.cluster, cfg.deploy))))
    outputs.update({
        "region": cfg.region,
        "clusterEndpoint": eks.endpoint,
        "kubeconfig": eks.kubeconfig,
        "vpcId": network.vpc_id,
        "privateSubnetIds": [ref.id for ref in network.private_subnets],
        "publicSubnetIds": [ref.id for ref in network.public_subnets],
        "subnetAzs": pulumi.Output.all(*[ref.id for ref in network.private_subnets]).apply(
            lambda ids: dict(zip(ids, [ref.availability_zone for ref in network.private_subnets], strict=True))),
        "nodeSecurityGroupId": eks.info.node_security_group_id,
        "clusterName": eks.info.name,
    })
    return network, eks.info


def _node_pools(ctx: StackContext, facts: StackFacts, cluster: ClusterInfo, network: NetworkInfo | None,
                outputs: Outputs, boot_scripts: dict[str, tuple[str, ...]],
                parallel_pull: bool, scale_down: str) -> list[pulumi.Resource]:
    """The managed node groups (EKS); the nodePools output for every pool (onprem: the existing nodes' shape)."""
    node_groups: list[pulumi.Resource] = []
    if network is not None:
        pools = NodePools(f"{ctx.prefix}-nodepools", NodePoolsArgs(
            ctx=ctx, cluster=cluster, network=network, pools=tuple(p for p in facts.pool_plans if p.ami_type),
            gpu_node_labels=facts.gate_labels, boot_scripts=boot_scripts,
            parallel_pull=parallel_pull))
        node_groups = list(pools.node_groups.values())
    outputs["nodePools"] = {plan.name: {
        "gpuType": plan.gpu_type, "gpusPerNode": plan.gpus_per_node, "nvmeGib": plan.nvme_gib,
        "cpuPerGpuMillicores": plan.cpu_per_gpu_millicores, "memoryPerGpuBytes": plan.memory_per_gpu_bytes,
        **({"reservation": plan.config.capacity_reservation.output()}
           if plan.config.capacity_reservation is not None else {}),
    } for plan in facts.pool_plans}
    if facts.cold_starts:  # what a cold gang waits for, per GPU pool (the plan summary's table)
        outputs["coldStart"] = {"timeout": facts.gang_timeout, "pools": [budget.row() for budget in facts.cold_starts],
                                "scaleDownUnneededTime": scale_down}
    return node_groups


def _monitoring(cfg: StackConfig, ctx: StackContext, facts: StackFacts, cluster: ClusterInfo,
                depends_on: Sequence[pulumi.Resource], outputs: Outputs) -> tuple[pulumi.Resource, ...]:
    """Metrics collection (optional): before the GPU plumbing, whose DCGM ServiceMonitor needs the operator's
    CRDs. Returns what the GPU plumbing waits for."""
    monitoring = cfg.monitoring
    if not monitoring.enabled:
        return ()
    team_namespaces = {team.name: team.namespace for team in cfg.kueue.tenant_teams if team.namespace is not None}
    collection = Monitoring(f"{ctx.prefix}-monitoring", MonitoringArgs(
        ctx=ctx, cluster=cluster, config=monitoring, training_namespace=JOBS_NAMESPACE,
        team_namespaces=tuple(sorted(team_namespaces.values())) if cfg.kueue.enabled else (),
        max_processes_per_pod=facts.max_processes, account_id=facts.account_id,
        pools=reserved_pools(facts.pool_plans), depends_on=tuple(depends_on)))
    outputs["monitoringNamespace"] = monitoring.prometheus_namespace
    return (collection.release,) if collection.release is not None else ()


def _gpu_plumbing(cfg: StackConfig, ctx: StackContext, facts: StackFacts, cluster: ClusterInfo,
                  node_groups: Sequence[pulumi.Resource], depends_on: Sequence[pulumi.Resource],
                  outputs: Outputs) -> GpuPlumbing:
    """Device plugins, DCGM, the cluster-autoscaler, the node monitoring agent; then the GPU burn-in: every new GPU
    node is checked and labelled before the gate lets a Job onto it."""
    gpu = GpuPlumbing(f"{ctx.prefix}-gpu", GpuPlumbingArgs(
        ctx=ctx, cluster=cluster, config=cfg.gpu, pools=facts.pool_plans, cluster_name=cfg.cluster_name,
        autoscaler=cfg.nodes.autoscaler,
        kubernetes_version=cfg.kubernetes_version, depends_on=tuple(depends_on),
        node_monitoring_agent_version={str(k): v for k, v in cfg.storage.addon_versions.items()}.get(
            "eks-node-monitoring-agent"),
        node_groups=tuple(node_groups), external_addons=tuple(sorted(cfg.storage.external_addons)),
        provisioning_requests=provisioning_on(cfg.kueue, facts.pool_plans)))
    health = cfg.gpu.health
    if health.runs(cfg.protected) and facts.has_gpus:
        image = health.image or f"{facts.image_repository}:{health.image_tag}"
        burn_in = GpuBurnIn(f"{ctx.prefix}-gpu-health", GpuBurnInArgs(
            ctx=ctx, cluster=cluster,
            manifests=tuple(burnin_manifests(health, facts.pool_plans, image, ctx.stack, cfg.label_prefix)),
            depends_on=tuple(node_groups)))
        outputs["gpuHealth"] = {"namespace": health.namespace, "gate": facts.gated,
                                "daemonSets": [d.metadata.name for d in burn_in.daemonsets]}
    return gpu


def _teams(cfg: StackConfig, ctx: StackContext, facts: StackFacts, cluster: ClusterInfo, storage: Storage,
           outputs: Outputs) -> dict[str, list[pulumi.Resource]]:
    """Tenant teams: a namespace, quota, service account and bucket role of their own (before their LocalQueues).
    Returns what each team's Jobs need first (its namespace, then its accounts)."""
    if not (cfg.kueue.enabled and cfg.kueue.tenant_teams):
        return {}
    monitoring = cfg.monitoring
    namespaces = {team.name: team.namespace for team in cfg.kueue.tenant_teams}
    fsx_volumes = {team: storage.fsx_team_volume(str(namespaces[team]), dra.file_system_path)
                   for team, dra in fsx_team_associations(cfg)} if storage.fsx is not None else {}
    teams = Teams(f"{ctx.prefix}-teams", TeamsArgs(
        ctx=ctx, cluster=cluster,
        cluster_roles=[kueue_viewer_role(ctx.stack, cfg.label_prefix)] if not cfg.kueue.viewer_roles_aggregated
        and any(team.binding_names for team in cfg.kueue.tenant_teams) else [],
        manifests=team_manifests(cfg.kueue, facts.pool_plans, ctx.stack, cfg.label_prefix,
                                 facts.job_facts.job_service_account, egress=cfg.job_egress.rules(cfg.platform),
                                 metrics_namespace=monitoring.prometheus_namespace if monitoring.enabled else None,
                                 metrics_ports=metrics_ports(facts.max_processes)),
        policies={team.name: team_access_policy(team, facts.bucket_names) for team in cfg.kueue.tenant_teams
                  if cfg.platform == "eks" and team.data},
        access_entries=team_access_entries(cfg.kueue, cfg.label_prefix) if cfg.platform == "eks" else (),
        volumes={team.name: (team, team.volume) for team in cfg.kueue.tenant_teams if team.volume is not None},
        file_system_id=storage.file_system_id, storage_needs=storage.driver_resources,
        fsx_volumes=fsx_volumes))
    team_namespaces = {team.name: team.namespace for team in cfg.kueue.tenant_teams if team.namespace is not None}
    storage_output = outputs["storage"]
    fsx_output = storage_output.get("fsxLustre") if isinstance(storage_output, dict) else None
    if fsx_volumes and isinstance(fsx_output, dict):  # verify_stack checks the teams' claims too
        fsx_output["claims"] = [*fsx_output["claims"], *({"namespace": pvc["metadata"]["namespace"],
                                                          "name": pvc["metadata"]["name"]}
                                                         for _, pvc, _ in fsx_volumes.values())]
    outputs["teams"] = {"namespaces": team_namespaces, "roleArns": teams.role_arns}
    return {team: [namespace_resource, *teams.accounts.get(team, [])]
            for team, namespace_resource in teams.namespaces.items()}


def _queueing(cfg: StackConfig, ctx: StackContext, facts: StackFacts, cluster: ClusterInfo,
              depends_on: Sequence[pulumi.Resource]) -> dict[str, pulumi.Resource]:
    """Kueue: gang admission and the GPU quota shared between teams. Returns the LocalQueues by name."""
    if not cfg.kueue.enabled:
        return {}
    queueing = Queueing(f"{ctx.prefix}-kueue", QueueingArgs(
        ctx=ctx, cluster=cluster, config=cfg.kueue,
        manifests=tuple(kueue_manifests(cfg.kueue, facts.pool_plans, JOBS_NAMESPACE, ctx.stack, cfg.label_prefix,
                                        facts.gate_labels)),
        depends_on=tuple(depends_on)))
    return queueing.local_queues
