"""Metrics collection for the training cluster: kube-prometheus-stack (or remote write), the monitors that find the
trainers, stagers and DCGM, the alerts, and the "is my GPU starving?" dashboard.

Pure builders make every values document and manifest (tested without Pulumi); the Monitoring component only
creates resources. Order under `up`: the Helm release installs the operator's CRDs (the chart's crds/ directory,
which Helm applies before anything else), and the PodMonitor, PrometheusRule and dashboard ConfigMap depend on the
release, so they are created after their kinds exist and deleted before the release on `destroy`. Helm never
deletes CRDs on uninstall: after `destroy` the monitoring.coreos.com CRDs stay in the cluster (documented in
docs/monitoring.md); the cluster itself goes with an EKS stack's destroy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.charts import KUBE_PROMETHEUS_STACK, adopted_place
from infra.config.monitoring import DASHBOARD_CONFIGMAP_NAME, MONITOR_AND_RULE_NAME, MonitoringConfig
from infra.context import ClusterInfo, StackContext
from infra.iam import pod_identity_trust_policy, policy_document
from infra.monitoring.alerts import rule_groups
from infra.monitoring.dashboard import dashboard_json
from infra.monitoring.goodput import goodput_rule_groups
from infra.monitoring.reservations import ReservedPool, reservation_groups
from infra.monitoring.teams import team_rule_groups
from workloads.jobspec import METRICS_LABEL, STAGE_METRICS_PORT_NAME, train_metrics_port_name

# The release name ("kps") prefixes every object of the chart; short keeps them under Kubernetes' 63-character limits.
KPS_CHART, KPS_REPO = KUBE_PROMETHEUS_STACK.chart, KUBE_PROMETHEUS_STACK.repo
KPS_RELEASE = KUBE_PROMETHEUS_STACK.release
# Named, not derived by the chart's templates: an EKS Pod Identity association (remote write to Amazon Managed
# Service for Prometheus, SigV4) binds to it by name (chart values.yaml:3659-3661, prometheus.serviceAccount).
PROMETHEUS_SERVICE_ACCOUNT = "prometheus"
# kube-prometheus-stack's Grafana sidecar loads ConfigMaps with this label (chart values.yaml:1539-1540).
DASHBOARD_LABEL = ("grafana_dashboard", "1")
JOB_NAME_SOURCE = "__meta_kubernetes_pod_label_app_kubernetes_io_instance"


def _labels(ctx_stack: str, label_prefix: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": "ml-cluster",
        "app.kubernetes.io/component": "monitoring",
        "app.kubernetes.io/managed-by": "pulumi",
        f"{label_prefix}/stack": ctx_stack,
    }


def kps_values(cfg: MonitoringConfig, label_prefix: str = "ml-cluster.io", reserved: bool = False) -> dict[str, Any]:
    """kube-prometheus-stack values: our monitors and rules picked up without Helm labels, retention and storage
    from config, node agents on every node whatever its taints (GPU pools are tainted), and the nodes' GPU-count
    label exported by kube-state-metrics (`kube_node_labels`), which the missing-GPU alert compares with what a
    node offers (kube-state-metrics 8.4.0, the subchart: values.yaml:416 `metricLabelsAllowlist`, passed as
    `--metric-labels-allowlist` at templates/deployment.yaml:101). With reserved pools (`reserved`) their
    `<prefix>/pool` label too, which the idle-reserved-GPU alert joins on."""
    spec: dict[str, Any] = {
        "retention": cfg.retention,
        "scrapeInterval": cfg.scrape_interval,
        # Select every PodMonitor/ServiceMonitor/PrometheusRule, not only this release's: ours are separate
        # objects, and dcgm-exporter's ServiceMonitor comes from another release.
        "podMonitorSelectorNilUsesHelmValues": False,
        "serviceMonitorSelectorNilUsesHelmValues": False,
        "ruleSelectorNilUsesHelmValues": False,
        "storageSpec": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": cfg.storage_size}},
            **({"storageClassName": cfg.storage_class} if cfg.storage_class else {}),
        }}},
    }
    if cfg.remote_write is not None:
        target: dict[str, Any] = {"url": cfg.remote_write.url}
        if cfg.remote_write.sigv4_region:
            target["sigv4"] = {"region": cfg.remote_write.sigv4_region}
        spec["remoteWrite"] = [target]
    return {
        "prometheus": {"prometheusSpec": spec,
                       "serviceAccount": {"create": True, "name": PROMETHEUS_SERVICE_ACCOUNT}},
        "grafana": {"enabled": cfg.grafana_enabled()},
        # Node agents must run on GPU nodes, which carry NoSchedule (and possibly configured NoExecute) taints.
        "prometheus-node-exporter": {"tolerations": [{"operator": "Exists"}]},
        # gpu-health: the burn-in's verdict per node, for the dashboard's GPU health row; a pod's Job (its
        # app.kubernetes.io/instance) for the goodput rules' per-Job buckets (infra/monitoring/goodput.py)
        "kube-state-metrics": {"metricLabelsAllowlist": [
            f"nodes=[{label_prefix}/gpu-count,{label_prefix}/gpu-health"
            f"{f',{label_prefix}/pool' if reserved else ''}]", "pods=[app.kubernetes.io/instance]"]},
    }


def amp_workspace_arn(url: str, region: str, account_id: str) -> str:
    """The workspace a remote-write URL of Amazon Managed Service for Prometheus names, as an IAM resource ARN
    (https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>/api/v1/remote_write); "*" for another URL."""
    parts = url.split("/workspaces/", 1)
    if len(parts) != 2 or not parts[1].split("/", 1)[0]:
        return "*"
    return f"arn:aws:aps:{region}:{account_id}:workspace/{parts[1].split('/', 1)[0]}"


def remote_write_policy(workspace_arn: str) -> str:
    """Least privilege for Prometheus writing to AMP: RemoteWrite on the one workspace."""
    return policy_document(
        {"Sid": "RemoteWrite", "Effect": "Allow", "Action": ["aps:RemoteWrite"], "Resource": workspace_arn})


def pod_monitor(namespace: str, training_namespace: str, label_prefix: str, max_processes_per_pod: int,
                labels: dict[str, str], team_namespaces: Sequence[str] = ()) -> dict[str, Any]:
    """One PodMonitor for every training pod, in the training namespace and the tenant teams' namespaces: each
    trainer rank's port and the stager's, with the Job and node as labels (the dashboard and alerts group by
    `job_name` and `node`)."""
    relabelings = [
        {"sourceLabels": [JOB_NAME_SOURCE], "targetLabel": "job_name", "action": "replace"},
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"},
    ]
    ports = [train_metrics_port_name(rank) for rank in range(max(1, max_processes_per_pod))] + [STAGE_METRICS_PORT_NAME]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": MONITOR_AND_RULE_NAME, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "namespaceSelector": {"matchNames": [training_namespace, *team_namespaces]},
            "selector": {"matchLabels": {f"{label_prefix}/{METRICS_LABEL}": "true"}},
            "podMetricsEndpoints": [{"port": port, "path": "/metrics", "relabelings": relabelings}
                                    for port in ports],
        },
    }


def prometheus_rule(namespace: str, cfg: MonitoringConfig, training_namespace: str,
                    labels: dict[str, str], label_prefix: str = "ml-cluster.io",
                    pools: Sequence[ReservedPool] = (), team_namespaces: Sequence[str] = ()) -> dict[str, Any]:
    groups = [*rule_groups(cfg.alerts, training_namespace, label_prefix, team_namespaces),
              *team_rule_groups(team_namespaces),
              *goodput_rule_groups(training_namespace, team_namespaces),
              *reservation_groups(pools, cfg.alerts.reservation_end_minutes, cfg.alerts.reserved_idle_minutes,
                                  label_prefix)]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": MONITOR_AND_RULE_NAME, "namespace": namespace, "labels": dict(labels)},
        "spec": {"groups": groups},
    }


def dashboard_config_map(namespace: str, labels: dict[str, str], label_prefix: str = "ml-cluster.io") -> dict[str, Any]:
    key, value = DASHBOARD_LABEL
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": DASHBOARD_CONFIGMAP_NAME, "namespace": namespace, "labels": {**labels, key: value}},
        "data": {"training-gpu-starving.json": dashboard_json(label_prefix)},
    }


def monitoring_manifests(cfg: MonitoringConfig, stack: str, label_prefix: str, training_namespace: str,
                         max_processes_per_pod: int, pools: Sequence[ReservedPool] = (),
                         team_namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The objects beside the chart: PodMonitor, PrometheusRule and (with Grafana) the dashboard. `pools`: the
    stack's reserved pools (alerts for their end and their idle GPUs); `team_namespaces`: where tenant teams' Jobs
    run, scraped and alerted on like the training namespace."""
    labels = _labels(stack, label_prefix)
    if cfg.external is not None:
        # An adopted kube-prometheus-stack selects monitors and rules labelled with its release name unless told
        # otherwise (chart 88.5.3 values.yaml:4451,4499 `*SelectorNilUsesHelmValues: true`; templates/prometheus/
        # prometheus.yaml:212-215, 280-283 `release: {{ $.Release.Name }}`).
        labels = {**labels, "release": adopted_place(KUBE_PROMETHEUS_STACK, cfg.namespace, cfg.external)[1]}
    namespace = cfg.prometheus_namespace
    manifests = [
        pod_monitor(namespace, training_namespace, label_prefix, max_processes_per_pod, labels, team_namespaces),
        prometheus_rule(namespace, cfg, training_namespace, labels, label_prefix, pools, team_namespaces),
    ]
    if cfg.grafana_enabled():
        manifests.append(dashboard_config_map(namespace, labels, label_prefix))
    return manifests


@dataclass(frozen=True)
class MonitoringArgs:
    ctx: StackContext
    cluster: ClusterInfo
    config: MonitoringConfig
    training_namespace: str
    max_processes_per_pod: int
    team_namespaces: tuple[str, ...] = ()  # tenant teams' namespaces: their Jobs are scraped and alerted on too
    account_id: str | None = None  # EKS: scopes the AMP remote-write permission to the workspace
    pools: tuple[ReservedPool, ...] = ()  # reserved pools: alerts before their end and for idle reserved GPUs
    depends_on: Sequence[pulumi.Resource] = ()  # node groups (the operator needs somewhere to run), storage drivers


class Monitoring(pulumi.ComponentResource):
    release: k8s.helm.v3.Release | None  # None: the cluster's own kube-prometheus-stack (monitoring.external)

    def __init__(self, name: str, args: MonitoringArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("ml-cluster:infra:Monitoring", name, None, opts)
        ctx, cfg = args.ctx, args.config
        provider = args.cluster.provider
        if cfg.external is not None:
            # Its namespace, operator and CRDs are there before `up`: only the objects beside the chart are ours.
            self.release = None
            self._side_objects(args, pulumi.ResourceOptions(parent=self, provider=provider,
                                                            depends_on=list(args.depends_on)))
            self.register_outputs({"namespace": cfg.prometheus_namespace, "release": "external"})
            return
        labels = _labels(ctx.stack, ctx.label_prefix)
        namespace = k8s.core.v1.Namespace(
            ctx.name("monitoring", "namespace"), metadata={"name": cfg.namespace, "labels": labels},
            opts=pulumi.ResourceOptions(parent=self, provider=provider,
                                        depends_on=list(args.cluster.eks_dependencies)))
        identity: list[pulumi.Resource] = []
        remote = cfg.remote_write
        if args.cluster.is_eks and remote is not None and remote.sigv4_region and args.account_id:
            # SigV4 signs with the pod's credentials: an IAM role for Prometheus' service account (Pod Identity).
            child = pulumi.ResourceOptions(parent=self)
            role = aws.iam.Role(ctx.name("monitoring", "remote-write-role"),
                                assume_role_policy=pod_identity_trust_policy(), tags=ctx.tags, opts=child)
            policy = aws.iam.RolePolicy(
                ctx.name("monitoring", "remote-write"), role=role.id,
                policy=remote_write_policy(amp_workspace_arn(remote.url, remote.sigv4_region, args.account_id)),
                opts=child)
            association = aws.eks.PodIdentityAssociation(
                ctx.name("monitoring", "remote-write-identity"), cluster_name=args.cluster.name,
                namespace=cfg.namespace, service_account=PROMETHEUS_SERVICE_ACCOUNT, role_arn=role.arn,
                tags=ctx.tags,
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.cluster.eks_dependencies)))
            identity = [policy, association]
        self.release = k8s.helm.v3.Release(
            ctx.name("monitoring", KPS_RELEASE),
            name=KPS_RELEASE,
            chart=KPS_CHART,
            version=cfg.chart_version,
            namespace=cfg.namespace,
            repository_opts={"repo": KPS_REPO},
            values=kps_values(cfg, ctx.label_prefix, reserved=any(pool.gpus_per_node for pool in args.pools)),
            opts=pulumi.ResourceOptions(parent=self, provider=provider,
                                        depends_on=[namespace, *identity, *args.depends_on]),
        )
        self._side_objects(args, pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[self.release]))
        self.register_outputs({"namespace": cfg.namespace, "release": self.release.status})

    def _side_objects(self, args: MonitoringArgs, after_crds: pulumi.ResourceOptions) -> None:
        """The PodMonitor, PrometheusRule and dashboard, after the operator's CRDs."""
        ctx = args.ctx
        for manifest in monitoring_manifests(args.config, ctx.stack, ctx.label_prefix, args.training_namespace,
                                             args.max_processes_per_pod, args.pools, args.team_namespaces):
            logical = ctx.name("monitoring", f"{manifest['kind'].lower()}-{manifest['metadata']['name']}")
            if manifest["kind"] == "ConfigMap":
                k8s.core.v1.ConfigMap(logical, metadata=manifest["metadata"], data=manifest["data"], opts=after_crds)
            else:
                k8s.apiextensions.CustomResource(
                    logical, api_version=manifest["apiVersion"], kind=manifest["kind"],
                    metadata=manifest["metadata"], spec=manifest["spec"], opts=after_crds)
