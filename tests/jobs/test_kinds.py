"""The kind table: a spec's kind picks the controller wrapper; a new kind is one wrapper plus one row, and its pods
are the pod builder's."""

from __future__ import annotations

from typing import Any

import pytest

from tests.jobs.facts import prod_facts
from workloads.jobspec import KINDS, Controller, JobSpecError, controller_of, parse_spec, render_job
from workloads.jobspec.containers import GangAddress
from workloads.jobspec.pod import PodTemplate

IMAGE = "registry.example.com/train:1"
GANG = {"name": "ddp", "image": IMAGE, "gpus": 8, "gpuType": "h100", "nodes": 2}


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {entry["name"]: entry.get("value", entry.get("valueFrom")) for entry in container["env"]}


def test_a_kind_the_table_does_not_have_is_an_error_naming_the_field() -> None:
    with pytest.raises(JobSpecError) as caught:
        render_job(parse_spec({**GANG, "kind": "MPIJob"}), prod_facts())
    assert caught.value.path == "kind"
    assert "'MPIJob' is not a kind this project renders (kinds: Job, JobSet, TrainJob)" in str(caught.value)


def test_the_default_kind_renders_the_indexed_job_and_the_table_knows_its_objects() -> None:
    job, service, *_ = render_job(parse_spec(GANG), prod_facts())
    assert (job["apiVersion"], job["kind"], job["spec"]["completionMode"]) == ("batch/v1", "Job", "Indexed")
    assert controller_of(job) is KINDS["Job"]
    assert controller_of(service) is None
    assert KINDS["Job"].group == "batch" and KINDS["Job"].version == "v1"


def _gang_set_row() -> Controller:
    def gang_address(run_name: str, namespace: str) -> GangAddress:
        return GangAddress(master=f"{run_name}-trainer-0-0.{run_name}.{namespace}.svc",
                           node_rank_field="metadata.labels['example.com/node-rank']", subdomain=run_name)

    def wrap(pod: PodTemplate) -> list[dict[str, Any]]:
        return [{"apiVersion": "example.com/v1", "kind": "GangSet",
                 "metadata": {"name": pod.name, "namespace": pod.facts.namespace, "labels": pod.labels},
                 "spec": {"replicas": pod.spec.nodes, "template": pod.template}}]

    return Controller("GangSet", "example.com/v1", "gangsets", gang_address, lambda name: f"gang={name}", wrap)


def test_a_new_kind_is_one_wrapper_and_one_row_and_its_pod_is_the_builders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "GangSet", _gang_set_row())
    job = render_job(parse_spec(GANG), prod_facts())[0]
    gang_set, = render_job(parse_spec({**GANG, "kind": "GangSet"}), prod_facts())
    assert (gang_set["kind"], gang_set["spec"]["replicas"]) == ("GangSet", 2)
    job_pod, set_pod = job["spec"]["template"]["spec"], gang_set["spec"]["template"]["spec"]
    # The same pod but for what the controller decides: how the gang finds rank 0 and its own node rank.
    name = gang_set["metadata"]["name"]
    assert _env(set_pod["containers"][0])["MASTER_ADDR"] == f"{name}-trainer-0-0.{name}.training.svc"
    assert _env(set_pod["containers"][0])["NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.labels['example.com/node-rank']"}}
    for key in ("volumes", "securityContext", "nodeSelector", "tolerations", "affinity", "restartPolicy"):
        assert set_pod.get(key) == job_pod.get(key), key
    job_train, set_train = job_pod["containers"][0], set_pod["containers"][0]
    for key in ("image", "resources", "securityContext", "volumeMounts", "ports", "command", "args"):
        assert set_train.get(key) == job_train.get(key), key
    gang_env = {"MASTER_ADDR", "NODE_RANK", "PET_RDZV_ENDPOINT", "PET_RDZV_ID"}
    assert {k: v for k, v in _env(set_train).items() if k not in gang_env} == {
        k: v for k, v in _env(job_train).items() if k not in gang_env}
