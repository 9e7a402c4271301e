"""The Helm charts a stack installs, in one place: the components (infra/queueing.py, infra/controllers.py,
infra/monitoring/component.py, infra/nodes/gpu.py, infra/nodes/scaling/autoscaler.py) take each chart's name,
repository and release name from here, and preflight looks for the same charts (and their rivals) among the Helm
releases already on an existing cluster."""

from __future__ import annotations

from dataclasses import dataclass

from infra.config.external import ExternalRelease
from infra.config.schema import StackConfig


@dataclass(frozen=True)
class StackChart:
    key: str  # the config section that installs it (and turns it off)
    chart: str  # the chart's name (Chart.yaml `name`, what a Helm release record says it runs)
    repo: str  # where the component pulls it from
    release: str  # the Helm release name the stack gives it
    rivals: tuple[str, ...] = ()  # other charts that do the same job on a node or cluster: two would fight
    adoptable: bool = True  # the section takes `external:` (the cluster's own release of the chart)


KUEUE = StackChart("kueue", "kueue", "oci://registry.k8s.io/kueue/charts/kueue", "kueue")
JOBSET = StackChart("jobControllers.jobset", "jobset", "oci://registry.k8s.io/jobset/charts/jobset", "jobset",
                    adoptable=False)
TRAINER = StackChart("jobControllers.trainer", "kubeflow-trainer", "oci://ghcr.io/kubeflow/charts/kubeflow-trainer",
                     "kubeflow-trainer", adoptable=False)
KUBE_PROMETHEUS_STACK = StackChart("monitoring", "kube-prometheus-stack",
                                   "https://prometheus-community.github.io/helm-charts", "kps")
# NVIDIA's GPU Operator runs its own device plugin and DCGM exporter DaemonSets on every GPU node.
DEVICE_PLUGIN = StackChart("gpu.devicePlugin", "nvidia-device-plugin", "https://nvidia.github.io/k8s-device-plugin",
                           "nvidia-device-plugin", rivals=("gpu-operator",))
DCGM_EXPORTER = StackChart("gpu.dcgmExporter", "dcgm-exporter", "https://nvidia.github.io/dcgm-exporter/helm-charts",
                           "dcgm-exporter", rivals=("gpu-operator",))
EFA_DEVICE_PLUGIN = StackChart("gpu.efaDevicePlugin", "aws-efa-k8s-device-plugin", "https://aws.github.io/eks-charts",
                               "aws-efa-k8s-device-plugin")
# Karpenter scales the same pending pods with nodes of its own.
CLUSTER_AUTOSCALER = StackChart("nodes.autoscaler", "cluster-autoscaler", "https://kubernetes.github.io/autoscaler",
                                "cluster-autoscaler", rivals=("karpenter",))


@dataclass(frozen=True)
class InstalledChart:
    chart: StackChart
    namespace: str  # where the stack installs it, or where the adopted release runs
    version: str  # the version the stack pins, or the one the adopted release runs
    external: bool = False  # the cluster's own release, adopted (`external`): the stack installs none
    release: str = ""  # the Helm release name: the stack's, or the adopted one's

    @property
    def release_name(self) -> str:
        return self.release or self.chart.release


def adopted_place(chart: StackChart, namespace: str, external: ExternalRelease) -> tuple[str, str]:
    """(namespace, release name) of an adopted release: as configured, else the section's namespace and the chart's
    name (what `helm install <chart> ...` is usually called)."""
    return external.namespace or namespace, external.release or chart.chart


def stack_charts(cfg: StackConfig) -> list[InstalledChart]:
    """The charts this stack's config installs (EKS), where and at which version, and those it adopts (`external`:
    where that release runs, at the version declared). Read from the config alone (no instance facts): a GPU pool
    is one with `gpu: true`, a device-plugin pool one that is not Bottlerocket."""
    gpu_pools = [pool for pool in cfg.node_pools if pool.gpu]
    wanted = [
        (KUEUE, cfg.kueue.enabled, cfg.kueue.namespace, cfg.kueue.chart_version, cfg.kueue.external),
        (JOBSET, cfg.job_controllers.jobset.enabled, cfg.job_controllers.jobset.namespace,
         cfg.job_controllers.jobset.chart_version, None),
        (TRAINER, cfg.job_controllers.trainer.enabled, cfg.job_controllers.trainer.namespace,
         cfg.job_controllers.trainer.chart_version, None),
        (KUBE_PROMETHEUS_STACK, cfg.monitoring.enabled, cfg.monitoring.namespace, cfg.monitoring.chart_version,
         cfg.monitoring.external),
        (DEVICE_PLUGIN, cfg.gpu.device_plugin.enabled and any(pool.ami_family != "bottlerocket" for pool in gpu_pools),
         cfg.gpu.device_plugin.namespace, cfg.gpu.device_plugin.chart_version, cfg.gpu.device_plugin.external),
        (DCGM_EXPORTER, cfg.gpu.dcgm_exporter.enabled and bool(gpu_pools), cfg.gpu.dcgm_exporter.namespace,
         cfg.gpu.dcgm_exporter.chart_version, cfg.gpu.dcgm_exporter.external),
        (EFA_DEVICE_PLUGIN, cfg.gpu.efa_device_plugin.enabled and any(pool.efa for pool in cfg.node_pools),
         cfg.gpu.efa_device_plugin.namespace, cfg.gpu.efa_device_plugin.chart_version,
         cfg.gpu.efa_device_plugin.external),
        (CLUSTER_AUTOSCALER, cfg.platform == "eks" and cfg.nodes.autoscaler.enabled, cfg.nodes.autoscaler.namespace,
         cfg.nodes.autoscaler.chart_version, cfg.nodes.autoscaler.external),
    ]
    charts = []
    for chart, on, namespace, version, external in wanted:
        if not on:
            continue
        if external is None:
            charts.append(InstalledChart(chart, namespace, version))
        else:
            where, release = adopted_place(chart, namespace, external)
            charts.append(InstalledChart(chart, where, external.version, external=True, release=release))
    return charts
