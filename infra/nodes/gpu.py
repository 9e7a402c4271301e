"""GPU plumbing: the NVIDIA device plugin (nvidia.com/gpu becomes schedulable), the optional DCGM exporter,
the EKS node monitoring agent add-on (the node conditions node auto repair acts on) and, on onprem, the labels of
existing nodes (NodePatch). The cluster-autoscaler is node scaling's (infra/nodes/scaling/autoscaler.py); its
resources are created here, as children of this component, so their names and parents stay what they were.

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

from infra.config.addons import gpu_addons
from infra.config.charts import CLUSTER_AUTOSCALER, DCGM_EXPORTER, DEVICE_PLUGIN, EFA_DEVICE_PLUGIN
from infra.config.nodepools import DcgmExporterConfig, GpuConfig, HelmChartConfig
from infra.config.nodes import AutoscalerConfig
from infra.config.storage import NODE_MONITORING_AGENT
from infra.context import ClusterInfo, StackContext
from infra.nodes.dcgm_metrics import metrics_csv
from infra.nodes.poolplan import EFA_LABEL, GPU_PRESENT_LABEL, PoolPlan
from infra.nodes.scaling.autoscaler import AutoscalerTarget, cluster_autoscaler, helm_release

DEVICE_PLUGIN_REPO, DCGM_EXPORTER_REPO = DEVICE_PLUGIN.repo, DCGM_EXPORTER.repo
EFA_DEVICE_PLUGIN_REPO = EFA_DEVICE_PLUGIN.repo


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
        # MOFED (Mellanox OFED) injection off, said rather than left to the chart's null (chart 0.20.0
        # values.yaml:38 sets no MOFED_ENABLED then, templates/daemonset-device-plugin.yml:186-188, and the plugin's
        # flag is a BoolFlag without a default, k8s-device-plugin@v0.20.0 cmd/nvidia-device-plugin/main.go:115-119,
        # read at internal/plugin/server.go:345): EKS GPU nodes reach the network through EFA, whose own device
        # plugin hands out the interfaces; NVIDIA_MOFED=enabled would ask the container toolkit for MOFED mounts
        # these AMIs do not have.
        "mofedEnabled": False,
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


def _installs(chart: HelmChartConfig) -> bool:
    """The stack installs the chart: on, and not the cluster's own release adopted (`external`)."""
    return chart.enabled and chart.external is None


@dataclass(frozen=True)
class GpuPlumbingArgs:
    ctx: StackContext
    cluster: ClusterInfo
    config: GpuConfig
    pools: tuple[PoolPlan, ...]
    cluster_name: str  # the configured cluster name (EKS tags ASGs with it)
    autoscaler: AutoscalerConfig  # node scaling (infra/nodes/scaling), installed with the GPU plumbing
    kubernetes_version: str
    depends_on: tuple[pulumi.Resource, ...] = ()  # node groups, the Pod Identity agent add-on
    node_monitoring_agent_version: str | None = None  # storage.addonVersions pin; None: EKS's default
    node_groups: tuple[pulumi.Resource, ...] = ()  # the add-on waits for them (ACTIVE once its pods run)
    external_addons: tuple[str, ...] = ()  # add-ons the existing cluster keeps (storage.externalAddons)
    provisioning_requests: bool = False  # the autoscaler serves Kueue's ProvisioningRequests (infra/topology.py)


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

        if _installs(cfg.device_plugin) and any(plan.needs_device_plugin_daemonset for plan in args.pools):
            self._release(
                ctx,
                "device-plugin",
                DEVICE_PLUGIN.release,
                DEVICE_PLUGIN_REPO,
                cfg.device_plugin,
                device_plugin_values(args.pools),
                k8s_opts.merge(pulumi.ResourceOptions(depends_on=patches)),
            )
        if _installs(cfg.dcgm_exporter) and any(plan.is_gpu for plan in args.pools):
            self._release(
                ctx,
                "dcgm-exporter",
                DCGM_EXPORTER.release,
                DCGM_EXPORTER_REPO,
                cfg.dcgm_exporter,
                dcgm_exporter_values(cfg.dcgm_exporter, args.pools, ctx.label_prefix),
                k8s_opts,
            )
        if _installs(cfg.efa_device_plugin) and any(plan.efa_interfaces for plan in args.pools):
            self._release(
                ctx,
                "efa-device-plugin",
                EFA_DEVICE_PLUGIN.release,
                EFA_DEVICE_PLUGIN_REPO,
                cfg.efa_device_plugin,
                efa_device_plugin_values(args.pools, ctx.label_prefix),
                k8s_opts,
            )
        if cluster.is_eks and _installs(args.autoscaler):
            assert ctx.region is not None
            # Children of this component (their names and parents are the stack's state since before scaling had
            # a module of its own).
            self.releases[CLUSTER_AUTOSCALER.release] = cluster_autoscaler(
                self, ctx, cluster, args.autoscaler,
                AutoscalerTarget(args.cluster_name, ctx.region, args.kubernetes_version, args.provisioning_requests),
                k8s_opts)
        self.node_monitoring_agent: aws.eks.Addon | None = None
        if cluster.is_eks and NODE_MONITORING_AGENT in gpu_addons(cfg, any(plan.is_gpu for plan in args.pools)) \
                and NODE_MONITORING_AGENT not in args.external_addons:
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
        self.releases[chart] = helm_release(ctx.name("gpu", thing), chart, repo, cfg, values, opts)

