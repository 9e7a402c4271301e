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
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from infra.account.checks import AWS_ERRORS, FAIL, PASS, WARN, Check, aws_error
from infra.account.kubeapi import KubeApi, KubeApiError
from infra.config.addons import wanted_addons
from infra.config.charts import InstalledChart, StackChart, stack_charts
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
    "a SageMaker HyperPod cluster's EKS orchestrator is not supported as a base; missing: node pools taken from "
    "HyperPod's instance groups (the stack would create node groups of its own beside them), Kueue flavors and Job "
    "placement by those nodes' sagemaker.amazonaws.com/* labels, and leaving device plugins, burn-in and node repair "
    "to HyperPod, which creates, health-checks, reboots and replaces its nodes itself")


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
                           sagemaker: Any = None, stack: str | None = None) -> list[Check]:
    """cluster.existing: the cluster is there, in the stack's region, and fits the stack file; no add-on the stack
    installs is there already unless it is the stack's own (`stack`'s tags) or adopted at the version it runs
    (CreateAddon would fail); no node group is already an autoscaler's (two would fight over it); no Helm release
    the stack would install a second of, and every adopted one at its declared version; and no HyperPod."""
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
    if found.region and found.region != cfg.region:  # an endpoint or profile of another region answered
        problems.insert(0, ("aws:region", f"{cfg.region}, but cluster {name} is in {found.region} (its ARN): set "
                                          f"aws:region: {found.region}, or AWS_REGION/AWS_ENDPOINT_URL_EKS to the "
                                          "stack's region"))
    checks = [Check(FAIL, f"cluster {name}", f"{path}: {why}", "the fix above; then plan again (scripts/plan.py "
                    "checks the same against the cluster)") for path, why in problems]
    if not problems:
        checks.append(Check(PASS, f"cluster {name}", f"{found.status}, Kubernetes {found.version}, in {found.vpc_id}, "
                                                   f"authentication {found.authentication_mode}"))
    checks += _contents(eks, cfg, name, grant, stack)
    if sagemaker is not None:
        checks += check_hyperpod_orchestrator(sagemaker, found)
    if kube_for is not None:
        checks += check_helm_releases(kube_for(found), cfg)
    return checks


def _contents(eks: Any, cfg: StackConfig, name: str, grant: str, stack: str | None = None) -> list[Check]:
    checks = []
    try:
        installed = eks.list_addons(clusterName=name).get("addons") or []
        kept = {str(key): value for key, value in cfg.storage.external_addons.items()}
        for addon in sorted(set(installed) & set(wanted_addons(cfg))):
            found = eks.describe_addon(clusterName=name, addonName=addon)["addon"]
            checks.append(_addon_row(eks, cfg, name, addon, found, kept.get(addon), stack))
        checks += [Check(FAIL, f"add-on {addon}", f"storage.externalAddons names {addon} {version}, but {name} runs "
                                                  "no such add-on",
                         "drop it from ml-cluster:storage.externalAddons (the stack then installs it)")
                   for addon, version in sorted(kept.items()) if addon not in installed]
        groups = eks.list_nodegroups(clusterName=name).get("nodegroups") or []
        autoscaler = cfg.nodes.autoscaler
        for group in sorted(groups if autoscaler.enabled and autoscaler.external is None else ()):
            tags = eks.describe_nodegroup(clusterName=name, nodegroupName=group)["nodegroup"].get("tags") or {}
            if _own(tags, stack):
                continue  # the stack's own pools (after a first `up`): its autoscaler is meant to scale them
            if "k8s.io/cluster-autoscaler/enabled" in tags:
                checks.append(Check(FAIL, f"node group {group}", "tagged for cluster-autoscaler auto-discovery: the "
                                    "stack's autoscaler would scale it too, beside whichever already does",
                                    "set ml-cluster:nodes.autoscaler.enabled: false to keep yours, or remove its "
                                    "k8s.io/cluster-autoscaler/enabled tag"))
    except AWS_ERRORS as exc:
        code, message = aws_error(exc)
        checks.append(Check(WARN, f"cluster {name} contents", f"{code}: {message}", grant))
    return checks


def _own(tags: dict[str, str], stack: str | None) -> bool:
    """Tagged as this stack's: the stack tags what it creates project=ml-cluster, stack=<stack>
    (infra/stack.py stack_context); EKS returns the tags with DescribeAddon and DescribeNodegroup."""
    return stack is not None and tags.get("project") == "ml-cluster" and tags.get("stack") == stack


def _would_install(eks: Any, cfg: StackConfig, addon: str) -> str | None:
    """The version `pulumi up` would install: the storage.addonVersions pin, else EKS's default for the cluster's
    Kubernetes version (DescribeAddonVersions); None when EKS does not say."""
    pinned = {str(key): value for key, value in cfg.storage.addon_versions.items()}.get(addon)
    if pinned:
        return pinned
    try:
        listed = eks.describe_addon_versions(addonName=addon, kubernetesVersion=cfg.kubernetes_version)
    except AWS_ERRORS:
        return None
    for info in listed.get("addons") or []:
        for version in info.get("addonVersions") or []:
            if any(c.get("defaultVersion") for c in version.get("compatibilities") or []):
                return str(version.get("addonVersion"))
    return None


def _addon_row(eks: Any, cfg: StackConfig, cluster: str, addon: str, found: dict[str, Any], declared: str | None,
               stack: str | None) -> Check:
    """An add-on the stack needs that the cluster already has; whose it is is read from its tags (_own).
    CreateAddon fails on any add-on of that name already there (ResourceInUseException), whatever its
    version, so one that is not the stack's is either adopted (storage.externalAddons, at the version it runs) or a
    FAIL."""
    version = str(found.get("addonVersion") or "?")
    tags = found.get("tags") or {}
    name = f"add-on {addon}"
    if _own(tags, stack):
        return Check(PASS, name, f"{version}: this stack's own (tagged project=ml-cluster, stack={stack})")
    key = "ml-cluster:storage.externalAddons"
    if declared is not None:
        if declared == version:
            return Check(PASS, name, f"adopted: {cluster} runs {addon} {version} as {key} says; the stack installs "
                                     "none and creates no role or Pod Identity association for it")
        return Check(FAIL, name, f"{cluster} runs {addon} {version}, {key} says {declared}",
                     f"set {key}.{addon}: {version}")
    wanted = _would_install(eks, cfg, addon)
    same = wanted == version
    return Check(FAIL, name, f"already installed on {cluster} at {version}, not by this stack"
                 + (" (the version the stack would install)" if same else
                    f" (the stack would install {wanted or 'EKS default'})")
                 + ": pulumi up would fail to create it (ResourceInUseException)",
                 f"adopt it: set {key}.{addon}: {version} (its own role must then allow the stack's file system "
                 f"and buckets), or delete it (aws eks delete-addon --cluster-name {cluster} --addon-name {addon} "
                 "--preserve) and let the stack install it")


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
    """Each chart the stack installs or adopts against the Helm releases already on the cluster."""
    try:
        releases = helm_releases(kube)
    except KubeApiError as exc:
        if exc.tls:  # something answered for the endpoint that the cluster's CA did not vouch for: not the cluster
            return [Check(FAIL, "helm releases", f"not checked: {exc.why}", "check what answers for the cluster's "
                          "endpoint (a TLS-intercepting proxy: add it to NO_PROXY; a stale endpoint or CA: "
                          "aws eks describe-cluster); the token is not sent to it")]
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
    charts = stack_charts(cfg)
    rows = [check for chart in charts for check in (_adopted(chart, releases) if chart.external
                                                    else _conflicts(chart, releases))]
    rows += [check for chart in charts if chart.external and chart.chart.key == "kueue"
             for check in kueue_configuration(kube, cfg, chart)]
    names = ", ".join(chart.chart.chart for chart in charts if not chart.external)
    if not any(check.status != PASS for check in rows):
        rows.append(Check(PASS, "helm releases", f"no second copy of the stack's charts ({names or 'none'}) or "
                                                 f"their rivals among {len(releases)} releases"))
    return checks + rows


def _key(chart: StackChart) -> str:
    return f"ml-cluster:{chart.key}"


def _adopt_fix(chart: StackChart, release: HelmRelease) -> str:
    """The config that keeps the user's release as the stack's external dependency (or turns the stack's off)."""
    if not chart.adoptable or release.chart != chart.chart:
        return f"keep yours: set {_key(chart)}.enabled: false"
    return (f"keep yours: set {_key(chart)}.external: {{version: \"{release.version}\", release: {release.name}, "
            f"namespace: {release.namespace}}} (the stack then installs none and builds on it)")


def _adopted(chart: InstalledChart, releases: Iterable[HelmRelease]) -> list[Check]:
    """An adopted release (`external`): there, running the chart at the declared version."""
    name, key = f"helm {chart.chart.chart}", f"{_key(chart.chart)}.external"
    where = f"release {chart.release_name} in {chart.namespace}"
    found = next((r for r in releases if (r.namespace, r.name) == (chart.namespace, chart.release_name)), None)
    others = sorted(f"{r.name} in {r.namespace} ({r.chart} {r.version})" for r in releases
                    if r.chart == chart.chart.chart)
    if found is None or found.chart != chart.chart.chart:
        what = "no such release" if found is None else f"it runs chart {found.chart} {found.version}"
        return [Check(FAIL, name, f"{key} names {where}, but {what}"
                      + (f"; {chart.chart.chart} runs as {', '.join(others)}" if others else ""),
                      f"point {key}.release and .namespace at it (helm list -A), or drop {key} and let the stack "
                      f"install {chart.chart.chart}")]
    if found.version.lstrip("v") != chart.version.lstrip("v"):
        follows = " (the stack's Kueue objects follow its API version)" if chart.chart.key == "kueue" else ""
        return [Check(FAIL, name, f"{where} runs {found.chart} {found.version} ({found.status}), {key}.version "
                                  f"says {chart.version}",
                      f"set {key}.version: \"{found.version}\"{follows}")]
    status = PASS if found.status == "deployed" else WARN
    return [Check(status, name, f"adopted: {where} runs {found.chart} {found.version} ({found.status}); the stack "
                                "installs none and builds on it",
                  f"helm history {found.name} -n {found.namespace}: a release that is not deployed may be "
                  "half-installed")]


def _conflicts(installed: InstalledChart, releases: Iterable[HelmRelease]) -> list[Check]:
    """Releases beside one the stack installs. The stack's own release (after a first `up`) is told by content: the
    namespace, release name and chart the stack gives it. Pulumi marks nothing on a Helm release it installs
    (pulumi-kubernetes v4.32.0 provider/pkg/provider/helm_release.go:613-623 sets the namespace, name, description
    and the chart's values, as `helm install` would), and no user's release of that chart under that name can sit
    beside it (Helm: a name is unique per namespace), so that place holds either the stack's own or the one
    release that makes `pulumi up` fail ("cannot re-use a name that is still in use"), which the row says."""
    chart, namespace, version = installed.chart, installed.namespace, installed.version
    checks = []
    for release in releases:
        same_place = (release.namespace, release.name) == (namespace, chart.release)
        where = f"release {release.name} in {release.namespace}"
        if release.chart == chart.chart and same_place:
            change = "" if release.version.lstrip("v") == version.lstrip("v") else f"; pulumi up moves it to {version}"
            checks.append(Check(PASS, f"helm {chart.chart}", f"{where} runs {release.chart} {release.version} "
                                f"({release.status}): this stack's own from an earlier pulumi up (its namespace, "
                                f"release name and chart){change}",
                                f"if you installed it yourself, pulumi up cannot install over it: "
                                f"{_adopt_fix(chart, release)}"))
        elif release.chart == chart.chart or release.chart in chart.rivals:
            what = "a second one" if release.chart == chart.chart else f"{chart.chart} beside it"
            checks.append(Check(FAIL, f"helm {chart.chart}", f"{where} already runs {release.chart} "
                                f"{release.version} ({release.status}); the stack would install {what} "
                                f"({chart.chart} {version} in {namespace}) and the two would fight",
                                f"{_adopt_fix(chart, release)}, or helm uninstall {release.name} -n "
                                f"{release.namespace}"))
        elif same_place and release.chart:
            checks.append(Check(FAIL, f"helm {chart.chart}", f"{where} is taken by chart {release.chart} "
                                f"{release.version}: Helm refuses to install {chart.chart} under that name",
                                f"keep yours: set {_key(chart)}.enabled: false, or helm uninstall {release.name} "
                                f"-n {release.namespace}"))
    return checks


# ------------------------------------------------------------------------------------------------- adopted Kueue

KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
# What Kueue assumes for a waitForPodsReady without a timeout: 5 minutes in the v1beta1 Configuration (kueue v0.13.4
# apis/config/v1beta1/defaults.go:46,99, and only with `enable: true`: the field's default is false,
# configuration_types.go:227), 30 minutes in v1beta2 (v0.19.2 apis/config/v1beta2/defaults.go:48,104-107).
_DEFAULT_READY_TIMEOUT_S = {"v1beta1": 300, "v1beta2": 1800}


def _seconds(duration: Any) -> float | None:
    """A Go duration (20m, 1h30m, 90s, 1m0s) in seconds; None when it is not one."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(duration))
    if not parts or "".join(n + u for n, u in parts) != str(duration):
        return None
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[u] for n, u in parts)


def kueue_configuration(kube: KubeApi, cfg: StackConfig, chart: InstalledChart) -> list[Check]:
    """An adopted Kueue's own Configuration against what the stack relies on: the chart's ConfigMap
    `<fullname>-manager-config`, key controller_manager_config.yaml (kueue v0.13.4 and v0.19.2
    charts/kueue/templates/manager/manager-config.yaml; fullname is the release name when it contains "kueue",
    else `<release>-kueue`: _helpers.tpl:29-40). The stack holds its Jobs suspended without a queue label until
    their data is there (manageJobsWithoutQueueName must stay false), queues the kinds in kueue.integrations, and
    plans gangs with kueue.waitForPodsReady.timeout."""
    release = chart.release_name
    config_map = f"{release if 'kueue' in release else release + '-kueue'}-manager-config"
    name = "kueue configuration"
    where = f"configmap {config_map} in {chart.namespace}"
    try:
        found = kube.get(f"/api/v1/namespaces/{chart.namespace}/configmaps/{config_map}")
        text = _object(found.get("data")).get(KUEUE_CONFIG_KEY)
        config = yaml.safe_load(text) if isinstance(text, str) else None
        if not isinstance(config, dict):
            raise ValueError(f"no {KUEUE_CONFIG_KEY} in it")
    except KubeApiError as exc:
        return [Check(WARN, name, f"not checked: {exc.why}", f"grant get on {where}, or compare kueue.integrations "
                                                            "and kueue.waitForPodsReady with it yourself")]
    except (ValueError, yaml.YAMLError) as exc:
        return [Check(WARN, name, f"{where}: not readable ({' '.join(str(exc).split())[:80]})",
                      f"kubectl get configmap {config_map} -n {chart.namespace} -o yaml")]
    checks = []
    if config.get("manageJobsWithoutQueueName") is True:
        checks.append(Check(FAIL, name, f"{where}: manageJobsWithoutQueueName: true: that Kueue would admit the "
                                        "stack's held Jobs (created suspended, without a queue label) at once, "
                                        "before their data is uploaded",
                            "set manageJobsWithoutQueueName: false in that Kueue's managerConfig"))
    frameworks = _object(config.get("integrations")).get("frameworks") or []
    missing = [kind for kind in cfg.kueue.integrations if kind not in frameworks]
    if missing:
        checks.append(Check(FAIL, name, f"{where}: integrations.frameworks lacks {', '.join(missing)}: that Kueue "
                                        "leaves those workloads alone and they run outside the quota",
                            f"add {', '.join(missing)} to that Kueue's integrations.frameworks"))
    api = "v1beta1" if str(config.get("apiVersion", "")).endswith("/v1beta1") else "v1beta2"
    wait = config.get("waitForPodsReady")
    on = isinstance(wait, dict) and (wait.get("enable") is True if api == "v1beta1" else True)
    declared = cfg.kueue.wait_for_pods_ready.timeout
    if api == "v1beta1" and not on:
        checks.append(Check(WARN, name, f"{where}: waitForPodsReady is off: a gang whose pods cannot all start "
                                        f"keeps its quota; kueue.waitForPodsReady.timeout ({declared}) is not enforced",
                            f"turn it on there (waitForPodsReady: {{enable: true, timeout: {declared}}})"))
    else:
        timeout = _object(wait).get("timeout")
        seconds = _seconds(timeout) if timeout is not None else _DEFAULT_READY_TIMEOUT_S[api]
        if seconds != _seconds(declared):
            default = f"unset ({_DEFAULT_READY_TIMEOUT_S[api] // 60}m, Kueue's default)"
            shown = timeout if timeout is not None else default
            checks.append(Check(WARN, name, f"{where}: waitForPodsReady.timeout {shown}, kueue.waitForPodsReady."
                                            f"timeout says {declared} (the cold-start check and the Jobs' gang "
                                            "timeout use it)",
                                "set ml-cluster:kueue.waitForPodsReady.timeout to what that Kueue runs"))
    return checks or [Check(PASS, name, f"{where}: manageJobsWithoutQueueName false, frameworks include "
                                        f"{', '.join(cfg.kueue.integrations)}, waitForPodsReady timeout {declared}")]
