"""The existing-cluster example adopting what the platform team keeps: their Kueue (0.13.4, v1beta1 API), NVIDIA device
plugin, kube-prometheus-stack, cluster-autoscaler and Pod Identity agent add-on. The plan installs none of them (no
Helm release, no add-on, no role: nothing `destroy` would remove) and still builds what depends on them, each object
valid: built-in kinds by kubernetes-validate (strict), Kueue's against the v0.13.4 CRDs, the PodMonitor and
PrometheusRule against the Prometheus operator's."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import ConfigError
from infra.plan.engine import kubernetes_objects, plan_stack, validate_kubernetes_objects
from tests.conftest import stack_values
from tests.monitoring.crds import validate_custom_resource
from tests.queueing.test_adopted_kueue import crds_of

ADOPTED = {
    "ml-cluster:kueue": {"external": {"version": "0.13.4", "release": "kueue", "namespace": "kueue"}},
    "ml-cluster:gpu": {"devicePlugin": {"external": {"version": "0.17.1"}}},
    "ml-cluster:monitoring": {"enabled": True, "external": {"version": "77.0.0", "release": "prometheus",
                                                            "namespace": "observability"}},
    "ml-cluster:nodes": {"autoscaler": {"external": {"version": "9.46.6"}}},
    "ml-cluster:storage": {"externalAddons": {"eks-pod-identity-agent": "v1.3.8-eksbuild.2"}},
}


def adopted_values() -> dict[str, Any]:
    values = stack_values("existing")
    for key, section in ADOPTED.items():
        current = values.setdefault(key, {})
        for name, value in section.items():
            current[name] = {**current.get(name, {}), **value} if isinstance(value, dict) and name != "external" \
                and name != "externalAddons" else value
    return values


@functools.cache
def adopted_plan(tmp: str) -> dict[str, Any]:
    path = Path(tmp) / "Pulumi.existing.yaml"
    path.write_text(yaml.safe_dump({"config": adopted_values()}))
    return plan_stack("existing", path)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return adopted_plan(str(tmp_path_factory.mktemp("adopted")))


@pytest.mark.slow  # two plans of the stack (about 20 s here); the cheap siblings are below and in test_adopted_kueue
def test_nothing_adopted_is_installed_and_what_builds_on_it_is(plan: dict[str, Any], stack_plan: Any) -> None:
    own = stack_plan("existing")
    releases = {r["inputs"]["name"] for r in plan["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"}
    assert releases == {"aws-efa-k8s-device-plugin"}  # the only chart this stack still installs
    assert {r["inputs"]["name"] for r in own["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release"} >= {
        "kueue", "nvidia-device-plugin", "cluster-autoscaler", "aws-efa-k8s-device-plugin"}
    addons = {r["inputs"]["addonName"] for r in plan["resources"] if r["type"] == "aws:eks/addon:Addon"}
    assert "eks-pod-identity-agent" not in addons and "aws-ebs-csi-driver" in addons
    names = {r["name"] for r in plan["resources"]}
    assert not any("autoscaler" in name for name in names)  # no release, role or Pod Identity association
    kueue = [r for r in plan["resources"] if r["type"].startswith("kubernetes:kueue.x-k8s.io/")]
    assert kueue and {r["inputs"]["apiVersion"] for r in kueue} == {"kueue.x-k8s.io/v1beta1"}
    assert len(kueue) == sum(1 for r in own["resources"] if r["type"].startswith("kubernetes:kueue.x-k8s.io/"))
    monitors = {r["inputs"]["kind"]: r["inputs"] for r in plan["resources"]
                if r["type"].startswith("kubernetes:monitoring.coreos.com/")}
    assert set(monitors) == {"PodMonitor", "PrometheusRule"}
    for manifest in monitors.values():
        assert manifest["metadata"]["namespace"] == "observability"
        assert manifest["metadata"]["labels"]["release"] == "prometheus"  # what that chart's selectors match
    namespaces = {r["inputs"]["metadata"]["name"] for r in plan["resources"]
                  if r["type"] == "kubernetes:core/v1:Namespace"}
    assert "observability" not in namespaces and "kueue" not in namespaces
    # Kueue 0.13.4's viewer roles are not in view/edit: the team's members get the stack's role for them
    roles = {r["inputs"]["metadata"]["name"] for r in plan["resources"] if r["type"].endswith(":ClusterRole")}
    assert "existing-team-kueue-viewer" in roles and "existing-team-kueue-viewer" not in {
        r["inputs"]["metadata"]["name"] for r in own["resources"] if r["type"].endswith(":ClusterRole")}
    [viewer] = [r["inputs"] for r in plan["resources"] if r["type"].endswith(":RoleBinding")
                and r["inputs"]["metadata"]["name"] == "team-kueue-view"]
    assert viewer["metadata"]["namespace"] == "team-vision"
    assert viewer["roleRef"]["name"] == "existing-team-kueue-viewer"


@pytest.mark.slow
def test_every_object_is_valid_for_the_adopted_versions(plan: dict[str, Any]) -> None:
    version = stack_values("existing")["ml-cluster:cluster"]["kubernetesVersion"]

    def custom(manifest: dict[str, Any]) -> list[str] | None:
        from tests.monitoring.crds import render_charts

        if str(manifest.get("apiVersion")).startswith("kueue.x-k8s.io/"):
            return render_charts().validate_custom(manifest, crds_of("0.13.4"))
        return validate_custom_resource(manifest)

    assert sum(1 for _ in kubernetes_objects(plan)) > 30
    assert validate_kubernetes_objects(plan, version, custom=custom) == []


def test_adopting_on_a_cluster_the_stack_creates_is_one_line(tmp_path: Path) -> None:
    values = adopted_values()
    values["ml-cluster:cluster"]["existing"] = False
    path = tmp_path / "Pulumi.existing.yaml"
    path.write_text(yaml.safe_dump({"config": values}))
    with pytest.raises(ConfigError) as caught:
        plan_stack("existing", path)
    [line] = caught.value.lines()
    assert "kueue.external: only a cluster the stack does not create runs releases or add-ons of its own" in line


def test_monitors_and_rules_go_to_the_adopted_prometheus_with_its_release_label() -> None:
    from infra.config.monitoring import MonitoringConfig
    from infra.monitoring.component import monitoring_manifests

    adopted = MonitoringConfig.model_validate(ADOPTED["ml-cluster:monitoring"])
    own = MonitoringConfig.model_validate({"enabled": True})
    theirs = monitoring_manifests(adopted, "existing", "ml-cluster.io", "training", 8)
    ours = monitoring_manifests(own, "existing", "ml-cluster.io", "training", 8)
    assert [(m["kind"], m["metadata"]["namespace"], m["metadata"]["labels"].get("release")) for m in theirs] == [
        ("PodMonitor", "observability", "prometheus"), ("PrometheusRule", "observability", "prometheus"),
        ("ConfigMap", "observability", "prometheus")]
    assert all("release" not in m["metadata"]["labels"] and m["metadata"]["namespace"] == "monitoring" for m in ours)
    assert [m.get("spec") for m in theirs] == [m.get("spec") for m in ours]
    with pytest.raises(ValueError, match="mode in-cluster"):
        MonitoringConfig.model_validate({**ADOPTED["ml-cluster:monitoring"], "mode": "remote-write",
                                         "remoteWrite": {"url": "https://example.com/api/v1/write"}})
