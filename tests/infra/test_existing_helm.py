"""Preflight of an existing cluster reads the Helm releases already there the way Helm stores them (Secrets of type
helm.sh/release.v1 labelled owner=helm, or ConfigMaps with the configmap driver; the release record base64 of gzipped
JSON) through the Kubernetes API (the stand-in in tests/jobs/kubeapi.py), and turns a release of a chart the stack
installs, or of its rival, into a FAIL with the fix; a HyperPod cluster is refused by a dedicated line, from its
Helm chart or from SageMaker's DescribeCluster (the AWS stub); a forbidden or unreachable API is one line."""

from __future__ import annotations

import base64
import gzip
import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from infra.account.checks import FAIL, PASS, WARN
from infra.account.existing import check_helm_releases, check_hyperpod_orchestrator, helm_releases
from infra.account.kubeapi import KubeApi
from infra.config.schema import decode_config_value, parse_stack_config
from infra.existing_cluster import found_from_get_cluster
from infra.plan.engine import FIXTURES_DIR, STACKS_DIR
from tests.jobs.kubeapi import TOKEN, FakeApiServer, fake_api_server

FOUND = found_from_get_cluster(json.loads((FIXTURES_DIR / "clusters.json").read_text())["ml-shared"])


def _config() -> Any:
    values = yaml.safe_load((STACKS_DIR / "Pulumi.existing.yaml").read_text())["config"]
    return parse_stack_config({key: decode_config_value(value) for key, value in values.items()})


def helm_record(name: str, namespace: str, revision: int, status: str, chart: str, version: str) -> str:
    """Helm's encodeRelease: the release JSON, gzipped, base64 (pkg/storage/driver/util.go)."""
    release = {"name": name, "namespace": namespace, "version": revision, "info": {"status": status},
               "chart": {"metadata": {"name": chart, "version": version}}, "manifest": "---\n"}
    return base64.b64encode(gzip.compress(json.dumps(release).encode())).decode()


def stored(name: str, namespace: str, chart: str, version: str, revision: int = 1, status: str = "deployed",
           driver: str = "secret") -> dict[str, Any]:
    """The object Helm's storage driver writes for one revision (pkg/storage/driver/secrets.go newSecretsObject)."""
    record = helm_record(name, namespace, revision, status, chart, version)
    meta = {"name": f"sh.helm.release.v1.{name}.v{revision}", "namespace": namespace,
            "labels": {"owner": "helm", "name": name, "status": status, "version": str(revision)}}
    if driver == "configmap":
        return {"kind": "ConfigMap", "metadata": meta, "data": {"release": record}}
    return {"kind": "Secret", "type": "helm.sh/release.v1", "metadata": meta,
            "data": {"release": base64.b64encode(record.encode()).decode()}}  # Secret data: base64 on the API


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        yield server


def _kube(server: FakeApiServer) -> KubeApi:
    return KubeApi(server.url, TOKEN, timeout_s=5, deadline_s=10)


def test_each_release_of_a_chart_the_stack_installs_or_of_its_rival_is_a_fail_with_the_fix(
        api: FakeApiServer) -> None:
    for item in (
        stored("kueue", "kueue", "kueue", "0.13.4", revision=1, status="superseded"),
        stored("kueue", "kueue", "kueue", "0.13.4", revision=2),  # the newest revision counts
        stored("karpenter", "karpenter", "karpenter", "1.6.0"),  # the autoscaler's rival
        stored("efa", "kube-system", "aws-efa-k8s-device-plugin", "v0.5.6", driver="configmap"),
        stored("nvidia-device-plugin", "kube-system", "nvidia-device-plugin", "0.20.0"),  # the stack's own place
        stored("cert-manager", "cert-manager", "cert-manager", "v1.18.2"),  # not the stack's business
        stored("old-kueue", "default", "kueue", "0.9.0", status="uninstalled"),  # --keep-history leftovers
        {"kind": "Secret", "type": "Opaque", "metadata": {"name": "x", "namespace": "default",
                                                          "labels": {"owner": "helm", "name": "x"}}, "data": {}},
    ):
        api.add(item)
    checks = check_helm_releases(_kube(api), _config())
    by = {(check.name, check.status): check for check in checks}
    kueue = by[("helm kueue", FAIL)]
    assert "release kueue in kueue already runs kueue 0.13.4 (deployed)" in kueue.detail
    assert kueue.fix.startswith('keep yours: set ml-cluster:kueue.external: {version: "0.13.4", release: kueue, '
                                'namespace: kueue}') and "helm uninstall kueue -n kueue" in kueue.fix
    autoscaler = by[("helm cluster-autoscaler", FAIL)]  # a rival is not adopted: the stack's is turned off
    assert "karpenter 1.6.0" in autoscaler.detail and "nodes.autoscaler.enabled: false" in autoscaler.fix
    efa = by[("helm aws-efa-k8s-device-plugin", FAIL)]
    assert "aws-efa-k8s-device-plugin v0.5.6" in efa.detail
    assert 'efaDevicePlugin.external: {version: "v0.5.6"' in efa.fix
    own = by[("helm nvidia-device-plugin", PASS)]
    assert "this stack's own from an earlier pulumi up (its namespace, release name and chart)" in own.detail
    assert not any("cert-manager" in c.detail or "old-kueue" in c.detail for c in checks)
    assert len(checks) == 4, checks


def _adopting(**sections: Any) -> Any:
    """The example stack with `external:` set on some of its sections (dotted keys: gpu.devicePlugin)."""
    values = yaml.safe_load((STACKS_DIR / "Pulumi.existing.yaml").read_text())["config"]
    for dotted, external in sections.items():
        top, *rest = dotted.split("__")
        section = values.setdefault(f"ml-cluster:{top}", {})
        if rest == ["enabled"]:
            section["enabled"] = external
            continue
        for key in rest:
            section = section.setdefault(key, {})
        section["external"] = external
    return parse_stack_config({key: decode_config_value(value) for key, value in values.items()})


def test_a_second_preflight_after_up_reads_the_stacks_own_releases_as_its_own(api: FakeApiServer) -> None:
    """Every release the stack installs, where and at the version it installs it (what a first `up` leaves), plus
    one an earlier config installed at another version: all PASS, none a conflict."""
    from infra.config.charts import stack_charts

    cfg = _config()
    charts = stack_charts(cfg)
    assert {c.chart.chart for c in charts} >= {"kueue", "nvidia-device-plugin", "cluster-autoscaler"}
    for index, chart in enumerate(charts):
        version = "0.18.0" if chart.chart.chart == "kueue" else chart.version  # the stack's own, one upgrade behind
        api.add(stored(chart.chart.release, chart.namespace, chart.chart.chart, version, revision=index + 1))
    checks = check_helm_releases(_kube(api), cfg)
    assert [c.status for c in checks] == [PASS] * (len(charts) + 1), checks  # one row per chart, then the summary
    kueue = next(c for c in checks if c.name == "helm kueue")
    assert "this stack's own" in kueue.detail and "pulumi up moves it to 0.19.2" in kueue.detail


@pytest.mark.parametrize(("running", "status", "says", "fix"), [
    (("kueue", "kueue", "kueue", "0.13.4"), PASS, "adopted: release kueue in kueue runs kueue 0.13.4 (deployed)", ""),
    (("kueue", "kueue", "kueue", "0.14.1"), FAIL, "runs kueue 0.14.1 (deployed), ml-cluster:kueue.external.version "
     "says 0.13.4", 'set ml-cluster:kueue.external.version: "0.14.1" (the stack\'s Kueue objects follow its API'),
    (("kueue", "kueue-system", "kueue", "0.13.4"), FAIL, "names release kueue in kueue, but no such release; kueue "
     "runs as kueue in kueue-system (kueue 0.13.4)", "point ml-cluster:kueue.external.release and .namespace"),
    (("kueue", "kueue", "jobset", "0.10.1"), FAIL, "but it runs chart jobset 0.10.1", "drop ml-cluster:kueue.external"),
])
def test_an_adopted_release_must_run_the_declared_version(api: FakeApiServer, running: tuple[str, ...], status: str,
                                                           says: str, fix: str) -> None:
    api.add(stored(*running))
    cfg = _adopting(kueue={"version": "0.13.4", "release": "kueue", "namespace": "kueue"})
    [check] = [c for c in check_helm_releases(_kube(api), cfg) if c.name == "helm kueue"]
    assert check.status == status and says in check.detail and fix in check.fix, check


def _manager_config(config: dict[str, Any] | str, name: str = "kueue-manager-config") -> dict[str, Any]:
    """The adopted Kueue chart's ConfigMap (charts/kueue/templates/manager/manager-config.yaml)."""
    text = config if isinstance(config, str) else yaml.safe_dump(config)
    return {"kind": "ConfigMap", "metadata": {"name": name, "namespace": "kueue"},
            "data": {"controller_manager_config.yaml": text}}


FITS = {"apiVersion": "config.kueue.x-k8s.io/v1beta1", "kind": "Configuration", "manageJobsWithoutQueueName": False,
        "waitForPodsReady": {"enable": True, "timeout": "20m0s"}, "integrations": {"frameworks": ["batch/job"]}}


@pytest.mark.parametrize(("config", "status", "says"), [
    (FITS, PASS, "manageJobsWithoutQueueName false, frameworks include batch/job, waitForPodsReady timeout 20m"),
    ({**FITS, "manageJobsWithoutQueueName": True}, FAIL, "would admit the stack's held Jobs"),
    ({**FITS, "integrations": {"frameworks": ["jobset.x-k8s.io/jobset"]}}, FAIL,
     "integrations.frameworks lacks batch/job"),
    ({**FITS, "waitForPodsReady": {"timeout": "20m"}}, WARN, "waitForPodsReady is off"),  # v1beta1: enable defaults off
    ({**FITS, "waitForPodsReady": {"enable": True}}, WARN, "timeout unset (5m, Kueue's default), "
                                                           "kueue.waitForPodsReady.timeout says 20m"),
    ({**FITS, "apiVersion": "config.kueue.x-k8s.io/v1beta2", "waitForPodsReady": {"timeout": "1h"}}, WARN,
     "waitForPodsReady.timeout 1h, kueue.waitForPodsReady.timeout says 20m"),
    ("{not yaml", WARN, "not readable"),
])
def test_an_adopted_kueues_own_configuration_is_what_the_stack_relies_on(api: FakeApiServer, config: Any,
                                                                       status: str, says: str) -> None:
    api.add(stored("kueue", "kueue", "kueue", "0.13.4"))
    api.add(_manager_config(config))
    cfg = _adopting(kueue={"version": "0.13.4", "release": "kueue", "namespace": "kueue"})
    rows = [c for c in check_helm_releases(_kube(api), cfg) if c.name == "kueue configuration"]
    assert len(rows) == 1 and rows[0].status == status and says in rows[0].detail, rows


def test_an_adopted_kueues_configuration_is_found_by_the_charts_fullname(api: FakeApiServer) -> None:
    """A release not named like the chart: the chart's objects are <release>-kueue (_helpers.tpl:29-40); none
    there is one WARN line."""
    api.add(stored("queues", "kueue", "kueue", "0.13.4"))
    cfg = _adopting(kueue={"version": "0.13.4", "release": "queues", "namespace": "kueue"})
    [row] = [c for c in check_helm_releases(_kube(api), cfg) if c.name == "kueue configuration"]
    assert row.status == WARN and "configmaps/queues-kueue-manager-config: 404" in row.detail
    api.add(_manager_config(FITS, name="queues-kueue-manager-config"))
    [row] = [c for c in check_helm_releases(_kube(api), cfg) if c.name == "kueue configuration"]
    assert row.status == PASS


def test_adopted_device_plugin_and_monitoring_are_checked_where_they_run(api: FakeApiServer) -> None:
    """Defaults: the release named like its chart, in the section's namespace (monitoring's `monitoring`)."""
    api.add(stored("nvidia-device-plugin", "kube-system", "nvidia-device-plugin", "0.17.1"))
    api.add(stored("kube-prometheus-stack", "monitoring", "kube-prometheus-stack", "77.0.0"))
    cfg = _adopting(gpu__devicePlugin={"version": "0.17.1"},
                    monitoring={"version": "75.0.0"}, monitoring__enabled=True)
    checks = {c.name: c for c in check_helm_releases(_kube(api), cfg)}
    assert checks["helm nvidia-device-plugin"].status == PASS
    kps = checks["helm kube-prometheus-stack"]
    assert kps.status == FAIL and kps.fix == 'set ml-cluster:monitoring.external.version: "77.0.0"'


def test_a_cluster_without_conflicts_passes_and_releases_are_read_page_by_page(
        api: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import infra.account.kubeapi as kubeapi

    monkeypatch.setattr(kubeapi, "PAGE", 2)
    for index in range(5):
        api.add(stored(f"app-{index}", "apps", "podinfo", "6.9.0"))
    assert len(helm_releases(_kube(api))) == 5
    assert sum(1 for method, path in api.requests if path == "/api/v1/secrets") == 3
    [check] = check_helm_releases(_kube(api), _config())
    assert check.status == PASS and "among 5 releases" in check.detail


def test_a_hyperpod_cluster_is_refused_by_a_dedicated_line(api: FakeApiServer) -> None:
    api.add(stored("hyperpod-dependencies", "aws-hyperpod", "hyperpod-helm-chart", "0.1.0"))
    checks = check_helm_releases(_kube(api), _config())
    [hyperpod] = [check for check in checks if check.name == "hyperpod"]
    assert hyperpod.status == FAIL and "SageMaker HyperPod" in hyperpod.detail and "not supported" in hyperpod.detail


def test_an_unreadable_release_record_is_one_warn_row(api: FakeApiServer) -> None:
    broken = stored("kueue", "kueue-system", "kueue", "0.19.2")
    broken["data"]["release"] = base64.b64encode(b"H4sI-not-gzip").decode()
    api.add(broken)
    checks = check_helm_releases(_kube(api), _config())
    assert [(c.status, c.name) for c in checks][0] == (WARN, "helm release kueue-system/kueue")


@pytest.mark.parametrize("how", ["forbidden", "token", "unreachable"])
def test_a_forbidden_or_unreachable_api_is_one_line(api: FakeApiServer, how: str) -> None:
    kube = _kube(api)
    if how == "forbidden":
        api.forbid_cluster_wide = True
    elif how == "token":
        kube = KubeApi(api.url, "someone-else", timeout_s=5)
    else:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        kube = KubeApi(f"http://127.0.0.1:{port}", TOKEN, timeout_s=2)
    [check] = check_helm_releases(kube, _config())
    assert check.status == WARN and check.detail.startswith("not checked: GET /api/v1/secrets: ")
    says = {"forbidden": "403 secrets is forbidden", "token": "401 Unauthorized", "unreachable": "unreachable"}[how]
    assert says in check.detail and "\n" not in check.detail, check


# --- HyperPod from SageMaker's API, against the AWS stub (JSON protocol, X-Amz-Target SageMaker.<Operation>) -----

@pytest.fixture(scope="module")
def sagemaker_stub() -> Iterator[tuple[Any, Any]]:
    """One stub and one client for the module: SageMaker's service model takes seconds to load."""
    from tests.awsstub import AwsStub

    stub = AwsStub().start()
    yield stub, stub.client("sagemaker")
    stub.stop()


@pytest.fixture
def sagemaker(sagemaker_stub: tuple[Any, Any]) -> tuple[Any, Any]:
    stub, client = sagemaker_stub
    stub.targets.clear()
    stub.targets["SageMaker.ListClusters"] = lambda body: (200, {"ClusterSummaries": [
        {"ClusterArn": "arn:aws:sagemaker:us-east-1:111122223333:cluster/abc", "ClusterName": "hp-train",
         "CreationTime": 1772442867.0, "ClusterStatus": "InService"}]})
    return stub, client


def _described(arn: str) -> Any:
    return lambda body: (200, {"ClusterArn": "arn:aws:sagemaker:us-east-1:111122223333:cluster/abc",
                               "ClusterName": body["ClusterName"], "ClusterStatus": "InService",
                               "CreationTime": 1772442867.0, "InstanceGroups": [],
                               "Orchestrator": {"Eks": {"ClusterArn": arn}}})


def test_sagemaker_naming_the_cluster_as_its_orchestrator_is_the_hyperpod_refusal(sagemaker: Any) -> None:
    stub, client = sagemaker
    stub.targets["SageMaker.DescribeCluster"] = _described(FOUND.arn)
    [check] = check_hyperpod_orchestrator(client, FOUND)
    assert check.status == FAIL and "orchestrates SageMaker HyperPod cluster hp-train" in check.detail
    stub.targets["SageMaker.DescribeCluster"] = _described("arn:aws:eks:us-east-1:111122223333:cluster/other")
    [check] = check_hyperpod_orchestrator(client, FOUND)
    assert check.status == PASS


def test_no_sagemaker_permission_is_one_warn_line(sagemaker: Any) -> None:
    stub, client = sagemaker
    stub.targets["SageMaker.ListClusters"] = lambda body: (400, {"__type": "AccessDeniedException",
                                                                 "message": "not authorized: sagemaker:ListClusters"})
    [check] = check_hyperpod_orchestrator(client, FOUND)
    assert check.status == WARN and "AccessDeniedException" in check.detail


def test_the_token_is_what_aws_eks_get_token_prints() -> None:
    """A presigned sts:GetCallerIdentity URL that signs the cluster's name (x-k8s-aws-id), base64url, prefixed."""
    import boto3

    from infra.account.kubeapi import eks_token

    sts = boto3.client("sts", region_name="us-east-1", aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x")
    token = eks_token(sts, "ml-shared")
    assert token.startswith("k8s-aws-v1.") and "=" not in token
    url = base64.urlsafe_b64decode(token[len("k8s-aws-v1."):] + "==").decode()
    assert "Action=GetCallerIdentity" in url and "X-Amz-Expires=60" in url
    assert "x-k8s-aws-id" in url.split("X-Amz-SignedHeaders=")[1].split("&")[0]
    # the header handler is removed after signing: the same client presigns plain URLs afterwards
    plain = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=60)
    assert "x-k8s-aws-id" not in plain
