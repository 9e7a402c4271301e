"""A Job spec's dataset.mixture: one staging sidecar for every source, the shares handed to MixedData.from_env."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.jobs.facts import prod_facts
from tests.jobs.jobrules import check_job
from workloads.jobspec import JobSpecError, parse_spec, render_job

IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"
MIXTURE = {"mixture": [{"uri": "s3://mlc-prod-datasets/web/", "weight": 0.7},
                       {"uri": "s3://mlc-prod-datasets/code/", "weight": 0.3, "cap": 1000000}],
           "staging": "cache", "stagedSize": "400Gi"}


def _spec(**fields: Any) -> Any:
    return parse_spec({"name": "mix", "image": IMAGE, "gpus": 8, "gpuType": "a100",
                       "command": ["python", "train.py"], **fields})


def test_one_sidecar_stages_every_source_and_the_trainer_gets_the_shares() -> None:
    job, = render_job(_spec(dataset=MIXTURE), prod_facts())
    check_job(job)
    stage = job["spec"]["template"]["spec"]["initContainers"][0]
    assert stage["restartPolicy"] == "Always"
    assert stage["command"][:7] == ["python", "-m", "workloads.data", "stage", "s3://mlc-prod-datasets/web/",
                                    "s3://mlc-prod-datasets/code/", "/data"]
    assert stage["command"][-3:] == ["--budget", "400", "--linger"]
    env = {item["name"]: item.get("value") for item in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["DATA_DIR"] == "/data"
    assert json.loads(env["DATA_MIXTURE"]) == [{"uri": "s3://mlc-prod-datasets/web/", "weight": 0.7},
                                               {"cap": 1000000, "uri": "s3://mlc-prod-datasets/code/", "weight": 0.3}]


@pytest.mark.parametrize(("fields", "path"), [
    ({"dataset": {**MIXTURE, "uri": "s3://x/y"}}, "mixture"),
    ({"dataset": {**MIXTURE, "staging": "none", "stagedSize": None}}, "staging"),
    ({"dataset": {**MIXTURE, "mixture": [{"uri": "s3://bkt/a", "weight": 1, "samples": 3}, {"uri": "s3://bkt/c"}]}},
     "samples"),
    ({"dataset": {**MIXTURE, "mixture": [{"uri": "bkt/a"}, {"uri": "s3://bkt/c"}]}}, "uri"),
    ({"dataset": MIXTURE, "command": None}, "dataset.mixture"),
])
def test_bad_mixtures_name_the_field(fields: dict[str, Any], path: str) -> None:
    values = {key: value for key, value in fields.items() if value is not None}
    with pytest.raises((JobSpecError, ValueError)) as caught:
        spec = _spec(**values) if "command" not in fields else parse_spec(
            {"name": "mix", "image": IMAGE, "gpus": 8, "gpuType": "a100", "dataset": MIXTURE})
        render_job(spec, prod_facts())
    assert path in str(caught.value)
