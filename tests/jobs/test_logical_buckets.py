"""A spec names its dataset and checkpoints by the stack's logical bucket: no account-specific name in a spec."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.jobs.facts import dev_facts
from workloads.jobspec import JobSpecError, parse_spec, render_job

IMAGE = "registry.example/ml-cluster-train:0.1.0"
FACTS = dataclasses.replace(dev_facts(), buckets={"datasets": "mlc-dev-datasets-210987654321",
                                                  "checkpoints": "mlc-dev-checkpoints-210987654321"})


def _spec(**fields: Any) -> Any:
    return parse_spec({"name": "resnet", "image": IMAGE, "gpus": 1, **fields})


def test_a_logical_bucket_renders_as_the_stacks_physical_bucket() -> None:
    spec = _spec(dataset={"bucket": "datasets", "prefix": "imagenet-hdf5/", "staging": "copy", "stagedSize": "20Gi"},
                 checkpoint={"bucket": "checkpoints", "prefix": "runs/resnet/"})
    (job,) = render_job(spec, FACTS)
    pod = job["spec"]["template"]["spec"]
    stage = pod["initContainers"][0]["command"]
    assert "s3://mlc-dev-datasets-210987654321/imagenet-hdf5/" in stage
    train_env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert train_env["CHECKPOINT_URI"] == "s3://mlc-dev-checkpoints-210987654321/runs/resnet/"
    same_by_uri = _spec(dataset={"uri": "s3://mlc-dev-datasets-210987654321/imagenet-hdf5/", "staging": "copy",
                                 "stagedSize": "20Gi"},
                        checkpoint={"uri": "s3://mlc-dev-checkpoints-210987654321/runs/resnet/"})
    assert render_job(same_by_uri, FACTS)[0]["spec"] == job["spec"]


def test_a_bucket_the_stack_does_not_have_names_the_field_and_the_choices() -> None:
    spec = _spec(dataset={"bucket": "results", "staging": "copy", "stagedSize": "20Gi"})
    with pytest.raises(JobSpecError) as caught:
        render_job(spec, FACTS)
    assert caught.value.path == "dataset.bucket"
    assert "'results' is not a bucket of stack dev (its buckets: checkpoints, datasets)" in str(caught.value)


@pytest.mark.parametrize(("dataset", "path"), [
    ({"bucket": "datasets", "uri": "s3://x-bucket/p", "staging": "copy", "stagedSize": "1Gi"}, "dataset.uri"),
    ({"bucket": "datasets", "prefix": "../other/", "staging": "copy", "stagedSize": "1Gi"}, "dataset.prefix"),
    ({"bucket": "datasets", "prefix": "/abs/", "staging": "copy", "stagedSize": "1Gi"}, "dataset.prefix"),
    ({"claimName": "datasets-efs", "prefix": "x/"}, "dataset.prefix"),
    ({"bucket": "datasets"}, "dataset.staging"),
    ({"bucket": "Data_Sets", "staging": "copy", "stagedSize": "1Gi"}, "dataset.bucket"),
])
def test_bad_bucket_forms_are_refused_naming_the_field(dataset: dict[str, Any], path: str) -> None:
    with pytest.raises(JobSpecError) as caught:
        _spec(dataset=dataset)
    assert caught.value.path == path, str(caught.value)
