"""The stack's image registry: an ECR repository per stack that the Jobs run by `imageTag`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from infra.config import ConfigError
from infra.config.registry import RegistryConfig
from infra.registry import lifecycle_policy
from tests.conftest import AWS_STACKS, resources_of, stack_values

Plan = dict[str, Any]
REPOSITORY = "aws:ecr/repository:Repository"


def _job_images(plan: Plan) -> list[str]:
    return [container["image"] for job in resources_of(plan, "kubernetes:batch/v1:Job")
            for container in job["inputs"]["spec"]["template"]["spec"]["containers"]]


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_every_aws_stack_has_an_immutable_scanned_repository(stack: str, stack_plan: Callable[[str], Plan]) -> None:
    plan = stack_plan(stack)
    (repository,) = resources_of(plan, REPOSITORY)
    inputs, options = repository["inputs"], repository["options"]
    assert inputs["name"] == f"mlc-{stack}-train"
    assert inputs["imageTagMutability"] == "IMMUTABLE"
    assert inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    protected = bool(stack_values(stack).get("ml-cluster:protected"))
    assert options["protect"] is protected and inputs["forceDelete"] is (not protected)
    (policy,) = resources_of(plan, "aws:ecr/lifecyclePolicy:LifecyclePolicy")
    assert json.loads(policy["inputs"]["policy"]) == json.loads(lifecycle_policy(RegistryConfig()))
    url = plan["outputs"]["imageRepository"]
    assert url.endswith(f".amazonaws.com/mlc-{stack}-train")
    assert all(image.startswith(url + ":") for image in _job_images(plan) if "dkr.ecr" in image)


def test_the_lifecycle_policy_expires_untagged_first_and_keeps_the_newest_tagged() -> None:
    rules = json.loads(lifecycle_policy(RegistryConfig(keep_tagged_images=5, untagged_expiry_days=2)))["rules"]
    assert [rule["rulePriority"] for rule in rules] == [1, 2]  # ECR: the tagStatus "any" rule must come last
    assert rules[0]["selection"] == {"tagStatus": "untagged", "countType": "sinceImagePushed",
                                     "countUnit": "days", "countNumber": 2}
    assert rules[1]["selection"] == {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": 5}


def test_jobs_run_the_stacks_own_image_by_tag(plan_config: Callable[..., Plan]) -> None:
    plan = plan_config("dev", {"aws:region": "eu-west-1"} | _region_network("eu-west-1"))
    account = plan["outputs"]["jobFacts"]["image_repository"].split(".")[0]
    assert set(_job_images(plan)) == {f"{account}.dkr.ecr.eu-west-1.amazonaws.com/mlc-dev-train:0.1.0"}


def _region_network(region: str) -> dict[str, Any]:
    network = stack_values("dev")["ml-cluster:network"]
    network["create"]["availabilityZones"] = [f"{region}a", f"{region}b", f"{region}c"]
    return {"ml-cluster:network": network}


def test_an_image_tag_without_a_registry_is_a_config_error(plan_config: Callable[..., Plan]) -> None:
    with pytest.raises(ConfigError, match=r"jobs\[0\]\.imageTag: stack dev has no image registry"):
        plan_config("dev", {"ml-cluster:registry": {"enabled": False}})


@pytest.mark.parametrize(("values", "field"), [
    ({"image": "x:1", "imageTag": "1"}, "image"), ({}, "image"), ({"imageTag": ".hidden"}, "imageTag")])
def test_image_and_image_tag_are_one_or_the_other(values: dict[str, Any], field: str,
                                                  plan_config: Callable[..., Plan]) -> None:
    jobs = stack_values("dev")["ml-cluster:jobs"]
    jobs[0].pop("imageTag")
    jobs[0].update(values)
    with pytest.raises(ConfigError, match=rf"jobs\[0\]\.{field}"):
        plan_config("dev", {"ml-cluster:jobs": jobs})


def test_a_bad_repository_name_is_a_config_error(plan_config: Callable[..., Plan]) -> None:
    with pytest.raises(ConfigError, match=r"registry\.repository: 'Train' is not an ECR repository name"):
        plan_config("dev", {"ml-cluster:registry": {"repository": "Train"}})
