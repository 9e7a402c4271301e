"""scripts/render_charts.py: every Helm release of every stack rendered with its real chart at the pinned version
(tests/charts/upstream holds the published packages, see docs/versions.md), node-side DaemonSets placed on the
GPU pools' taints, and the check's own failure modes on small charts written to tmp."""

from __future__ import annotations

import functools
import importlib.util
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.plan import engine

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = Path(__file__).parent / "upstream"
STACKS = ("dev", "staging", "prod", "onprem")
GPU_TAINT = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}

spec = importlib.util.spec_from_file_location("render_charts", ROOT / "scripts" / "render_charts.py")
assert spec is not None and spec.loader is not None
render_charts = importlib.util.module_from_spec(spec)
sys.modules["render_charts"] = render_charts
spec.loader.exec_module(render_charts)


@functools.cache
def cached_plan(stack: str) -> dict[str, Any]:
    return engine.plan_stack(stack)


def plan_stack(stack: str, path: Path | None = None) -> dict[str, Any]:
    return engine.plan_stack(stack, path) if path is not None else cached_plan(stack)


@pytest.fixture(params=STACKS)
def stack_plan(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, plan_stack(request.param)


def test_every_release_renders_cleanly_with_its_real_chart(stack_plan: tuple[str, dict[str, Any]]) -> None:
    stack, plan = stack_plan
    lines = render_charts.check_plan(plan, UPSTREAM, render_charts.stack_kubernetes_version(stack))
    assert lines and all(line.startswith("ok: ") for line in lines), "\n".join(lines)


def tolerates(pod_spec: dict[str, Any], taint: dict[str, str]) -> bool:
    for toleration in pod_spec.get("tolerations") or []:
        if toleration.get("operator") == "Exists" and not toleration.get("key"):
            return True
        if toleration.get("key") == taint["key"] and toleration.get("effect") in (None, "", taint["effect"]):
            return True
    return False


def gpu_taints(plan: dict[str, Any]) -> list[dict[str, str]]:
    """The taints of the plan's GPU pools (EKS node groups; onprem nodes carry the GPU taint)."""
    effects = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    taints = [GPU_TAINT]
    for resource in plan["resources"]:
        if resource["type"] == "aws:eks/nodeGroup:NodeGroup":
            for taint in resource["inputs"].get("taints") or []:
                taints.append({"key": taint["key"], "effect": effects[taint["effect"]]})
    return taints


@functools.cache
def release_objects(stack: str, release_name: str) -> list[dict[str, Any]]:
    """What a committed stack's release renders (the Kueue chart alone takes seconds: render it once)."""
    [release] = [r for r in render_charts.helm_releases(plan_stack(stack)) if r["name"] == release_name]
    return render_charts.rendered_objects(release, UPSTREAM)


def test_node_side_daemonsets_run_on_tainted_gpu_nodes(stack_plan: tuple[str, dict[str, Any]]) -> None:
    stack, plan = stack_plan
    daemonsets = 0
    for release in render_charts.helm_releases(plan):
        for manifest in release_objects(stack, release["name"]):
            if manifest["kind"] != "DaemonSet":
                continue
            daemonsets += 1
            pod_spec = manifest["spec"]["template"]["spec"]
            for taint in gpu_taints(plan):
                assert tolerates(pod_spec, taint), f"{release['name']}: {manifest['metadata']['name']} {taint}"
    assert daemonsets >= 1


def test_csi_s3_node_plugin_tolerates_the_gpu_taint(tmp_path: Path) -> None:
    """onprem with the csi-s3 driver: its node plugin must run where Jobs mount COS (tainted GPU nodes)."""
    raw = yaml.safe_load((ROOT / "stacks" / "Pulumi.onprem.yaml").read_text())
    raw["config"]["ml-cluster:storage"]["cos"]["driver"] = "csi-s3"
    raw["config"]["ml-cluster:storage"]["cos"].pop("workerOs", None)
    path = tmp_path / "Pulumi.onprem.yaml"
    path.write_text(yaml.safe_dump(raw))
    plan = plan_stack("onprem", path)
    [release] = [r for r in render_charts.helm_releases(plan) if r["inputs"]["chart"] == "csi-s3"]
    assert render_charts.check_plan({"resources": [release]}, UPSTREAM, "1.31")[0].startswith("ok: ")
    [node] = [m for m in render_charts.rendered_objects(release, UPSTREAM) if m["kind"] == "DaemonSet"]
    assert tolerates(node["spec"]["template"]["spec"], GPU_TAINT)


def test_ibm_chart_renders_for_plain_kubernetes_and_its_classes_point_at_the_stack() -> None:
    plan = plan_stack("onprem")
    [release] = [r for r in render_charts.helm_releases(plan) if r["inputs"]["chart"] == "ibm-object-storage-plugin"]
    objects = render_charts.rendered_objects(release, UPSTREAM)
    assert not [m for m in objects if m["apiVersion"].startswith("security.openshift.io/")]
    classes = {m["metadata"]["name"]: m for m in objects if m["kind"] == "StorageClass"}
    assert set(classes) == {"ibmc-s3fs-cos", "ibmc-s3fs-cos-perf"}
    for storage_class in classes.values():
        assert storage_class["parameters"]["ibm.io/object-store-endpoint"].startswith("https://")
        assert storage_class["parameters"]["ibm.io/object-store-storage-class"] == "us-south-smart"
    images = {c["image"] for m in objects if m["kind"] in ("DaemonSet", "Deployment")
              for c in m["spec"]["template"]["spec"]["containers"]}
    assert images and all(image.startswith("icr.io/cpopen/") for image in images)  # public registry


def test_dcgm_exporter_resources_are_the_projects_not_a_merge() -> None:
    plan = plan_stack("staging")
    [release] = [r for r in render_charts.helm_releases(plan) if r["inputs"]["chart"] == "dcgm-exporter"]
    [daemonset] = [m for m in render_charts.rendered_objects(release, UPSTREAM) if m["kind"] == "DaemonSet"]
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"},
                                      "limits": {"cpu": "1", "memory": "1Gi"}}


def test_the_nvidia_device_plugin_runs_with_mofed_off_on_efa_stacks() -> None:
    """EFA nodes get their interfaces from the EFA device plugin; the NVIDIA plugin is told MOFED is off rather than
    left to the chart's unset default."""
    plan = plan_stack("prod")
    [release] = [r for r in render_charts.helm_releases(plan) if r["inputs"]["chart"] == "nvidia-device-plugin"]
    daemonsets = [m for m in render_charts.rendered_objects(release, UPSTREAM) if m["kind"] == "DaemonSet"]
    [plugin] = [d for d in daemonsets if d["metadata"]["name"].endswith("nvidia-device-plugin")]
    env = {e["name"]: e.get("value") for c in plugin["spec"]["template"]["spec"]["containers"]
           for e in c.get("env", [])}
    assert env["MOFED_ENABLED"] == "false"


def test_kueue_runs_with_wait_for_pods_ready_and_leaves_jobs_without_a_queue_alone() -> None:
    objects = release_objects("dev", "mlc-dev-kueue-release")
    [config_map] = [m for m in objects if m["kind"] == "ConfigMap" and m["metadata"]["name"] == "kueue-manager-config"]
    config = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["waitForPodsReady"]["timeout"] == "15m"
    assert config["waitForPodsReady"]["requeuingStrategy"]["timestamp"] == "Eviction"
    assert config["manageJobsWithoutQueueName"] is False  # held stack Jobs carry no queue label
    assert config["integrations"]["frameworks"] == ["batch/job"]
    # The chart names its webhook Service after the release; the CRDs' conversion webhook expects kueue-...
    assert config["internalCertManagement"]["webhookServiceName"] == "kueue-webhook-service"
    [deployment] = [m for m in objects if m["kind"] == "Deployment"]
    images = {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert images == {"registry.k8s.io/kueue/kueue:v0.19.2"}


def kueue_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """The served schemas of the CRDs Kueue's chart renders (its CRDs are templates, not a crds/ directory)."""
    crds: dict[tuple[str, str], dict[str, Any]] = {}
    for manifest in release_objects("dev", "mlc-dev-kueue-release"):
        if manifest["kind"] == "CustomResourceDefinition":
            crds.update(render_charts.crd_schemas(manifest))
    return crds


def test_custom_resources_are_checked_strictly_against_the_crds() -> None:
    crds = kueue_crds()
    queue = next(r for r in plan_stack("dev")["resources"] if r["name"] == "mlc-dev-kueue-cq-shared")
    assert render_charts.custom_resource_problems({"resources": [queue]}, crds) == (1, [])
    bad = json.loads(json.dumps(queue))
    bad["inputs"]["spec"]["cohort"] = bad["inputs"]["spec"].pop("cohortName")  # the v1beta1 spelling
    bad["inputs"]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].pop("nominalQuota")
    bad["inputs"]["spec"]["queueingStrategy"] = "FIFO"
    count, problems = render_charts.custom_resource_problems({"resources": [bad]}, crds)
    assert count == 1 and len(problems) == 3, problems
    assert any("'cohort' was unexpected" in p for p in problems)
    assert any("'nominalQuota' is a required property" in p for p in problems)
    assert any("'FIFO' is not one of" in p for p in problems)
    old = json.loads(json.dumps(queue))
    old["inputs"]["apiVersion"] = "kueue.x-k8s.io/v1alpha1"
    assert render_charts.custom_resource_problems({"resources": [old]}, crds)[1] == [
        "mlc-dev-kueue-cq-shared: kueue.x-k8s.io/v1alpha1 ClusterQueue is not served by the CRDs"]


def test_every_kind_of_queue_object_the_config_can_produce_is_valid_against_the_crds() -> None:
    from infra.config.queueing import KueueConfig
    from infra.nodes.poolplan import plan_node_pools
    from infra.queueing import queue_manifests
    from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool

    crds = kueue_crds()
    pools = plan_node_pools(eks_config([{"name": "system", "instanceTypes": ["m6i.large"]},
                                        gpu_pool("gpu-a10g", ["g5.xlarge"], maxSize=8, taints=[
                                            {"key": "team", "value": "vision", "effect": "NO_SCHEDULE"}]),
                                        # a reserved pool: its own flavor, and flavorFungibility on every queue
                                        gpu_pool("a10g-block", ["g5.xlarge"], maxSize=2,
                                                 capacityType="CAPACITY_BLOCK", capacityReservation={
                                                     "id": "cr-0123456789abcdef0", "instanceCount": 2,
                                                     "availabilityZone": "us-west-2a"})]),
                            fixture_lookup)
    config = KueueConfig.model_validate({
        "enabled": True, "fairSharing": True, "queueingStrategy": "StrictFIFO",
        "preemption": {"borrowWithinCohort": "LowerPriority", "withinClusterQueue": "LowerOrNewerEqualPriority"},
        "priorityClasses": [{"name": "production", "value": 1000, "description": "deadline runs"},
                            {"name": "research", "value": -10}],
        "teams": [{"name": "vision", "fairSharingWeight": 2,
                   "quotas": [{"flavor": "a10g", "gpus": 4, "borrowingLimit": 2, "lendingLimit": 1}]},
                  {"name": "nlp", "quotas": [{"flavor": "a10g", "gpus": 2}]}]})
    manifests = queue_manifests(config, pools, "training", "dev", "ml-cluster.io")
    assert {m["kind"] for m in manifests} == {"ResourceFlavor", "WorkloadPriorityClass", "ClusterQueue", "LocalQueue"}
    assert all("flavorFungibility" in m["spec"] for m in manifests if m["kind"] == "ClusterQueue")
    plan = {"resources": [{"type": f"kubernetes:{m['apiVersion']}:{m['kind']}", "name": m["metadata"]["name"],
                           "inputs": m} for m in manifests]}
    assert render_charts.custom_resource_problems(plan, crds) == (len(manifests), [])


# --- the check's failure modes, on small charts written to tmp ---


def write_chart(root: Path, name: str, version: str, values: str, templates: dict[str, str], tgz: bool = False) -> None:
    chart = root / name
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(f"apiVersion: v2\nname: {name}\nversion: {version}\n")
    (chart / "values.yaml").write_text(values)
    for file, text in templates.items():
        (chart / "templates" / file).write_text(text)
    if tgz:
        with tarfile.open(root / f"{name}-{version}.tgz", "w:gz") as archive:
            archive.add(chart, arcname=name)
        for path in sorted(chart.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        chart.rmdir()


CONFIGMAP = """apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}
data:
  size: {{ .Values.config.size | quote }}
"""
SCC = """apiVersion: security.openshift.io/v1
kind: SecurityContextConstraints
metadata:
  name: {{ .Release.Name }}
"""
BAD_POD = """apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}
spec:
  containers:
    - name: c
      image: busybox
      resourcez: {}
"""


def release(chart: str, version: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"type": "kubernetes:helm.sh/v3:Release", "name": f"mlc-test-{chart}",
            "inputs": {"chart": chart, "version": version, "name": chart, "namespace": "kube-system",
                       "values": values}}


@pytest.fixture()
def charts(tmp_path: Path) -> Path:
    write_chart(tmp_path, "good", "1.2.3", "config:\n  size: 1\nextraArgs:\n  v: 1\n", {"cm.yaml": CONFIGMAP},
                tgz=True)
    write_chart(tmp_path, "openshift", "0.1.0", "{}\n", {"scc.yaml": SCC})
    write_chart(tmp_path, "badpod", "0.1.0", "{}\n", {"pod.yaml": BAD_POD})
    return tmp_path


def check(charts: Path, *releases: dict[str, Any]) -> list[str]:
    return render_charts.check_plan({"resources": list(releases)}, charts, "1.33")


def test_a_clean_release_and_free_form_maps_pass(charts: Path) -> None:
    assert check(charts, release("good", "1.2.3", {"config": {"size": 2}, "extraArgs": {"expander": "x"}})) == [
        "ok: mlc-test-good: good 1.2.3: 1 objects"]


def test_a_version_that_was_never_published_is_an_error(charts: Path) -> None:
    [line] = check(charts, release("good", "1.2.4", {}))
    assert line.startswith("error: mlc-test-good: chart good 1.2.4 is not in ")


def test_a_values_key_the_chart_does_not_have_is_an_error(charts: Path) -> None:
    [line] = check(charts, release("good", "1.2.3", {"config": {"sise": 2}, "licence": True}))
    assert line == ("error: mlc-test-good: values key(s) the chart good 1.2.3 does not have: config.sise, licence")


def test_a_key_only_the_templates_read_is_the_charts(tmp_path: Path) -> None:
    """dcgm-exporter's customMetrics is commented out in its values.yaml but read by a template."""
    template = CONFIGMAP.replace("\ndata:", "\ndata:\n  {{- if .Values.customMetrics }}\n  m: x\n  {{- end }}", 1)
    write_chart(tmp_path, "commented", "0.1.0", "config: {}\n", {"cm.yaml": template})
    assert check(tmp_path, release("commented", "0.1.0", {"customMetrics": "a"}))[0].startswith("ok: ")
    [line] = check(tmp_path, release("commented", "0.1.0", {"customMetric": "a"}))
    assert line.endswith("does not have: customMetric")


def test_an_openshift_only_kind_is_an_error(charts: Path) -> None:
    [line] = check(charts, release("openshift", "0.1.0", {}))
    assert line.startswith("error: mlc-test-openshift: openshift/templates/scc.yaml: SecurityContextConstraints/")
    assert "security.openshift.io/v1 SecurityContextConstraints is not served by Kubernetes 1.33" in line


def test_an_invalid_object_is_an_error(charts: Path) -> None:
    [line] = check(charts, release("badpod", "0.1.0", {}))
    assert line.startswith("error: mlc-test-badpod: badpod/templates/pod.yaml: Pod/badpod: ") and "resourcez" in line


def test_cli_prints_error_lines_and_exits_2(charts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stack": "dev", "resources": [release("good", "9.9.9", {}),
                                                                   release("good", "1.2.3", {})]}))
    code = render_charts.main(["--plan", str(plan), "--charts", str(charts), "--kubernetes-version", "1.33"])
    out = capsys.readouterr().out.splitlines()
    assert code == 2 and out[0].startswith("error: mlc-test-good: chart good 9.9.9") and out[1].startswith("ok: ")


def test_eks_addon_node_daemonsets_keep_their_tolerate_everything_defaults(
    stack_plan: tuple[str, dict[str, Any]],
) -> None:
    """The EFS and Mountpoint add-ons are not Helm releases here: their node DaemonSets tolerate every taint by
    default (aws-efs-csi-driver chart values.yaml `node.tolerations: [{operator: Exists}]`; mountpoint-s3-csi-driver
    chart values.yaml `node.tolerateAllTaints: true`), and this program passes no configurationValues that could
    narrow that. The node monitoring agent's node DaemonSet tolerates every taint too (values.yaml:93-95); its
    configuration values only give its DCGM DaemonSet, which tolerates nothing by default, the GPU pools' taints."""
    stack, plan = stack_plan
    addons = [r for r in plan["resources"] if r["type"] == "aws:eks/addon:Addon"]
    names = {addon["inputs"]["addonName"] for addon in addons}
    # The add-ons named above are there on every EKS stack, so the loop below has something to check.
    if stack == "onprem":
        assert names == set()
    else:
        assert names >= {"aws-efs-csi-driver", "aws-mountpoint-s3-csi-driver", "eks-node-monitoring-agent"}, names
    for addon in addons:
        if addon["inputs"]["addonName"] == "eks-node-monitoring-agent":
            assert list(json.loads(addon["inputs"]["configurationValues"])) == ["dcgmAgent"]
            continue
        assert "configurationValues" not in addon["inputs"], addon["name"]


@pytest.mark.parametrize(("content", "why"), [
    (b"[1, 2]", "not a plan document (no resources list)"),
    (b'{"stack": "dev", "resources": [1]}', "resources[0]: not a resource (a mapping with type and name)"),
    (b'{"resources": []}', "names no stack: pass --kubernetes-version"),
    (b'{"stack": "../x", "resources": []}', "'../x' is not a valid stack name"),
    (b"\xff\xfe", "is not UTF-8 text"),
])
def test_a_plan_that_is_no_plan_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  content: bytes, why: str) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    assert render_charts.main(["--plan", str(path), "--charts", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: {why}") and err.count("\n") == 1, err


def test_bad_arguments_are_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        render_charts.main(["--plan", "x.json"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == "error: arguments: the following arguments are required: --charts\n"


def test_jobset_and_trainer_install_one_jobset_controller_and_no_upstream_runtimes() -> None:
    jobset = release_objects("prod", "mlc-prod-jobset-release")
    [deployment] = [m for m in jobset if m["kind"] == "Deployment"]
    assert {c["image"] for c in deployment["spec"]["template"]["spec"]["containers"]} == {
        "registry.k8s.io/jobset/jobset:v0.12.0"}
    trainer = release_objects("prod", "mlc-prod-trainer-release")
    kinds = {(m["kind"], m["metadata"]["name"]) for m in trainer}
    # The chart's JobSet subchart is off: the jobset release is the only JobSet controller and webhook.
    assert not [name for kind, name in kinds if kind == "Deployment" and "jobset" in name]
    assert not [m for m in trainer if m["kind"] in ("ClusterTrainingRuntime", "Job")]  # upstream runtimes off
    [manager] = [m for m in trainer if m["kind"] == "Deployment"]
    assert {c["image"] for c in manager["spec"]["template"]["spec"]["containers"]} == {
        "ghcr.io/kubeflow/trainer/trainer-controller-manager:v2.3.0"}
    crds = {(m["spec"]["group"], m["spec"]["names"]["kind"]) for m in trainer
            if m["kind"] == "CustomResourceDefinition"}
    assert crds == {("trainer.kubeflow.org", kind)
                    for kind in ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")}


def test_kueue_integrates_jobsets_and_trainjobs_where_the_controllers_run() -> None:
    for stack in ("prod", "staging"):
        objects = release_objects(stack, f"mlc-{stack}-kueue-release")
        [config_map] = [m for m in objects if m["kind"] == "ConfigMap"
                        and m["metadata"]["name"] == "kueue-manager-config"]
        config = yaml.safe_load(config_map["data"]["controller_manager_config.yaml"])
        assert config["integrations"]["frameworks"] == [
            "batch/job", "jobset.x-k8s.io/jobset", "trainer.kubeflow.org/trainjob"]


@pytest.mark.parametrize(("version", "why"), [
    ("abc", "--kubernetes-version: 'abc' is not a Kubernetes version such as 1."),
    ("1.3x", "--kubernetes-version: '1.3x' is not a Kubernetes version such as 1."),
    ("1.2", "--kubernetes-version: 1.2: kubernetes-validate has schemas for 1."),
])
def test_a_kubernetes_version_that_is_none_is_one_error_line(charts: Path, tmp_path: Path, version: str, why: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"stack": "dev", "resources": [release("good", "1.2.3", {})]}))
    assert render_charts.main(["--plan", str(plan), "--charts", str(charts), "--kubernetes-version", version]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {plan}: {why}") and captured.err.count("\n") == 1 and not captured.out


@pytest.mark.parametrize(("content", "why"), [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", "not a YAML text (UnicodeDecodeError)"),
    (b"name: [unclosed\n", "not a YAML text (ParserError)"),
    (b"- name\n- version\n", "not a chart's metadata (a mapping with name and version)"),
])
def test_a_chart_yaml_that_is_no_metadata_is_that_releases_error(charts: Path, content: bytes, why: str) -> None:
    write_chart(charts, "broken", "0.1.0", "{}\n", {"cm.yaml": CONFIGMAP})
    (charts / "broken" / "Chart.yaml").write_bytes(content)
    lines = check(charts, release("broken", "0.1.0", {}), release("good", "1.2.3", {}))
    assert lines == [f"error: mlc-test-broken: {charts / 'broken' / 'Chart.yaml'}: {why}",
                     "ok: mlc-test-good: good 1.2.3: 1 objects"]
