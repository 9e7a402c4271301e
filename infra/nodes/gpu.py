"""GPU plumbing: the NVIDIA device plugin (nvidia.com/gpu becomes schedulable), the optional DCGM exporter,
the cluster-autoscaler (EKS: scale pools from zero, IAM through Pod Identity), the EKS node monitoring agent add-on
(the node conditions node auto repair acts on) and, on onprem, the labels of existing nodes (NodePatch).

Helm values and IAM policies are built by pure functions; the GpuPlumbing component only creates resources.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.nodepools import AutoscalerConfig, DcgmExporterConfig, GpuConfig, HelmChartConfig
from infra.context import ClusterInfo, StackContext
from infra.iam import pod_identity_trust_policy
from infra.nodes.dcgm_metrics import metrics_csv
from infra.nodes.poolplan import EFA_LABEL, GPU_PRESENT_LABEL, PoolPlan

DEVICE_PLUGIN_REPO = "https://nvidia.github.io/k8s-device-plugin"
DCGM_EXPORTER_REPO = "https://nvidia.github.io/dcgm-exporter/helm-charts"
AUTOSCALER_REPO = "https://kubernetes.github.io/autoscaler"
EFA_DEVICE_PLUGIN_REPO = "https://aws.github.io/eks-charts"
AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"


def node_monitoring_agent_values(plans: Sequence[PoolPlan]) -> dict[str, Any]:
    """The add-on's configuration values. Its DCGM DaemonSet, which the GPU checks (XIDs, DCGM health and
    diagnostics) run in, tolerates nothing by default (aws/eks-node-monitoring-agent v1.7.0
    charts/eks-node-monitoring-agent/values.yaml:157-158, used at templates/dcgm-daemonset.yaml:34-36), so on
    GPU pools, which are tainted, it would never run: it gets the GPU pools' taints. The node agent already
    tolerates every taint (values.yaml:93-95). `dcgmAgent.tolerations` is in the add-on's configuration schema
    (charts/configuration.schema.json:17,138)."""
    return {"dcgmAgent": {"tolerations": gpu_tolerations(plans)}}


def gpu_tolerations(plans: Sequence[PoolPlan]) -> list[dict[str, str]]:
    """Tolerate every taint a GPU pool carries (the GPU taint and any configured ones), once each."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for plan in plans:
        if plan.is_gpu:
            for taint in plan.taints:
                seen.setdefault(
                    (taint.key, taint.kubernetes_effect),
                    {"key": taint.key, "operator": "Exists", "effect": taint.kubernetes_effect},
                )
    seen.setdefault(
        ("nvidia.com/gpu", "NoSchedule"),
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    )
    return list(seen.values())


def _required_affinity(key: str, operator: str, values: list[str] | None = None) -> dict[str, Any]:
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values is not None:
        expression["values"] = values
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expression]}]
            }
        }
    }


def device_plugin_values(plans: Sequence[PoolPlan]) -> dict[str, Any]:
    """nvidia-device-plugin values: only nodes labelled nvidia.com/gpu.present=true, GPU taints tolerated.

    The chart's default affinity also accepts NFD labels that no node here carries; replacing it with the one
    label our GPU pools set makes the placement explicit (Bottlerocket runs the plugin on the host instead).
    """
    return {
        "affinity": _required_affinity(GPU_PRESENT_LABEL, "In", ["true"]),
        "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}, *gpu_tolerations(plans)],
        "priorityClassName": "system-node-critical",
        "gfd": {"enabled": False},
        "nfd": {"enabled": False},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }


# dcgm-exporter's resources, every field set: Helm merges maps, so leaving one out keeps the chart's default
# (chart 4.8.2 values.yaml:120-126: limits cpu 200m, memory 512Mi). A CPU limit stays, but at 1 CPU: the chart's
# 200m throttles the exporter while it collects profiling fields from 8 GPUs and then scrapes time out.
DCGM_EXPORTER_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "256Mi"},
    "limits": {"cpu": "1", "memory": "1Gi"},
}


def dcgm_exporter_values(cfg: DcgmExporterConfig, plans: Sequence[PoolPlan], label_prefix: str) -> dict[str, Any]:
    return {
        "affinity": _required_affinity(f"{label_prefix}/gpu-type", "Exists"),
        "tolerations": gpu_tolerations(plans),
        # honorLabels: keep the `namespace`/`pod` dcgm-exporter puts on each GPU's series (the workload holding it)
        # instead of renaming them exported_*; the alerts join them with the trainer's series on those labels.
        # Chart 4.8.2 values.yaml:127-134 (serviceMonitor.enabled, interval, scrapeTimeout, honorLabels).
        "serviceMonitor": {"enabled": cfg.service_monitor, "honorLabels": True},
        "resources": DCGM_EXPORTER_RESOURCES,
        # the chart's default fields plus the GPU-health ones the alerts read (infra/nodes/dcgm_metrics.py)
        "customMetrics": metrics_csv(),
    }


# The newest cluster-autoscaler release of each minor (its git tags cluster-autoscaler-<version>): its minor must
# match the control plane's, and its patches fix the autoscaler, so a stack runs the newest one.
AUTOSCALER_RELEASES = {"1.30": "v1.30.7", "1.31": "v1.31.5", "1.32": "v1.32.7", "1.33": "v1.33.6",
                       "1.34": "v1.34.5", "1.35": "v1.35.2", "1.36": "v1.36.1"}


def efa_device_plugin_values(plans: Sequence[PoolPlan], label_prefix: str) -> dict[str, Any]:
    """aws-efa-k8s-device-plugin values: only on EFA pools (their <prefix>/efa label; the chart's own affinity also
    lists every EFA instance type, values.yaml:10-13), tolerating those pools' taints (the chart tolerates only
    CriticalAddonsOnly, templates/daemonset.yaml:34-39)."""
    tolerations: dict[tuple[str, str], dict[str, str]] = {}
    for plan in plans:
        for taint in plan.taints if plan.efa_interfaces else ():
            tolerations.setdefault((taint.key, taint.kubernetes_effect),
                                   {"key": taint.key, "operator": "Exists", "effect": taint.kubernetes_effect})
    return {"nodeSelector": {f"{label_prefix}/{EFA_LABEL}": "true"}, "tolerations": list(tolerations.values())}


def autoscaler_image_tag(cfg: AutoscalerConfig, kubernetes_version: str) -> str:
    """cluster-autoscaler's minor version must match the control plane's."""
    return cfg.image_tag or AUTOSCALER_RELEASES.get(kubernetes_version, f"v{kubernetes_version}.0")


def autoscaler_values(cfg: AutoscalerConfig, cluster_name: str, region: str, kubernetes_version: str) -> dict[str, Any]:
    """cluster-autoscaler values: AWS, auto-discovery by the tags EKS puts on managed node groups' ASGs
    (k8s.io/cluster-autoscaler/enabled, k8s.io/cluster-autoscaler/<cluster>); credentials: Pod Identity."""
    return {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name},
        "fullnameOverride": "cluster-autoscaler",
        "image": {"tag": autoscaler_image_tag(cfg, kubernetes_version)},
        "rbac": {"serviceAccount": {"create": True, "name": AUTOSCALER_SERVICE_ACCOUNT}},
        "priorityClassName": "system-cluster-critical",
        "extraArgs": {
            "expander": cfg.expander,
            "balance-similar-node-groups": cfg.balance_similar_node_groups,
            "scale-down-unneeded-time": cfg.scale_down_unneeded_time,
        },
        "resources": {"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"memory": "600Mi"}},
    }


def autoscaler_policy(cluster_name: str) -> str:
    """Least privilege for cluster-autoscaler: describe anything, change only this cluster's ASGs."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "ScaleOwnGroups",
                    "Effect": "Allow",
                    "Action": [
                        "autoscaling:SetDesiredCapacity",
                        "autoscaling:TerminateInstanceInAutoScalingGroup",
                    ],
                    "Resource": "*",
                    "Condition": {
                        "StringEquals": {f"aws:ResourceTag/k8s.io/cluster-autoscaler/{cluster_name}": "owned"}
                    },
                },
                {
                    "Sid": "Describe",
                    "Effect": "Allow",
                    "Action": [
                        "autoscaling:DescribeAutoScalingGroups",
                        "autoscaling:DescribeAutoScalingInstances",
                        "autoscaling:DescribeLaunchConfigurations",
                        "autoscaling:DescribeScalingActivities",
                        "autoscaling:DescribeTags",
                        "ec2:DescribeImages",
                        "ec2:DescribeInstanceTypes",
                        "ec2:DescribeLaunchTemplateVersions",
                        "ec2:GetInstanceTypesFromInstanceRequirements",
                        "eks:DescribeNodegroup",
                    ],
                    "Resource": "*",
                },
            ],
        }
    )


def node_patch_manifests(plans: Sequence[PoolPlan]) -> list[dict[str, Any]]:
    """onprem: one Node patch per configured existing node, carrying its pool's labels."""
    manifests = []
    for plan in plans:
        if plan.config.existing is None:
            continue
        for node in plan.config.existing.nodes:
            manifests.append(
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": dict(plan.labels)}}
            )
    return manifests


@dataclass(frozen=True)
class GpuPlumbingArgs:
    ctx: StackContext
    cluster: ClusterInfo
    config: GpuConfig
    pools: tuple[PoolPlan, ...]
    cluster_name: str  # the configured cluster name (EKS tags ASGs with it)
    kubernetes_version: str
    depends_on: tuple[pulumi.Resource, ...] = ()  # node groups, the Pod Identity agent add-on
    node_monitoring_agent_version: str | None = None  # storage.addonVersions pin; None: EKS's default
    node_groups: tuple[pulumi.Resource, ...] = ()  # the add-on waits for them (ACTIVE once its pods run)


class GpuPlumbing(pulumi.ComponentResource):
    releases: dict[str, k8s.helm.v3.Release]

    def __init__(self, name: str, args: GpuPlumbingArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ml-cluster:infra:GpuPlumbing", name, None, opts)
        ctx, cluster, cfg = args.ctx, args.cluster, args.config
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=cluster.provider, depends_on=list(args.depends_on))
        self.releases = {}

        patches = []
        for manifest in node_patch_manifests(args.pools):
            node = manifest["metadata"]["name"]
            patches.append(
                k8s.core.v1.NodePatch(
                    ctx.name("gpu", f"node-{node}"),
                    metadata=manifest["metadata"],
                    opts=pulumi.ResourceOptions(parent=self, provider=cluster.provider),
                )
            )

        if cfg.device_plugin.enabled and any(plan.needs_device_plugin_daemonset for plan in args.pools):
            self._release(
                ctx,
                "device-plugin",
                "nvidia-device-plugin",
                DEVICE_PLUGIN_REPO,
                cfg.device_plugin,
                device_plugin_values(args.pools),
                k8s_opts.merge(pulumi.ResourceOptions(depends_on=patches)),
            )
        if cfg.dcgm_exporter.enabled and any(plan.is_gpu for plan in args.pools):
            self._release(
                ctx,
                "dcgm-exporter",
                "dcgm-exporter",
                DCGM_EXPORTER_REPO,
                cfg.dcgm_exporter,
                dcgm_exporter_values(cfg.dcgm_exporter, args.pools, ctx.label_prefix),
                k8s_opts,
            )
        if cfg.efa_device_plugin.enabled and any(plan.efa_interfaces for plan in args.pools):
            self._release(
                ctx,
                "efa-device-plugin",
                "aws-efa-k8s-device-plugin",
                EFA_DEVICE_PLUGIN_REPO,
                cfg.efa_device_plugin,
                efa_device_plugin_values(args.pools, ctx.label_prefix),
                k8s_opts,
            )
        if cluster.is_eks and cfg.autoscaler.enabled:
            self._autoscaler(args, k8s_opts)
        self.node_monitoring_agent: aws.eks.Addon | None = None
        if cluster.is_eks and cfg.node_monitoring_agent.enabled and any(plan.is_gpu for plan in args.pools):
            self.node_monitoring_agent = aws.eks.Addon(
                ctx.name("gpu", NODE_MONITORING_AGENT),
                cluster_name=cluster.name,
                addon_name=NODE_MONITORING_AGENT,
                addon_version=args.node_monitoring_agent_version,
                configuration_values=json.dumps(node_monitoring_agent_values(args.pools), sort_keys=True),
                resolve_conflicts_on_create="OVERWRITE",
                resolve_conflicts_on_update="PRESERVE",
                tags=ctx.tags,
                opts=pulumi.ResourceOptions(parent=self,
                                            depends_on=[*cluster.eks_dependencies, *args.node_groups]),
            )
        self.register_outputs({"releases": {name: release.status for name, release in self.releases.items()}})

    def _release(
        self,
        ctx: StackContext,
        thing: str,
        chart: str,
        repo: str,
        cfg: HelmChartConfig,
        values: Any,
        opts: pulumi.ResourceOptions,
    ) -> None:
        """The chart's Helm release, named after the chart and kept in `releases` under that name."""
        self.releases[chart] = k8s.helm.v3.Release(
            ctx.name("gpu", thing),
            name=chart,
            chart=chart,
            version=cfg.chart_version,
            namespace=cfg.namespace,
            repository_opts={"repo": repo},
            values=values,
            opts=opts,
        )

    def _autoscaler(self, args: GpuPlumbingArgs, k8s_opts: pulumi.ResourceOptions) -> None:
        ctx, cluster, cfg = args.ctx, args.cluster, args.config.autoscaler
        assert ctx.region is not None
        child = pulumi.ResourceOptions(parent=self)
        role = aws.iam.Role(
            ctx.name("gpu", "autoscaler-role"),
            assume_role_policy=pod_identity_trust_policy(),
            tags=ctx.tags,
            opts=child,
        )
        policy = aws.iam.RolePolicy(
            ctx.name("gpu", "autoscaler-policy"),
            role=role.id,
            policy=autoscaler_policy(args.cluster_name),
            opts=child,
        )
        association = aws.eks.PodIdentityAssociation(
            ctx.name("gpu", "autoscaler-identity"),
            cluster_name=cluster.name,
            namespace=cfg.namespace,
            service_account=AUTOSCALER_SERVICE_ACCOUNT,
            role_arn=role.arn,
            tags=ctx.tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(cluster.eks_dependencies)),
        )
        self._release(
            ctx,
            "cluster-autoscaler",
            "cluster-autoscaler",
            AUTOSCALER_REPO,
            cfg,
            autoscaler_values(cfg, args.cluster_name, ctx.region, args.kubernetes_version),
            k8s_opts.merge(pulumi.ResourceOptions(depends_on=[policy, association])),
        )
