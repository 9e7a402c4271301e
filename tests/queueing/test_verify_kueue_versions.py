"""`scripts/verify_stack.py` lists the stack's Kueue queues in the version the API server's discovery says the
cluster's Kueue serves (workloads.submit.kueue.kueue_versions, as `submit` reads it): the stack's 0.19 in v1beta2,
an adopted 0.14 in v1beta1 without a try in v1beta2, v1beta2 then v1beta1 where discovery cannot be read, nothing
where no Kueue is served. Against the stand-in API server the submit tests use (a version its `served` table does
not list answers 404, as a real API server does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import config
from kubernetes.client.exceptions import ApiException

from infra.storage.verify import check_queues, list_kueue
from tests.jobs.kubeapi import KUEUE_0_14, FakeApiServer, fake_api_server
from workloads.submit import kueue
from workloads.submit.kube import custom_objects_api

ACTIVE = {"conditions": [{"type": "Active", "status": "True", "reason": "Ready", "message": "Can admit new workloads"}]}
OUTPUTS = {"jobFacts": {"kueue": True, "namespace": "training", "local_queues": ["training"]}}


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeApiServer]:
    monkeypatch.setattr(kueue, "_served", {})  # discovery is asked once a process: not across tests
    with fake_api_server() as stand_in:
        config.load_kube_config(config_file=str(stand_in.kubeconfig(tmp_path / "kubeconfig")))
        yield stand_in


def queues(server: FakeApiServer, version: str) -> None:
    server.add({"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "ClusterQueue", "metadata": {"name": "shared"},
                "status": ACTIVE})
    server.add({"apiVersion": f"kueue.x-k8s.io/{version}", "kind": "LocalQueue",
                "metadata": {"name": "training", "namespace": "training"}, "spec": {"clusterQueue": "shared"},
                "status": ACTIVE})


def verify(server: FakeApiServer) -> tuple[list[tuple[str, str]], list[str]]:
    custom = custom_objects_api(5.0)
    checks = check_queues(OUTPUTS, list_kueue(custom, "clusterqueues"), list_kueue(custom, "localqueues"))
    return [(check.name, check.status) for check in checks], [path for _, path in server.requests]


def test_the_stacks_kueue_is_listed_in_v1beta2_after_one_discovery(server: FakeApiServer) -> None:
    queues(server, "v1beta2")
    checks, asked = verify(server)
    assert checks == [("localqueue training/training", "PASS")]
    assert asked == ["/apis/kueue.x-k8s.io", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
                     "/apis/kueue.x-k8s.io/v1beta2/localqueues"]


def test_an_adopted_kueue_older_than_0_15_is_listed_in_v1beta1_without_a_try_in_v1beta2(
        server: FakeApiServer) -> None:
    server.served = dict(KUEUE_0_14)
    queues(server, "v1beta1")
    checks, asked = verify(server)
    assert checks == [("localqueue training/training", "PASS")]
    assert asked == ["/apis/kueue.x-k8s.io", "/apis/kueue.x-k8s.io/v1beta1/clusterqueues",
                     "/apis/kueue.x-k8s.io/v1beta1/localqueues"]


def test_unreadable_discovery_falls_back_to_v1beta2_then_v1beta1(server: FakeApiServer) -> None:
    server.served = dict(KUEUE_0_14)
    server.raw["/apis/kueue.x-k8s.io"] = (200, "text/html", b"<html>a proxy's page</html>")
    queues(server, "v1beta1")
    checks, asked = verify(server)
    assert checks == [("localqueue training/training", "PASS")]
    assert asked == ["/apis/kueue.x-k8s.io", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues",
                     "/apis/kueue.x-k8s.io/v1beta1/clusterqueues", "/apis/kueue.x-k8s.io/v1beta2/localqueues",
                     "/apis/kueue.x-k8s.io/v1beta1/localqueues"]


def test_no_kueue_served_lists_nothing_and_the_queues_fail(server: FakeApiServer) -> None:
    server.served = {}
    checks, asked = verify(server)
    assert checks == [("localqueue training/training", "FAIL")]
    assert asked == ["/apis/kueue.x-k8s.io"]


def test_a_refused_list_is_raised_not_read_as_another_version(server: FakeApiServer) -> None:
    server.forbid_cluster_wide = True
    with pytest.raises(ApiException) as caught:
        list_kueue(custom_objects_api(5.0), "clusterqueues")
    assert caught.value.status == 403
    assert [path for _, path in server.requests] == ["/apis/kueue.x-k8s.io",
                                                     "/apis/kueue.x-k8s.io/v1beta2/clusterqueues"]
