"""The Kueue API version an adopted Kueue (kueue.external) serves, and the stack's Kueue objects written in it.

The stack builds its flavors, queues, priority classes, topologies and the provisioning check in v1beta2, the
storage version of the Kueue it installs (0.19.2). Every Kueue CRD serves v1beta2 from v0.15.0 (kubernetes-sigs/
kueue v0.15.0 charts/kueue/templates/crd/kueue.x-k8s.io_clusterqueues.yaml:836) and only v1beta1 before (v0.14.8
the same file:54); the Topology kind was v1alpha1 in v0.13 (v0.13.4 kueue.x-k8s.io_topologies.yaml:33) and v1beta1
from v0.14 (v0.14.8 :33). Written in v1beta1, two fields differ (Kueue's own conversion, v0.19.2
apis/kueue/v1beta1/clusterqueue_conversion.go:39-80): a ClusterQueue's `cohortName` is `cohort`, and flavor
fungibility's `MayStopSearch` is `Borrow` (whenCanBorrow) or `Preempt` (whenCanPreempt). Everything else the stack
sets has the same name in both (the conversion of the other kinds is the generated field-by-field copy). Pure."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from infra.config.queueing import KUEUE_V1BETA2_SINCE, version_tuple

GROUP = "kueue.x-k8s.io"
STORAGE_VERSION = f"{GROUP}/v1beta2"  # what the stack writes (the storage version of the Kueue it installs)
_TOPOLOGY_V1BETA1_SINCE = (0, 14, 0)


def served_api_versions(version: str) -> tuple[str, str]:
    """(the API version of every kind but Topology, Topology's) a Kueue at chart `version` serves."""
    if version_tuple(version) >= KUEUE_V1BETA2_SINCE:
        return STORAGE_VERSION, STORAGE_VERSION
    topology = "v1beta1" if version_tuple(version) >= _TOPOLOGY_V1BETA1_SINCE else "v1alpha1"
    return f"{GROUP}/v1beta1", f"{GROUP}/{topology}"


def _v1beta1_spec(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    if kind != "ClusterQueue":
        return spec
    spec = dict(spec)
    if "cohortName" in spec:
        spec["cohort"] = spec.pop("cohortName")
    fungibility = spec.get("flavorFungibility")
    if fungibility:
        spec["flavorFungibility"] = {
            key: ({"whenCanBorrow": "Borrow", "whenCanPreempt": "Preempt"}[key] if value == "MayStopSearch" else value)
            for key, value in fungibility.items()}
    return spec


def served_manifests(manifests: Iterable[dict[str, Any]], version: str) -> list[dict[str, Any]]:
    """The stack's Kueue objects (v1beta2) as a Kueue at chart `version` takes them; unchanged from v0.15.0."""
    main, topology = served_api_versions(version)
    out = []
    for manifest in manifests:
        if manifest.get("apiVersion") != STORAGE_VERSION or main == STORAGE_VERSION:
            out.append(manifest)
            continue
        converted = copy.deepcopy(manifest)
        converted["apiVersion"] = topology if manifest["kind"] == "Topology" else main
        if "spec" in converted:
            converted["spec"] = _v1beta1_spec(manifest["kind"], converted["spec"])
        out.append(converted)
    return out
