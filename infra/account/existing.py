"""Preflight of a stack laid onto an existing EKS cluster (cluster.existing): the cluster fits the stack file, no
add-on or Helm release the stack installs is there already, no node group is already an autoscaler's, and the
cluster is not a SageMaker HyperPod orchestrator.

Helm releases are read the way Helm itself stores them (helm.sh/helm/v3 v3.20.2, the version pulumi-kubernetes'
provider builds with: provider/go.mod:30; the provider's default driver is "secret", provider/pkg/provider/
provider.go:782-791): one Secret per release revision, type `helm.sh/release.v1`, labelled `owner: helm`,
`name: <release>`, `status`, `version: <revision>` (pkg/storage/driver/secrets.go:216-255), its `release` data the
base64 of the gzipped release JSON (pkg/storage/driver/util.go:35-80); with HELM_DRIVER=configmap the same record
in a ConfigMap with the same labels (pkg/storage/driver/cfgmaps.go:251-254)."""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from infra.account.checks import AWS_ERRORS, FAIL, PASS, WARN, Check, aws_error
from infra.account.kubeapi import KubeApi, KubeApiError
from infra.config.addons import stack_addons
from infra.config.charts import StackChart, stack_charts
from infra.config.schema import StackConfig
from infra.existing_cluster import ClusterAnswerError, FoundCluster, existing_cluster_problems, found_from_describe

KubeFor = Callable[[FoundCluster], KubeApi]  # the cluster read -> a reader of its Kubernetes API
HELM_RELEASE_TYPE = "helm.sh/release.v1"
HELM_OWNER = "owner=helm"
_GZIP_MAGIC = b"\x1f\x8b\x08"
MAX_RECORD_BYTES = 64 << 20  # a release record, unzipped (rendered manifests of a big chart are a few MiB)
# A HyperPod EKS cluster's dependencies come as one Helm chart, installed as release hyperpod-dependencies in
# aws-hyperpod (aws/sagemaker-hyperpod-cli helm_chart/HyperPodHelmChart/Chart.yaml:2, `name: hyperpod-helm-chart`;
# SageMaker Developer Guide, "Install packages on the Amazon EKS cluster using Helm"). It carries its own NVIDIA and
# EFA device plugins, Kubeflow training operator and health agents.
HYPERPOD_CHART = "hyperpod-helm-chart"
HYPERPOD_REFUSAL = (
    "a SageMaker HyperPod cluster's EKS orchestrator is not supported as a base: HyperPod runs its nodes as instance "
    "groups it creates, health-checks, reboots and replaces itself (labelled sagemaker.amazonaws.com/*), with its "
    "own device plugins and agents; this stack's node groups, device plugins, burn-in and node repair would run "
    "beside them, and mapping HyperPod's instance groups to Kueue flavors is not built")


@dataclass(frozen=True)
class HelmRelease:
    name: str
    namespace: str
    revision: int
    status: str
    chart: str  # "" when the record could not be read
    version: str
    unreadable: str = ""  # why the record could not be decoded


def check_existing_cluster(eks: Any, cfg: StackConfig, kube_for: KubeFor | None = None,
                           sagemaker: Any = None) -> list[Check]:
    """cluster.existing: the cluster is there and fits the stack file, no add-on the stack installs is there already
    (CreateAddon would fail), no node group is already an autoscaler's (two would fight over it), no Helm release
    the stack would install a second of, and no HyperPod."""
    assert cfg.cluster is not None and cfg.network is not None and cfg.network.existing is not None
    name = cfg.cluster.name
    grant = "grant eks:DescribeCluster, eks:ListAddons, eks:DescribeAddon, eks:ListNodegroups, eks:DescribeNodegroup"
    try:
        found = found_from_describe(eks.describe_cluster(name=name).get("cluster"), asked=name)
    except AWS_ERRORS as exc:
        code, message = aws_error(exc)
        fix = (f"check ml-cluster:cluster.name and aws:region (aws eks list-clusters --region {cfg.region})"
               if code == "ResourceNotFoundException" else grant)
        return [Check(FAIL, f"cluster {name}", f"eks:DescribeCluster: {code}: {message}", fix)]
    except ClusterAnswerError as exc:
        return [Check(FAIL, f"cluster {name}", f"eks:DescribeCluster answered a broken cluster: {exc}",
                      "check the endpoint preflight talks to (AWS_ENDPOINT_URL_EKS, a proxy): EKS answers every "
                      "field it documents")]
    problems = existing_cluster_problems(found, cfg.cluster, cfg.network.existing.vpc_id)
    checks = [Check(FAIL, f"cluster {name}", f"{path}: {why}", "the fix above; then plan again (scripts/plan.py "
                    "checks the same against the cluster)") for path, why in problems]
    if not problems:
        checks.append(Check(PASS, f"cluster {name}", f"{found.status}, Kubernetes {found.version}, in {found.vpc_id}, "
                                                   f"authentication {found.authentication_mode}"))
    checks += _contents(eks, cfg, name, grant)
    if sagemaker is not None:
        checks += check_hyperpod_orchestrator(sagemaker, found)
    if kube_for is not None:
        checks += check_helm_releases(kube_for(found), cfg)
    return checks


def _contents(eks: Any, cfg: StackConfig, name: str, grant: str) -> list[Check]:
    checks = []
    try:
        installed = eks.list_addons(clusterName=name).get("addons") or []
        for addon in sorted(set(installed) & set(stack_addons(cfg))):
            version = eks.describe_addon(clusterName=name, addonName=addon)["addon"].get("addonVersion")
            checks.append(Check(FAIL, f"add-on {addon}", f"already installed on {name} at {version}, not by this "
                                f"stack: pulumi up would fail to create it (ResourceInUseException)",
                                f"pulumi import aws:eks/addon:Addon <its name in the plan> {name}:{addon}, or "
                                f"delete it (aws eks delete-addon --cluster-name {name} --addon-name {addon} "
                                "--preserve)"))
        groups = eks.list_nodegroups(clusterName=name).get("nodegroups") or []
        for group in sorted(groups):
            tags = eks.describe_nodegroup(clusterName=name, nodegroupName=group)["nodegroup"].get("tags") or {}
            if "k8s.io/cluster-autoscaler/enabled" in tags:
                checks.append(Check(FAIL, f"node group {group}", "tagged for cluster-autoscaler auto-discovery: the "
                                    "stack's autoscaler would scale it too, beside whichever already does",
                                    "set ml-cluster:nodes.autoscaler.enabled: false to keep yours, or remove its "
                                    "k8s.io/cluster-autoscaler/enabled tag"))
    except AWS_ERRORS as exc:
        code, message = aws_error(exc)
        checks.append(Check(WARN, f"cluster {name} contents", f"{code}: {message}", grant))
    return checks


# ------------------------------------------------------------------------------------------------- HyperPod


def check_hyperpod_orchestrator(sagemaker: Any, found: FoundCluster, most: int = 100) -> list[Check]:
    """Is the cluster the orchestrator of a SageMaker HyperPod cluster? SageMaker's DescribeCluster names it in
    Orchestrator.Eks.ClusterArn (SageMaker API Reference, ClusterOrchestrator / ClusterOrchestratorEksConfig)."""
    name = "hyperpod"
    try:
        summaries: list[Any] = []
        for page in sagemaker.get_paginator("list_clusters").paginate():
            summaries += page.get("ClusterSummaries") or []
            if len(summaries) >= most:
                break
        for summary in summaries[:most]:
            described = sagemaker.describe_cluster(ClusterName=summary["ClusterName"])
            arn = ((described.get("Orchestrator") or {}).get("Eks") or {}).get("ClusterArn")
            if arn == found.arn:
                return [Check(FAIL, name, f"cluster {found.name} orchestrates SageMaker HyperPod cluster "
                                          f"{summary['ClusterName']}: {HYPERPOD_REFUSAL}",
                              "lay the stack onto an EKS cluster without HyperPod, or use HyperPod's own task "
                              "governance and training operator for it")]
    except AWS_ERRORS as exc:
        code, message = aws_error(exc)
        return [Check(WARN, name, f"not checked: sagemaker:ListClusters/DescribeCluster: {code}: {message}",
                      "grant sagemaker:ListClusters and sagemaker:DescribeCluster")]
    return [Check(PASS, name, f"cluster {found.name} orchestrates no SageMaker HyperPod cluster "
                              f"({len(summaries[:most])} HyperPod clusters in the region checked)")]


# ------------------------------------------------------------------------------------------------- Helm


def _record(data: str) -> dict[str, Any]:
    """Helm's decodeRelease: base64, then gunzip when the gzip magic leads, then JSON."""
    raw = base64.b64decode(data, validate=True)
    if raw[:3] == _GZIP_MAGIC:
        unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        raw = unzip.decompress(raw, MAX_RECORD_BYTES + 1)
        if len(raw) > MAX_RECORD_BYTES or unzip.unconsumed_tail:
            raise ValueError(f"over {MAX_RECORD_BYTES} bytes unzipped")
    document = json.loads(raw)
    if not isinstance(document, dict):
        raise ValueError("not a release object")
    return document


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _release(item: dict[str, Any], secret: bool) -> HelmRelease | None:
    meta = _object(item.get("metadata"))
    labels = _object(meta.get("labels"))
    if secret and item.get("type") != HELM_RELEASE_TYPE:
        return None  # labelled owner=helm by something else
    release, namespace = str(labels.get("name") or ""), str(meta.get("namespace") or "")
    revision = str(labels.get("version") or "0")
    data = _object(item.get("data")).get("release")
    base = HelmRelease(release, namespace, int(revision) if revision.isdigit() else 0,
                       str(labels.get("status") or ""), "", "")
    try:
        if not isinstance(data, str):
            raise ValueError("no release data")
        # A Secret's data is base64 once more on the API (a ConfigMap's is the text itself).
        body = _record(base64.b64decode(data, validate=True).decode("ascii") if secret else data)
        metadata = _object(_object(body.get("chart")).get("metadata"))
        if not isinstance(metadata.get("name"), str):
            raise ValueError("no chart name in it")
    except (ValueError, binascii.Error, UnicodeDecodeError, zlib.error, EOFError, gzip.BadGzipFile,
            RecursionError) as exc:
        return HelmRelease(base.name, base.namespace, base.revision, base.status, "", "",
                           unreadable=" ".join(str(exc).split())[:80] or type(exc).__name__)
    return HelmRelease(base.name, base.namespace, base.revision, base.status, metadata["name"],
                       str(metadata.get("version") or "?"))


def helm_releases(kube: KubeApi) -> list[HelmRelease]:
    """The newest revision of every Helm release on the cluster (Secrets and ConfigMaps labelled owner=helm, in
    every namespace), uninstalled ones (kept with --keep-history) left out."""
    found: dict[tuple[str, str], HelmRelease] = {}
    for path, secret in (("/api/v1/secrets", True), ("/api/v1/configmaps", False)):
        for item in kube.list_items(path, HELM_OWNER):
            release = _release(item, secret)
            if release is None or not release.name:
                continue
            key = (release.namespace, release.name)
            if key not in found or release.revision > found[key].revision:
                found[key] = release
    return sorted((r for r in found.values() if r.status != "uninstalled"), key=lambda r: (r.namespace, r.name))


def check_helm_releases(kube: KubeApi, cfg: StackConfig) -> list[Check]:
    """Each chart the stack installs against the Helm releases already on the cluster."""
    try:
        releases = helm_releases(kube)
    except KubeApiError as exc:
        fix = ("grant list on secrets and configmaps in all namespaces to the caller's access entry, or run "
               "helm list -A" if exc.status in (401, 403) else
               "run preflight where the cluster's endpoint is reachable (its VPC, a bastion), or run helm list -A")
        return [Check(WARN, "helm releases", f"not checked: {exc.why}", fix)]
    checks = [Check(WARN, f"helm release {r.namespace}/{r.name}", f"record not readable ({r.unreadable})",
                    f"helm history {r.name} -n {r.namespace}") for r in releases if r.unreadable]
    hyperpod = [r for r in releases if r.chart == HYPERPOD_CHART]
    if hyperpod:
        checks.append(Check(FAIL, "hyperpod", f"release {hyperpod[0].name} in {hyperpod[0].namespace} is "
                                              f"{HYPERPOD_CHART}: {HYPERPOD_REFUSAL}",
                            "lay the stack onto an EKS cluster without HyperPod"))
    conflicts = [check for chart in stack_charts(cfg) for check in _conflicts(chart.chart, chart.namespace,
                                                                               chart.version, releases)]
    charts = ", ".join(chart.chart.chart for chart in stack_charts(cfg))
    return checks + (conflicts or [Check(PASS, "helm releases", f"none of the stack's charts ({charts}) or their "
                                                                f"rivals among {len(releases)} releases")])


def _conflicts(chart: StackChart, namespace: str, version: str, releases: Iterable[HelmRelease]) -> list[Check]:
    checks = []
    keep = f"keep yours: set ml-cluster:{chart.key}.enabled: false"
    for release in releases:
        same_place = (release.namespace, release.name) == (namespace, chart.release)
        where = f"release {release.name} in {release.namespace}"
        if release.chart == chart.chart and same_place:
            checks.append(Check(WARN, f"helm {chart.chart}", f"{where} is already {release.chart} {release.version} "
                                f"({release.status}): this stack's own from an earlier pulumi up, or one pulumi up "
                                "cannot install over (Helm: cannot re-use a name that is still in use)",
                                f"if it is not this stack's: {keep}, or helm uninstall {release.name} -n "
                                f"{release.namespace}"))
        elif release.chart == chart.chart or release.chart in chart.rivals:
            what = "a second one" if release.chart == chart.chart else f"{chart.chart} beside it"
            checks.append(Check(FAIL, f"helm {chart.chart}", f"{where} already runs {release.chart} "
                                f"{release.version} ({release.status}); the stack would install {what} "
                                f"({chart.chart} {version} in {namespace}) and the two would fight",
                                f"{keep} (the stack then installs no {chart.chart}; what it builds on one is off "
                                f"with it), or helm uninstall {release.name} -n {release.namespace}"))
        elif same_place and release.chart:
            checks.append(Check(FAIL, f"helm {chart.chart}", f"{where} is taken by chart {release.chart} "
                                f"{release.version}: Helm refuses to install {chart.chart} under that name",
                                f"{keep}, or helm uninstall {release.name} -n {release.namespace}"))
    return checks
