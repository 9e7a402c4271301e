"""The GPU burn-in in the plans: one DaemonSet per GPU pool, what it may touch, and the config that turns it on."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import ConfigError
from infra.config.schema import parse_stack_config
from infra.plan.engine import validate_kubernetes_objects
from tests.conftest import resources_of, stack_values
from workloads.quantity import quantity_bytes

DAEMONSET = "kubernetes:apps/v1:DaemonSet"


def _daemonsets(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["inputs"]["metadata"]["name"]: r["inputs"] for r in resources_of(plan, DAEMONSET)
            if r["inputs"]["metadata"].get("namespace") == "gpu-health"}


def _pod(daemonset: dict[str, Any]) -> dict[str, Any]:
    return daemonset["spec"]["template"]["spec"]


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in [*pod["initContainers"], *pod["containers"]] if c["name"] == name)


def test_prod_checks_every_gpu_pool_and_only_gpu_pools(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    daemonsets = _daemonsets(plan)
    assert sorted(daemonsets) == ["gpu-burn-in-gpu-a100", "gpu-burn-in-gpu-h100"]
    h100, a100 = _pod(daemonsets["gpu-burn-in-gpu-h100"]), _pod(daemonsets["gpu-burn-in-gpu-a100"])
    assert h100["nodeSelector"] == {"ml-cluster.io/pool": "gpu-h100"}
    assert [c["name"] for c in h100["initContainers"]] == ["plan", "dcgm", "gpu", "efa"]
    assert [c["name"] for c in a100["initContainers"]] == ["plan", "dcgm", "gpu"]  # p4d pool has no EFA here
    report = _container(h100, "report")["command"]
    assert report[-4:] == ["--expect-gpus", "8", "--expect-efa", "32"]
    assert _container(a100, "report")["command"][-2:] == ["--expect-gpus", "8"]
    assert "--nproc-per-node=8 -m workloads.health.gpucheck" in _container(h100, "gpu")["command"][2]
    assert {"name": "shm", "mountPath": "/dev/shm"} in _container(h100, "gpu")["volumeMounts"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in h100["volumes"]
    assert "dcgmi diag -r 2 -j" in _container(h100, "dcgm")["command"][2]
    assert _container(h100, "dcgm")["image"] == "nvcr.io/nvidia/cloud-native/dcgm:4.5.2-1-ubuntu22.04"
    assert _container(h100, "gpu")["image"] == "111122223333.dkr.ecr.us-east-1.amazonaws.com/mlc-prod-train:0.1.0"
    tolerations = {(t["key"], t["effect"]) for t in h100["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("ml-cluster.io/gpu-health", "NoSchedule")} <= tolerations
    assert daemonsets["gpu-burn-in-gpu-h100"]["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    ours = [r for r in plan["resources"] if r["name"].startswith("mlc-prod-gpu-health-")]
    assert sorted(r["type"].rsplit(":", 1)[1] for r in ours) == ["ClusterRole", "ClusterRoleBinding", "DaemonSet",
                                                                  "DaemonSet", "Namespace", "ServiceAccount"]
    assert validate_kubernetes_objects({**plan, "resources": ours}, "1.35") == []  # strict


def test_the_burn_in_holds_nothing_training_needs(stack_plan) -> None:  # type: ignore[no-untyped-def]
    for daemonset in _daemonsets(stack_plan("prod")).values():
        pod = _pod(daemonset)
        containers = [*pod["initContainers"], *pod["containers"]]
        for container in containers:
            for amounts in container["resources"].values():
                assert not {"nvidia.com/gpu", "vpc.amazonaws.com/efa"} & set(amounts), container["name"]
        # A pod's effective request is its largest init container's or its containers' sum, for its whole life.
        effective = max(max(quantity_bytes(c["resources"]["requests"]["memory"]) for c in pod["initContainers"]),
                        sum(quantity_bytes(c["resources"]["requests"]["memory"]) for c in pod["containers"]))
        assert effective <= 512 * 2**20


def test_only_the_api_steps_get_a_token_and_only_the_checks_are_privileged(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    pod = _pod(_daemonsets(plan)["gpu-burn-in-gpu-h100"])
    assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] == "gpu-burn-in"
    with_token = {c["name"] for c in [*pod["initContainers"], *pod["containers"]]
                  if any(m["name"] == "api-token" for m in c["volumeMounts"])}
    privileged = {c["name"] for c in [*pod["initContainers"], *pod["containers"]]
                  if c["securityContext"].get("privileged")}
    assert with_token == {"plan", "report"} and privileged == {"dcgm", "gpu", "efa"}
    roles = [r["inputs"] for r in resources_of(plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRole")
             if r["inputs"]["metadata"]["name"] == "prod-gpu-burn-in"]
    assert [role["rules"] for role in roles] == [[{"apiGroups": [""], "resources": ["nodes"],
                                                   "verbs": ["get", "patch"]}]]
    bindings = [r["inputs"] for r in resources_of(plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
                if r["inputs"]["metadata"]["name"] == "prod-gpu-burn-in"]
    assert bindings[0]["subjects"] == [{"kind": "ServiceAccount", "name": "gpu-burn-in", "namespace": "gpu-health"}]


def test_dev_runs_no_burn_in(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("dev")
    assert _daemonsets(plan) == {} and "gpuHealth" not in plan["outputs"]


def _config(stack: str, **health: Any) -> dict[str, Any]:
    values = stack_values(stack)
    values["ml-cluster:gpu"] = {**values.get("ml-cluster:gpu", {}), "health": health}
    return values


def _problems(values: dict[str, Any], secret: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_stack_config(values, secret)
    return [f"{path}: {why}" for path, why in info.value.shown()]


def test_config_rules() -> None:
    assert _problems(_config("prod")) == [
        "ml-cluster:gpu.health.image: required: the burn-in runs the training image (image, or imageTag of the "
        "stack's registry); or set gpu.health.enabled: false"]
    assert _problems(_config("dev", enabled=False, gate=True)) == [
        "ml-cluster:gpu.health: gate: true needs the burn-in (enabled): nothing else labels nodes "
        "gpu-health=passed"]
    # the burn-in left to its default, which is off in an unprotected stack: a gate nothing opens
    [line] = _problems(_config("dev", gate=True, imageTag="0.1.0"))
    assert "gpu.health.gate: true, but the burn-in does not run in this stack" in line
    assert "every GPU Job would stay Pending" in line
    assert _problems(_config("dev", imageTag="0.1.0", image="registry.example/train:1")) == [
        "ml-cluster:gpu.health: set one of image (a full reference) and imageTag (a tag of the stack's registry)"]
    onprem = _config("onprem", enabled=True, imageTag="0.1.0")
    secrets = tuple(k for k, v in onprem.items() if isinstance(v, dict) and set(v) == {"secure"})
    onprem.update({key: "placeholder" for key in secrets})
    assert _problems(onprem, secrets) == [
        "ml-cluster:gpu.health.imageTag: this stack has no image registry: give a full image reference"]
    labelled = _config("dev")
    labelled["ml-cluster:nodePools"][1]["labels"] = {"ml-cluster.io/gpu-health": "passed"}
    assert _problems(labelled) == ["ml-cluster:nodePools[1].labels: ml-cluster.io/gpu-health is set by the GPU "
                                   "burn-in only (gpu.health), never by a pool"]
    assert parse_stack_config(_config("prod", imageTag="0.1.0")).gpu.health.gated(protected=True)
    dev = parse_stack_config(_config("dev", imageTag="0.1.0")).gpu.health
    assert not dev.runs(protected=False) and not dev.gated(protected=False)


GATE = {"key": "ml-cluster.io/gpu-health", "operator": "In", "values": ["passed"]}


def _terms(pod: dict[str, Any]) -> list[Any]:
    affinity = pod.get("affinity", {}).get("nodeAffinity", {})
    return affinity.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [])


def test_the_gate_every_gpu_job_flavor_and_template_requires_the_label(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("prod")
    jobs = resources_of(plan, "kubernetes:batch/v1:Job")
    assert jobs and all(_terms(job["inputs"]["spec"]["template"]["spec"]) == [{"matchExpressions": [GATE]}]
                        for job in jobs)
    flavors = {r["inputs"]["metadata"]["name"]: r["inputs"]["spec"]
               for r in resources_of(plan, "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor")}
    assert {name: spec.get("nodeLabels", {}).get("ml-cluster.io/gpu-health") for name, spec in flavors.items()} == {
        "a100": "passed", "h100": "passed", "cpu": None}
    tags = {r["inputs"]["tag"]["key"]: r["inputs"]["tag"]["value"]
            for r in resources_of(plan, "aws:autoscaling/tag:Tag")
            if r["name"].startswith("mlc-prod-nodepools-gpu-h100-")}
    template = "k8s.io/cluster-autoscaler/node-template/label/ml-cluster.io/gpu-health"
    assert tags[template] == "passed"  # the autoscaler models a passed node, so a gated Job scales a pool from zero
    # ... but no node is ever created with the label: only the burn-in sets it.
    groups = resources_of(plan, "aws:eks/nodeGroup:NodeGroup")
    assert groups and not any("ml-cluster.io/gpu-health" in (g["inputs"].get("labels") or {}) for g in groups)
    system_tags = [r for r in resources_of(plan, "aws:autoscaling/tag:Tag")
                   if r["name"].startswith("mlc-prod-nodepools-system-") and r["inputs"]["tag"]["key"] == template]
    assert system_tags == []


def test_without_the_gate_jobs_and_flavors_are_as_before(stack_plan) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan("dev")
    assert all(not _terms(job["inputs"]["spec"]["template"]["spec"])
               for job in resources_of(plan, "kubernetes:batch/v1:Job"))
    assert all("ml-cluster.io/gpu-health" not in (r["inputs"]["spec"].get("nodeLabels") or {})
               for r in resources_of(plan, "kubernetes:kueue.x-k8s.io/v1beta2:ResourceFlavor"))


def test_render_puts_the_gate_on_gpu_jobs_only() -> None:
    from dataclasses import replace

    from tests.jobs.facts import prod_facts
    from workloads.jobspec import TrainingJobSpec, render_job

    facts = replace(prod_facts(), gpu_health_gate=True)
    gpu = TrainingJobSpec.model_validate({"name": "g", "image": "r.example/t:1", "gpus": 8, "gpuType": "h100"})
    cpu = TrainingJobSpec.model_validate({"name": "c", "image": "r.example/t:1", "gpus": 0, "cpu": "2",
                                          "memory": "8Gi"})
    gated = render_job(gpu, facts)
    assert _terms(gated[0]["spec"]["template"]["spec"]) == [{"matchExpressions": [GATE]}]
    assert _terms(render_job(cpu, facts)[0]["spec"]["template"]["spec"]) == []
    assert _terms(render_job(gpu, prod_facts())[0]["spec"]["template"]["spec"]) == []
