"""Build the whole stack from its config: network -> cluster -> node pools -> storage -> GPU plumbing -> jobs.

Each capability is one component; this module only wires their typed outputs into the next one's args.
"""

from __future__ import annotations

import pulumi

from infra.cluster import EksCluster, EksClusterArgs, ExistingCluster, ExistingClusterArgs
from infra.config import StackConfig
from infra.context import ClusterInfo, NetworkInfo, StackContext
from infra.network import Network, NetworkArgs, lookup_existing_subnets


def stack_context(cfg: StackConfig, project: str, stack: str) -> StackContext:
    tags = {"project": project, "stack": stack, "managed-by": "pulumi", **cfg.tags}
    return StackContext(project=project, stack=stack, prefix=f"mlc-{stack}", label_prefix=cfg.label_prefix,
                        protected=cfg.protected, region=cfg.region, tags=tags)


def build_stack(cfg: StackConfig, ctx: StackContext) -> dict[str, pulumi.Input[object]]:
    """Create every resource of the stack; return the stack outputs."""
    outputs: dict[str, pulumi.Input[object]] = {"platform": cfg.platform,
                                                "kubernetesVersion": cfg.kubernetes_version}

    # --- facts: every data-source lookup and cross-check runs here, before any resource is registered ---
    existing_subnets = None
    if cfg.network is not None and cfg.network.existing is not None:
        existing_subnets = lookup_existing_subnets(cfg.network.existing)

    # --- network + cluster ---
    network: NetworkInfo | None = None
    cluster: ClusterInfo
    if cfg.platform == "eks":
        assert cfg.network is not None and cfg.cluster is not None
        network = Network(f"{ctx.prefix}-network", NetworkArgs(
            ctx=ctx, config=cfg.network, cluster_name=cfg.cluster.name, existing_subnets=existing_subnets)).info
        eks = EksCluster(f"{ctx.prefix}-cluster", EksClusterArgs(ctx=ctx, config=cfg.cluster, network=network))
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

    # --- node pools (issue 3) ---

    # --- storage (issue 4) ---

    # --- GPU plumbing (issue 3) ---

    # --- training jobs (issue 5) ---

    return outputs
