"""An adopted Kueue (kueue.external): the stack's flavors, queues, priority classes, topology and provisioning check
written in the API version that Kueue serves, and valid against the CRDs of that Kueue version (their served schemas,
extracted from kubernetes-sigs/kueue at v0.13.4, v0.14.8 and v0.15.0: tests/queueing/kueue_crds/)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from infra.config.queueing import KueueConfig
from infra.kueue_api import served_api_versions, served_manifests
from infra.queueing import kueue_manifests, queue_manifests
from tests.monitoring.crds import render_charts
from tests.nodepools.helpers import gpu_pool
from tests.queueing.test_topology import ON, PREFIX, pools

CRDS = Path(__file__).parent / "kueue_crds"
BLOCK = {"id": "cr-0123456789abcdef0", "availabilityZone": "us-west-2a", "instanceCount": 2}


@functools.cache
def crds_of(version: str) -> dict[tuple[str, str], dict[str, Any]]:
    schemas = json.loads((CRDS / f"v{version}.json").read_text())["schemas"]
    return {tuple(key.split(" ")): schema for key, schema in schemas.items()}  # type: ignore[misc]


def everything(external: str | None = None) -> list[dict[str, Any]]:
    """Every kind the stack makes: topology + provisioning check (EFA p5), a reserved flavor (flavor fungibility),
    a cohort, a team with borrowing limits and fair sharing, a priority class."""
    cfg = KueueConfig.model_validate({
        **ON, "fairSharing": True, "priorityClasses": [{"name": "urgent", "value": 1000}],
        "teams": [{"name": "vision", "fairSharingWeight": 2,
                   "quotas": [{"flavor": "h100", "gpus": 8, "borrowingLimit": 8, "lendingLimit": 4}]}],
        **({"external": {"version": external}} if external else {})})
    extra = [gpu_pool("a100-block", ["p4d.24xlarge"], maxSize=2, capacityType="CAPACITY_BLOCK",
                      capacityReservation=BLOCK)]
    return kueue_manifests(cfg, pools(extra=extra), "training", "prod", PREFIX, {f"{PREFIX}/gpu-health": "passed"})


@pytest.mark.parametrize(("version", "main", "topology"), [
    ("0.13.4", "v1beta1", "v1alpha1"), ("0.14.8", "v1beta1", "v1beta1"), ("0.15.0", "v1beta2", "v1beta2"),
])
def test_every_object_validates_against_the_crds_of_the_adopted_version(version: str, main: str,
                                                                         topology: str) -> None:
    manifests = everything(version)
    assert {m["kind"] for m in manifests} == {"Topology", "ProvisioningRequestConfig", "AdmissionCheck",
                                              "ResourceFlavor", "WorkloadPriorityClass", "ClusterQueue", "LocalQueue"}
    assert {m["apiVersion"] for m in manifests if m["kind"] != "Topology"} == {f"kueue.x-k8s.io/{main}"}
    assert {m["apiVersion"] for m in manifests if m["kind"] == "Topology"} == {f"kueue.x-k8s.io/{topology}"}
    plan = {"resources": [{"type": f"kubernetes:{m['apiVersion']}:{m['kind']}", "name": m["metadata"]["name"],
                           "inputs": m} for m in manifests]}
    assert render_charts().custom_resource_problems(plan, crds_of(version)) == (len(manifests), [])


def test_v1beta1_renames_the_cohort_and_the_fungibility_kueue_converts() -> None:
    """kubernetes-sigs/kueue v0.19.2 apis/kueue/v1beta1/clusterqueue_conversion.go:39-80: cohortName <-> cohort,
    MayStopSearch <- Borrow / Preempt."""
    new = {m["metadata"]["name"]: m for m in everything() if m["kind"] == "ClusterQueue"}
    old = {m["metadata"]["name"]: m for m in everything("0.13.4") if m["kind"] == "ClusterQueue"}
    shared_new, shared_old = new["shared"]["spec"], old["shared"]["spec"]
    assert shared_new["cohortName"] == "gpus" and "cohortName" not in shared_old and shared_old["cohort"] == "gpus"
    assert shared_new["flavorFungibility"] == {"whenCanBorrow": "MayStopSearch", "whenCanPreempt": "TryNextFlavor"}
    assert shared_old["flavorFungibility"] == {"whenCanBorrow": "Borrow", "whenCanPreempt": "TryNextFlavor"}
    # nothing else differs
    strip = {"cohort", "cohortName", "flavorFungibility"}
    assert {k: v for k, v in shared_new.items() if k not in strip} == {k: v for k, v in shared_old.items()
                                                                        if k not in strip}
    # and what the stack's own Kueue takes is what it took before: v1beta2, the pinned chart's CRDs
    cfg = KueueConfig.model_validate(ON)
    assert kueue_manifests(cfg, pools(), "training", "prod", PREFIX) == queue_manifests(cfg, pools(), "training",
                                                                                         "prod", PREFIX)


def test_v1beta1_objects_do_not_fit_the_new_crds_nor_v1beta2_the_old() -> None:
    """The check can fail: v1beta2 objects against v0.13.4's CRDs (no such version served) and a v1beta2
    ClusterQueue relabelled v1beta1 (cohortName is not a v1beta1 field). (v1beta2 against the pinned 0.19.2 chart's
    CRDs: tests/queueing/test_topology.py.)"""
    manifests = everything()
    with pytest.raises(KeyError):
        render_charts().validate_custom(manifests[0], crds_of("0.13.4"))
    queue = next(m for m in manifests if m["kind"] == "ClusterQueue")
    problems = render_charts().validate_custom({**queue, "apiVersion": "kueue.x-k8s.io/v1beta1"}, crds_of("0.14.8"))
    assert any("cohortName" in problem for problem in problems), problems


def test_the_api_version_follows_the_release() -> None:
    assert served_api_versions("0.19.2") == ("kueue.x-k8s.io/v1beta2", "kueue.x-k8s.io/v1beta2")
    assert served_api_versions("v0.14.0") == ("kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1beta1")
    assert served_api_versions("0.13.0") == ("kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1alpha1")
    assert served_manifests([{"apiVersion": "v1", "kind": "Namespace"}], "0.13.4") == [
        {"apiVersion": "v1", "kind": "Namespace"}]
    with pytest.raises(ValueError, match="older than Kueue 0.13.0"):
        KueueConfig.model_validate({"enabled": True, "external": {"version": "0.12.9"}})
    with pytest.raises(ValueError, match="only with enabled: true"):
        KueueConfig.model_validate({"enabled": False, "external": {"version": "0.13.4"}})
