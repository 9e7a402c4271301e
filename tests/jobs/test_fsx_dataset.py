"""A dataset on FSx for Lustre: a directory inside the claim (subPath) read in place, or copied onto the node's NVMe
before training (staging copy), as from EFS; prod's multi-node Job reads its data and writes its checkpoints there."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.jobs.facts import prod_facts
from tests.jobs.jobrules import check_job
from workloads.jobspec import JobSpecError, parse_spec, render_job

IMAGE = "111122223333.dkr.ecr.us-east-1.amazonaws.com/ml-cluster-train:0.1.0"
ROOT = Path(__file__).resolve().parents[2]


def _pod(dataset: dict[str, Any]) -> dict[str, Any]:
    facts = replace(prod_facts(), volume_claims=("fsx-lustre",))
    spec = parse_spec({"name": "ddp", "image": IMAGE, "nodes": 2, "gpus": 8, "gpuType": "h100",
                       "dataset": {"claimName": "fsx-lustre", "mountPath": "/data/imagenet", **dataset},
                       "checkpoint": {"claimName": "fsx-lustre", "mountPath": "/fsx"}})
    job, *_ = render_job(spec, facts)
    check_job(job)
    return job["spec"]["template"]["spec"]


def test_read_in_place_mounts_only_the_datasets_directory_read_only() -> None:
    """The dataset and the checkpoints name one claim: one volume, mounted twice (the dataset's directory read
    only, the checkpoints read-write), never the claim as two volumes."""
    pod = _pod({"subPath": "datasets/imagenet-hdf5/"})
    mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "checkpoints"]
    assert mounts == [{"name": "checkpoints", "mountPath": "/data/imagenet", "readOnly": True,
                       "subPath": "datasets/imagenet-hdf5"}, {"name": "checkpoints", "mountPath": "/fsx"}]
    claims = [(v["name"], v["persistentVolumeClaim"]) for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [("checkpoints", {"claimName": "fsx-lustre"})]


def test_a_dataset_claim_of_its_own_keeps_its_own_read_only_volume() -> None:
    facts = replace(prod_facts(), volume_claims=("fsx-lustre", "datasets-efs"))
    for staging, name in (("none", "dataset"), ("copy", "dataset-source")):
        spec = parse_spec({"name": "ddp", "image": IMAGE, "nodes": 2, "gpus": 8, "gpuType": "h100",
                           "dataset": {"claimName": "datasets-efs", "mountPath": "/data/imagenet", "staging": staging,
                                       **({"stagedSize": "150Gi"} if staging == "copy" else {})},
                           "checkpoint": {"claimName": "fsx-lustre", "mountPath": "/fsx"}})
        job, *_ = render_job(spec, facts)
        check_job(job)
        pod = job["spec"]["template"]["spec"]
        claims = [(v["name"], v["persistentVolumeClaim"]) for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == [(name, {"claimName": "datasets-efs", "readOnly": True}),
                          ("checkpoints", {"claimName": "fsx-lustre"})]


def test_copy_stages_the_directory_onto_nvme_before_training() -> None:
    pod = _pod({"subPath": "datasets/imagenet-hdf5", "staging": "copy", "stagedSize": "150Gi"})
    [stage] = pod["initContainers"]
    assert stage["command"] == ["cp", "-a", "/mnt/dataset-source/.", "/data/imagenet/"]
    assert {"name": "checkpoints", "mountPath": "/mnt/dataset-source", "readOnly": True,
            "subPath": "datasets/imagenet-hdf5"} in stage["volumeMounts"]  # the one volume of the claim
    assert [v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v] == ["checkpoints"]
    assert "restartPolicy" not in stage  # an init container: the copy ends before the trainer starts


@pytest.mark.parametrize(("dataset", "why"), [
    ({"subPath": "../checkpoints"}, "no '.' or '..'"),
    ({"claimName": None, "bucket": "datasets", "prefix": "x/", "staging": "cache", "stagedSize": "1Gi",
      "subPath": "x"}, "only with claimName"),
])
def test_a_sub_path_outside_the_claim_or_without_one_is_refused(dataset: dict[str, Any], why: str) -> None:
    with pytest.raises(JobSpecError, match=why) as caught:
        _pod(dataset)
    assert str(caught.value).startswith("dataset.subPath: ")


def test_prods_multi_node_job_reads_and_checkpoints_on_fsx() -> None:
    jobs = yaml.safe_load((ROOT / "stacks" / "Pulumi.prod.yaml").read_text())["config"]["ml-cluster:jobs"]
    [ddp] = [job for job in jobs if job["name"] == "resnet50-ddp"]
    assert ddp["dataset"]["claimName"] == ddp["checkpoint"]["claimName"] == "fsx-lustre"
    assert ddp["dataset"]["subPath"] == "datasets/imagenet-hdf5" and ddp["dataset"]["staging"] == "copy"
