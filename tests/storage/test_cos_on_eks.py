"""An EKS stack with both S3 buckets and IBM COS buckets: Jobs address both kinds, and each container talks to the
store its bucket lives in (S3 through the Jobs' role, COS through the endpoint and the HMAC Secret)."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.plan.engine import plan_stack
from tests.conftest import resources_of, stack_values
from tests.jobs.facts import dev_facts
from workloads.cluster_facts import facts_from_dict, facts_to_dict
from workloads.jobspec import parse_spec, render_job

COS_ENDPOINT = "https://s3.us-south.cloud-object-storage.appdomain.cloud"
HMAC = {key: stack_values("onprem")[key] for key in ("ml-cluster:cosHmacAccessKeyId",
                                                       "ml-cluster:cosHmacSecretAccessKey")}  # placeholders
ARCHIVE = {"name": "archive", "bucketName": "ml-dev-archive"}


def _dev_with_cos(*cos_buckets: dict[str, Any], jobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    values = stack_values("dev")
    values["ml-cluster:storage"]["cos"] = {"endpoint": COS_ENDPOINT, "buckets": list(cos_buckets)}
    if jobs is not None:
        values["ml-cluster:jobs"] = jobs
    return {**HMAC, "ml-cluster:storage": values["ml-cluster:storage"], "ml-cluster:jobs": values["ml-cluster:jobs"]}


def _pod(plan: dict[str, Any], job: str) -> dict[str, Any]:
    [manifest] = [r for r in resources_of(plan, "kubernetes:batch/v1:Job") if r["name"] == f"mlc-dev-jobs-{job}"]
    return manifest["inputs"]["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, str | None]:
    return {item["name"]: item.get("value") for item in container.get("env", [])}


@pytest.fixture(scope="module")
def mixed_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """dev's S3 Job as committed, plus one that stages from a COS bucket and checkpoints to an S3 one."""
    jobs = stack_values("dev")["ml-cluster:jobs"]
    from_cos = copy.deepcopy(jobs[0])
    from_cos.update(name="from-cos", checkpoint={"bucket": "checkpoints", "prefix": "runs/from-cos/"})
    from_cos["dataset"]["bucket"] = "archive"
    config = {**stack_values("dev"), **_dev_with_cos(ARCHIVE, jobs=[*jobs, from_cos])}
    path = tmp_path_factory.mktemp("cos-on-eks") / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return plan_stack("dev", path)


def test_both_kinds_of_bucket_are_in_the_job_facts(mixed_plan: dict[str, Any]) -> None:
    facts = facts_from_dict(mixed_plan["outputs"]["jobFacts"])
    assert facts.buckets is not None and set(facts.buckets) == {"datasets", "checkpoints", "archive"}
    assert facts.buckets["archive"] == "ml-dev-archive"
    assert facts.object_store_buckets == ("ml-dev-archive",)
    assert facts.in_object_store("ml-dev-archive") and not facts.in_object_store(facts.buckets["datasets"])


def test_an_s3_dataset_is_staged_from_s3_without_the_cos_endpoint_or_keys(mixed_plan: dict[str, Any]) -> None:
    [stage] = _pod(mixed_plan, "resnet50-s3-copy")["initContainers"]
    facts = facts_from_dict(mixed_plan["outputs"]["jobFacts"])
    assert f"s3://{facts.buckets['datasets']}/imagenet-hdf5/" in stage["command"]  # type: ignore[index]
    assert "--endpoint-url" not in stage["command"] and "envFrom" not in stage
    assert _env(stage)["AWS_REGION"] == "us-west-2"


def test_a_cos_dataset_is_staged_through_the_endpoint_and_a_checkpoint_goes_to_s3(
        mixed_plan: dict[str, Any]) -> None:
    pod = _pod(mixed_plan, "from-cos")
    [stage] = pod["initContainers"]
    command = stage["command"]
    assert "s3://ml-dev-archive/imagenet-hdf5/" in command
    assert command[command.index("--endpoint-url") + 1] == COS_ENDPOINT
    assert stage["envFrom"] == [{"secretRef": {"name": "cos-credentials"}}]
    assert "AWS_REGION" not in _env(stage)  # the AWS region is not COS's signing region
    [train] = pod["containers"]
    facts = facts_from_dict(mixed_plan["outputs"]["jobFacts"])
    assert _env(train)["CHECKPOINT_URI"] == f"s3://{facts.buckets['checkpoints']}/runs/from-cos/"  # type: ignore[index]
    assert _env(train)["AWS_REGION"] == "us-west-2"
    assert "AWS_ENDPOINT_URL_S3" not in _env(train) and "envFrom" not in train


def test_the_jobs_role_names_the_s3_buckets_only(mixed_plan: dict[str, Any]) -> None:
    policies = [json.loads(r["inputs"]["policy"]) for r in resources_of(mixed_plan, "aws:iam/rolePolicy:RolePolicy")
                if r["name"].startswith("mlc-dev-jobs-")]
    assert policies
    text = json.dumps(policies)
    assert "ml-dev-archive" not in text
    facts = facts_from_dict(mixed_plan["outputs"]["jobFacts"])
    assert facts.buckets is not None and facts.buckets["checkpoints"] in text


def test_one_name_in_both_stores_is_refused(plan_config: Any) -> None:
    overrides = _dev_with_cos({"name": "archive", "bucketName": "shared-name"})
    overrides["ml-cluster:storage"]["buckets"][0]["bucketName"] = "shared-name"  # S3 bucket `datasets`
    with pytest.raises(ConfigError) as caught:
        plan_config("dev", overrides)
    assert ("ml-cluster:storage.cos.buckets[0].bucketName",
            "shared-name is also the name of S3 bucket datasets: a Job's s3://shared-name/ URI would not say which "
            "store it means; give COS bucket archive another bucketName") in caught.value.problems


def test_facts_of_a_mixed_stack_round_trip_and_render_per_container() -> None:
    facts = dataclasses.replace(dev_facts(), object_store_endpoint=COS_ENDPOINT, object_store_secret="cos-credentials",
                                object_store_buckets=("lab-archive",),
                                buckets={**(dev_facts().buckets or {}), "archive": "lab-archive"})
    assert facts_from_dict(json.loads(json.dumps(facts_to_dict(facts)))) == facts
    spec = parse_spec({"name": "mixed", "image": "registry.example/train:1", "gpus": 1,
                       "dataset": {"bucket": "datasets", "staging": "copy", "stagedSize": "20Gi"},
                       "checkpoint": {"bucket": "archive", "prefix": "runs/mixed/"}})
    pod = render_job(spec, facts)[0]["spec"]["template"]["spec"]
    [stage], [train] = pod["initContainers"], pod["containers"]
    assert "--endpoint-url" not in stage["command"] and "envFrom" not in stage
    assert _env(train)["AWS_ENDPOINT_URL_S3"] == COS_ENDPOINT
    assert train["envFrom"] == [{"secretRef": {"name": "cos-credentials"}}]
    assert "AWS_REGION" not in _env(train)
