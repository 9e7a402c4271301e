"""verify_stack's Kubernetes half against in-memory fakes of CoreV1Api / StorageV1Api returning real client models."""

from __future__ import annotations

from typing import Any

from kubernetes.client import (
    V1Node,
    V1NodeList,
    V1NodeStatus,
    V1ObjectMeta,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimStatus,
    V1StorageClass,
    V1StorageClassList,
)

from infra.storage.verify import check_nodes, check_test_claim, kubernetes_checks, render_table

PREFIX = "ml-cluster.io"


class FakeStorageApi:
    def __init__(self, classes: dict[str, str]):
        self.classes = classes  # name -> volumeBindingMode

    def list_storage_class(self) -> V1StorageClassList:
        return V1StorageClassList(items=[
            V1StorageClass(metadata=V1ObjectMeta(name=name), provisioner="x", volume_binding_mode=mode)
            for name, mode in self.classes.items()])


class FakeCoreApi:
    def __init__(self, nodes: list[V1Node], binds_after_reads: int | None = 1):
        self.nodes = nodes
        self.binds_after_reads = binds_after_reads  # None: the claim never binds
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0
        self.deleted: list[tuple[str, str]] = []

    def list_node(self) -> V1NodeList:
        return V1NodeList(items=self.nodes)

    def create_namespaced_persistent_volume_claim(self, namespace: str, body: dict[str, Any]) -> None:
        self.claims[(namespace, body["metadata"]["name"])] = body

    def read_namespaced_persistent_volume_claim(self, name: str, namespace: str) -> V1PersistentVolumeClaim:
        assert (namespace, name) in self.claims
        self.reads += 1
        bound = self.binds_after_reads is not None and self.reads >= self.binds_after_reads
        return V1PersistentVolumeClaim(status=V1PersistentVolumeClaimStatus(phase="Bound" if bound else "Pending"))

    def delete_namespaced_persistent_volume_claim(self, name: str, namespace: str) -> None:
        self.deleted.append((namespace, name))
        del self.claims[(namespace, name)]


def node(name: str, labels: dict[str, str], gpus: str | None = None) -> V1Node:
    resources = {"cpu": "8"} | ({"nvidia.com/gpu": gpus} if gpus is not None else {})
    return V1Node(metadata=V1ObjectMeta(name=name, labels=labels),
                  status=V1NodeStatus(capacity=resources, allocatable=resources))


GPU_NODE = node("gpu-1", {f"{PREFIX}/gpu-type": "a10g", f"{PREFIX}/disktype": "nvme", f"{PREFIX}/nvme-gib": "250"},
                gpus="1")
OUTPUTS = {"storage": {"storageClasses": ["gp3", "efs-ap"], "namespace": "training"}}


def by_name(checks: list) -> dict[str, Any]:
    return {check.name: check for check in checks}


def test_healthy_cluster_passes_and_test_claim_is_cleaned_up() -> None:
    core = FakeCoreApi([GPU_NODE, node("cpu-1", {})])
    checks = kubernetes_checks(OUTPUTS, core, FakeStorageApi({"gp3": "WaitForFirstConsumer", "efs-ap": "Immediate"}),
                               PREFIX, timeout_s=5)
    assert {check.status for check in checks} == {"PASS"}, render_table(checks)
    assert "test pvc binds (efs-ap)" in by_name(checks)  # the Immediate class, not gp3
    assert core.claims == {} and len(core.deleted) == 1 and core.deleted[0][0] == "training"


def test_missing_storage_class_fails() -> None:
    checks = by_name(kubernetes_checks(OUTPUTS, FakeCoreApi([GPU_NODE]), FakeStorageApi({"gp3": "Immediate"}),
                                       PREFIX, timeout_s=5))
    assert checks["storageclass efs-ap"].status == "FAIL"
    assert checks["storageclass gp3"].status == "PASS"


def test_gpu_node_without_allocatable_gpus_or_label_fails() -> None:
    broken = node("gpu-2", {}, gpus="0")
    broken.status.capacity["nvidia.com/gpu"] = "4"  # capacity known, device plugin not advertising
    checks = by_name(check_nodes(FakeCoreApi([broken]), PREFIX))
    assert checks["gpu node gpu-2"].status == "FAIL"
    assert "no allocatable nvidia.com/gpu" in checks["gpu node gpu-2"].detail
    assert f"no {PREFIX}/gpu-type label" in checks["gpu node gpu-2"].detail


def test_nvme_node_without_size_label_fails_and_no_gpu_nodes_is_a_skip() -> None:
    checks = by_name(check_nodes(FakeCoreApi([node("n-1", {f"{PREFIX}/disktype": "nvme"})]), PREFIX))
    assert checks["nvme node n-1"].status == "FAIL"
    assert checks["gpu nodes"].status == "SKIP"


def test_claim_that_never_binds_fails_and_is_deleted() -> None:
    core = FakeCoreApi([], binds_after_reads=None)
    [check] = check_test_claim(core, FakeStorageApi({"efs-ap": "Immediate"}), "training", ["efs-ap"],
                               timeout_s=0.05, poll_s=0.01)
    assert check.status == "FAIL" and check.detail.endswith("Pending")
    assert core.claims == {}


def test_only_wait_for_first_consumer_classes_skip_the_claim() -> None:
    [check] = check_test_claim(FakeCoreApi([]), FakeStorageApi({"gp3": "WaitForFirstConsumer"}), "training",
                               ["gp3"])
    assert check.status == "SKIP"
