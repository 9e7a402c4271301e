"""A stack's deploy runner must reach its API server; the workflows run each stack on the runner its file names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import ConfigError
from infra.config.cluster import ClusterConfig
from infra.config.deploy import DeployConfig, public_access_cidrs, reachability_problems
from scripts.deploy_runner import main as deploy_runner_main
from tests.conftest import resources_of


def _cluster(**fields: Any) -> ClusterConfig:
    return ClusterConfig.model_validate({"name": "ml-x", "kubernetesVersion": "1.33", **fields})


@pytest.mark.parametrize(("cluster", "deploy"), [
    ({}, {}),  # public to everyone: any runner
    ({"publicAccessCidrs": ["52.0.0.0/24"]}, {"egressCidrs": ["52.9.9.0/28"]}),  # larger runner, static egress
    ({"endpointPublicAccess": False}, {"runner": "self-hosted", "labels": ["self-hosted", "vpc"]}),
])
def test_reachable_runners_pass(cluster: dict[str, Any], deploy: dict[str, Any]) -> None:
    assert reachability_problems(_cluster(**cluster), DeployConfig.model_validate(deploy)) == []


@pytest.mark.parametrize(("cluster", "deploy", "path", "why"), [
    ({"endpointPublicAccess": False}, {}, "ml-cluster:deploy.runner", "the endpoint is private"),
    ({"publicAccessCidrs": ["52.0.0.0/24"]}, {}, "ml-cluster:deploy.runner", "allows only 52.0.0.0/24"),
    ({"endpointPrivateAccess": False, "publicAccessCidrs": ["52.0.0.0/24"]},
     {"runner": "self-hosted", "labels": ["x"]}, "ml-cluster:deploy.runner", "through the VPC"),
    ({"endpointPublicAccess": False}, {"runner": "self-hosted", "labels": ["x"], "egressCidrs": ["52.9.9.0/28"]},
     "ml-cluster:deploy.egressCidrs", "the endpoint is private"),
])
def test_unreachable_runners_are_config_errors_saying_what_to_change(cluster: dict[str, Any],
                                                                     deploy: dict[str, Any], path: str,
                                                                     why: str) -> None:
    problems = reachability_problems(_cluster(**cluster), DeployConfig.model_validate(deploy))
    assert [p for p, _ in problems] == [path] and why in problems[0][1]


def test_a_self_hosted_runner_needs_labels() -> None:
    with pytest.raises(ValueError, match="runner self-hosted needs labels"):
        DeployConfig.model_validate({"runner": "self-hosted"})


def test_the_runners_egress_is_added_to_the_endpoints_allowed_networks(stack_plan: Callable[[str], Any]) -> None:
    assert public_access_cidrs(_cluster(), DeployConfig(egress_cidrs=["52.9.9.0/28"])) == ["0.0.0.0/0"]
    (cluster,) = resources_of(stack_plan("staging"), "aws:eks/cluster:Cluster")
    assert cluster["inputs"]["vpcConfig"]["publicAccessCidrs"] == ["203.0.113.0/24", "198.51.100.16/28"]


def test_deploy_runner_prints_each_stacks_labels_and_refuses_an_unreachable_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "github-output"
    assert deploy_runner_main(["dev", "prod", "--github-output", str(output)]) == 0
    expected = '{"dev":["ubuntu-latest"],"prod":["self-hosted","linux","x64","ml-prod-vpc"]}'
    assert capsys.readouterr().out == expected + "\n"
    assert output.read_text() == f"labels={expected}\n"


def test_an_unreachable_stack_file_stops_the_plan(plan_config: Callable[..., Any]) -> None:
    prod = yaml.safe_load((Path(__file__).parents[2] / "stacks" / "Pulumi.prod.yaml").read_text())["config"]
    assert prod["ml-cluster:deploy"]["runner"] == "self-hosted"
    with pytest.raises(ConfigError) as caught:
        plan_config("prod", {"ml-cluster:deploy": {"runner": "github-hosted"}})
    assert caught.value.lines() == [
        "error: ml-cluster:deploy.runner: GitHub-hosted runners cannot reach the API server: the endpoint is "
        "private (cluster.endpointPublicAccess: false). Use runner: self-hosted with the labels of a runner in "
        "the VPC, or list the runner's static egress in deploy.egressCidrs"]
