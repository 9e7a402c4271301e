"""cluster-autoscaler: everything this stack knows about it, in one place.

- the chart's values (AWS, auto-discovery of the managed node groups' ASGs, Pod Identity) and its image tag (the
  newest release of the control plane's minor);
- its IAM policy (describe anything, scale only this cluster's groups);
- the node-template tags that model a pool's node at size 0 (labels, taints, GPUs, EFA, ephemeral storage), so a
  pending Job scales a pool up from zero;
- `cluster_autoscaler`: its IAM role, policy, Pod Identity association and Helm release.

Node scaling is a room of its own (a Karpenter module would sit beside this one); the config is `ml-cluster:nodes`
(infra/config/nodes.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.charts import CLUSTER_AUTOSCALER
from infra.config.nodepools import HelmChartConfig
from infra.config.nodes import AutoscalerConfig
from infra.context import ClusterInfo, StackContext
from infra.iam import pod_identity_trust_policy, policy_document
from infra.nodes.poolplan import PoolPlan
from infra.nodes.scaling.template import CAS_TEMPLATE, template_label_key
from workloads.cluster_facts import EFA_HUGEPAGES, EFA_RESOURCE
from workloads.quantity import format_bytes

AUTOSCALER_REPO = CLUSTER_AUTOSCALER.repo
AUTOSCALER_SERVICE_ACCOUNT = "cluster-autoscaler"
# The newest cluster-autoscaler release of each minor (its git tags cluster-autoscaler-<version>): its minor must
# match the control plane's, and its patches fix the autoscaler, so a stack runs the newest one.
AUTOSCALER_RELEASES = {"1.30": "v1.30.7", "1.31": "v1.31.5", "1.32": "v1.32.7", "1.33": "v1.33.6",
                       "1.34": "v1.34.5", "1.35": "v1.35.2", "1.36": "v1.36.1"}


def autoscaler_image_tag(cfg: AutoscalerConfig, kubernetes_version: str) -> str:
    """cluster-autoscaler's minor version must match the control plane's."""
    return cfg.image_tag or AUTOSCALER_RELEASES.get(kubernetes_version, f"v{kubernetes_version}.0")


# The ProvisioningRequest CRD (the chart does not ship it; its ClusterRole already grants provisioningrequests and
# podtemplates: charts/cluster-autoscaler/templates/clusterrole.yaml at cluster-autoscaler-chart-9.59.0), vendored
# from kubernetes/autoscaler tag cluster-autoscaler-1.35.2 (2d42588803), cluster-autoscaler/apis/config/crd/
# autoscaling.x-k8s.io_provisioningrequests.yaml, byte for byte (git blob 63666dce09), so `pulumi up` needs no
# github.com. It serves v1 (stored) and v1beta1; at the other releases of AUTOSCALER_RELEASES from 1.31.5 to 1.36.1
# it differs only in descriptions and the controller-gen annotation. The path is the project's (Pulumi runs the
# program, and the provider reads the file, from the directory of Pulumi.yaml).
PROVISIONING_REQUEST_CRD = "infra/nodes/scaling/crds/autoscaling.x-k8s.io_provisioningrequests.yaml"


def provisioning_request_args() -> dict[str, Any]:
    """The flags that make the autoscaler handle ProvisioningRequests (cluster-autoscaler 1.35.2 FAQ.md:574-579:
    `--enable-provisioning-requests=true` and the API content type application/json)."""
    return {"enable-provisioning-requests": True, "kube-api-content-type": "application/json"}


def autoscaler_values(cfg: AutoscalerConfig, cluster_name: str, region: str, kubernetes_version: str,
                      provisioning_requests: bool = False) -> dict[str, Any]:
    """cluster-autoscaler values: AWS, auto-discovery by the tags EKS puts on managed node groups' ASGs
    (k8s.io/cluster-autoscaler/enabled, k8s.io/cluster-autoscaler/<cluster>); credentials: Pod Identity.
    `provisioning_requests`: Kueue's topology flavors ask for their nodes through ProvisioningRequests."""
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
            **(provisioning_request_args() if provisioning_requests else {}),
        },
        "resources": {"requests": {"cpu": "100m", "memory": "300Mi"}, "limits": {"memory": "600Mi"}},
    }


def autoscaler_policy(cluster_name: str) -> str:
    """Least privilege for cluster-autoscaler: describe anything, change only this cluster's ASGs."""
    return policy_document(
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
    )


def node_template_tags(plan: PoolPlan, gpu_node_labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """The node-template tags cluster-autoscaler reads from an ASG to model a node of a pool at size 0.

    `gpu_node_labels` (the burn-in's gpu-health=passed, with the gate on) are modelled on GPU pools though the
    node group never sets them: a new node gets the label from the burn-in, and a pending Job that requires it
    must still scale the pool up from zero."""
    gated = dict(gpu_node_labels or {}) if plan.is_gpu else {}
    labels = {**plan.labels, **gated}
    tags = {template_label_key(key): value for key, value in labels.items()}
    tags[template_label_key("eks.amazonaws.com/capacityType")] = plan.config.capacity_type
    for taint in plan.taints:
        tags[f"{CAS_TEMPLATE}/taint/{taint.key}"] = f"{taint.value}:{taint.kubernetes_effect}"
    if plan.gpus_per_node:
        tags[f"{CAS_TEMPLATE}/resources/nvidia.com/gpu"] = str(plan.gpus_per_node)
    if plan.efa_interfaces:
        tags[f"{CAS_TEMPLATE}/resources/{EFA_RESOURCE}"] = str(plan.efa_interfaces)
        tags[f"{CAS_TEMPLATE}/resources/hugepages-2Mi"] = EFA_HUGEPAGES
    tags[f"{CAS_TEMPLATE}/resources/ephemeral-storage"] = format_bytes(plan.ephemeral_storage_bytes)
    return tags


def tag_slug(key: str) -> str:
    """A tag key in a logical name: ".../label/ml-cluster.io/gpu-type" -> "label-ml-cluster-io-gpu-type"."""
    return re.sub(r"[^a-z0-9]+", "-", key.removeprefix(CAS_TEMPLATE + "/").lower()).strip("-")


@dataclass(frozen=True)
class AutoscalerTarget:
    """The cluster the autoscaler scales: its configured name (EKS tags the ASGs with it), region and minor."""

    cluster_name: str
    region: str
    kubernetes_version: str
    provisioning_requests: bool = False  # Kueue's ProvisioningRequest admission check is in use


def helm_release(name: str, chart: str, repo: str, cfg: HelmChartConfig, values: Any,
                 opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
    """A pinned chart's Helm release, named after the chart."""
    return k8s.helm.v3.Release(name, name=chart, chart=chart, version=cfg.chart_version, namespace=cfg.namespace,
                               repository_opts={"repo": repo}, values=values, opts=opts)


def cluster_autoscaler(parent: pulumi.Resource, ctx: StackContext, cluster: ClusterInfo, cfg: AutoscalerConfig,
                       target: AutoscalerTarget, k8s_opts: pulumi.ResourceOptions) -> k8s.helm.v3.Release:
    """The autoscaler's IAM role and least-privilege policy, its Pod Identity association and its Helm release,
    children of `parent`; returns the release."""
    child = pulumi.ResourceOptions(parent=parent)
    role = aws.iam.Role(ctx.name("gpu", "autoscaler-role"), assume_role_policy=pod_identity_trust_policy(),
                        tags=ctx.tags, opts=child)
    policy = aws.iam.RolePolicy(ctx.name("gpu", "autoscaler-policy"), role=role.id,
                                policy=autoscaler_policy(target.cluster_name), opts=child)
    association = aws.eks.PodIdentityAssociation(
        ctx.name("gpu", "autoscaler-identity"), cluster_name=cluster.name, namespace=cfg.namespace,
        service_account=AUTOSCALER_SERVICE_ACCOUNT, role_arn=role.arn, tags=ctx.tags,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(cluster.eks_dependencies)))
    needs: list[pulumi.Resource] = [policy, association]
    if target.provisioning_requests:
        needs.append(k8s.yaml.v2.ConfigFile(ctx.name("gpu", "provisioningrequest-crd"),
                                            file=PROVISIONING_REQUEST_CRD, opts=k8s_opts))
    return helm_release(ctx.name("gpu", "cluster-autoscaler"), CLUSTER_AUTOSCALER.release, AUTOSCALER_REPO, cfg,
                        autoscaler_values(cfg, target.cluster_name, target.region, target.kubernetes_version,
                                          target.provisioning_requests),
                        k8s_opts.merge(pulumi.ResourceOptions(depends_on=needs)))
