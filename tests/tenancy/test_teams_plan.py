"""Prod with two tenant teams: their namespaces, quotas, queues, roles and Jobs, as the plan renders them."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from infra.config.schema import ConfigError
from infra.plan.engine import kubernetes_objects, validate_kubernetes_objects
from infra.policy.plan import plan_from_document
from infra.policy.rules import POLICIES, PolicyContext
from tests.conftest import stack_values
from tests.monitoring.crds import validate_custom_resource
from tests.tenancy.teams import TEAMS, prod_with_teams, team_job

TEAM_NS = {"vision": "team-vision", "language": "team-language"}


@pytest.fixture
def teams_plan(plan_config: Any) -> dict[str, Any]:
    jobs = [team_job("vision", "vision/imagenet/", "vision/run1/"),
            team_job("language", "language/pile/", "language/run1/", gpu_type="a100")]
    return plan_config("prod", prod_with_teams(jobs=jobs))


def _objects(plan: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r["inputs"] for r in kubernetes_objects(plan) if r["inputs"].get("kind") == kind]


def test_each_team_gets_a_restricted_namespace_with_default_deny(teams_plan: dict[str, Any]) -> None:
    namespaces = {ns["metadata"]["name"]: ns for ns in _objects(teams_plan, "Namespace")}
    for team, name in TEAM_NS.items():
        labels = namespaces[name]["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert any(key.endswith("/team") and value == team for key, value in labels.items())
        policies = {p["metadata"]["name"]: p for p in _objects(teams_plan, "NetworkPolicy")
                    if p["metadata"]["namespace"] == name}
        assert policies["default-deny-ingress"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}


def test_queues_quotas_and_jobs_live_in_the_team_namespace(teams_plan: dict[str, Any]) -> None:
    queues = {q["metadata"]["name"]: q for q in _objects(teams_plan, "LocalQueue")}
    cluster_queues = {q["metadata"]["name"]: q for q in _objects(teams_plan, "ClusterQueue")}
    quotas = {q["metadata"]["namespace"]: q for q in _objects(teams_plan, "ResourceQuota")}
    for team, name in TEAM_NS.items():
        assert queues[team]["metadata"]["namespace"] == name
        assert cluster_queues[team]["spec"]["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": name}}
        assert {lr["metadata"]["namespace"] for lr in _objects(teams_plan, "LimitRange")} >= {name}
        [job] = [j for j in _objects(teams_plan, "Job") if j["metadata"]["name"].startswith(f"{team}-train")]
        assert job["metadata"]["namespace"] == name
        assert job["spec"]["template"]["spec"]["serviceAccountName"] == "training"
        hard = quotas[name]["spec"]["hard"]
        assert set(hard) == {"requests.cpu", "requests.memory", "requests.ephemeral-storage",
                             "requests.nvidia.com/gpu", "limits.nvidia.com/gpu"}
    # The most Kueue can ever admit for the team, over all flavors (a ResourceQuota cannot tell GPU types apart):
    # vision: 16 guaranteed H100s + at most 8 borrowed, and every A100 of the a100 pool (8 nodes x 8) it may borrow.
    assert quotas["team-vision"]["spec"]["hard"]["requests.nvidia.com/gpu"] == str(16 + 8 + 64)
    # language: its 8 A100s + the other 56 the cohort lends, and every H100 (16 nodes x 8) it may borrow.
    assert quotas["team-language"]["spec"]["hard"]["requests.nvidia.com/gpu"] == str(64 + 128)


def test_team_objects_are_strictly_valid(teams_plan: dict[str, Any]) -> None:
    version = stack_values("prod")["ml-cluster:cluster"]["kubernetesVersion"]
    assert validate_kubernetes_objects(teams_plan, version, custom=validate_custom_resource) == []


def _team_policies(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    roles = {r["name"]: r for r in plan["resources"] if r["type"] == "aws:iam/role:Role"}
    out = {}
    for resource in plan["resources"]:
        if resource["type"] == "aws:iam/rolePolicy:RolePolicy" and "-team-" in resource["name"]:
            team = next(t for t in TEAM_NS if f"-team-{t}-" in resource["name"])
            out[team] = json.loads(resource["inputs"]["policy"])
    assert any("ml-cluster-team" in (r["inputs"].get("tags") or {}) for r in roles.values())
    return out


def test_team_roles_name_only_their_own_prefixes(teams_plan: dict[str, Any]) -> None:
    policies = _team_policies(teams_plan)
    assert set(policies) == set(TEAM_NS)
    for team, policy in policies.items():
        text = json.dumps(policy)
        other = next(t for t in TEAM_NS if t != team)
        assert f"/{other}/" not in text and f'"{other}/' not in text
        for statement in policy["Statement"]:
            for arn in statement["Resource"]:
                assert "*" not in arn.split(":::", 1)[1].split("/", 1)[0], arn  # no wildcard bucket
                if "/" in arn.split(":::", 1)[1]:
                    assert arn.split(":::", 1)[1].split("/", 1)[1].startswith(f"{team}/"), arn
    associations = {r["inputs"]["namespace"]: r["inputs"]["serviceAccount"] for r in teams_plan["resources"]
                    if r["type"] == "aws:eks/podIdentityAssociation:PodIdentityAssociation"}
    assert associations["team-vision"] == associations["team-language"] == "training"


def test_the_stack_role_no_longer_gets_team_buckets_for_team_jobs(teams_plan: dict[str, Any]) -> None:
    # Only team Jobs: the training namespace's shared role has nothing to grant.
    assert not [r for r in teams_plan["resources"] if r["type"] == "aws:iam/rolePolicy:RolePolicy"
                and r["name"].endswith("-jobs-bucket-access")]


@pytest.mark.parametrize(("job", "field", "words"), [
    (team_job("vision", "language/pile/", "vision/run1/"), "jobs[0].dataset.prefix", "team language's data"),
    (team_job("vision", "vision/imagenet/", "language/run1/"), "jobs[0].checkpoint.prefix", "team language"),
    (team_job("vision", "shared/x/", "vision/run1/"), "jobs[0].dataset.prefix", "only under its own"),
    ({**team_job("vision", "vision/a/", "vision/b/"), "team": "nobody"}, "jobs[0].team", "not a team"),
    ({**team_job("vision", "vision/a/", "vision/b/"), "team": None}, "jobs[0].dataset.prefix", "team vision's data"),
])
def test_a_job_naming_another_teams_data_is_a_config_error(plan_config: Any, job: dict[str, Any], field: str,
                                                           words: str) -> None:
    job = {k: v for k, v in job.items() if v is not None}
    with pytest.raises(ConfigError) as error:
        plan_config("prod", prod_with_teams(jobs=[job]))
    assert any(path.endswith(field) and words in reason for path, reason in error.value.problems), \
        error.value.problems


def test_policy_pack_passes_team_roles_and_catches_a_wildcard_bucket(teams_plan: dict[str, Any]) -> None:
    [rule] = [rule for rule in POLICIES if rule.name == "team-roles-scoped"]
    assert rule.run(plan_from_document(teams_plan), PolicyContext()) == []
    widened = copy.deepcopy(teams_plan)
    for resource in widened["resources"]:
        if resource["type"] == "aws:iam/rolePolicy:RolePolicy" and "-team-vision-" in resource["name"]:
            policy = json.loads(resource["inputs"]["policy"])
            policy["Statement"][-1]["Resource"] = ["arn:aws:s3:::*/vision/*"]
            resource["inputs"]["policy"] = json.dumps(policy)
    violations = rule.run(plan_from_document(widened), PolicyContext())
    assert [v.message for v in violations] == ["team vision: resource 'arn:aws:s3:::*/vision/*' has a wildcard bucket"]


def test_a_tenant_teams_role_and_namespace_are_checked_like_every_derived_name() -> None:
    from infra.config import ConfigError, parse_stack_config
    from infra.config.schema import decode_config_value
    from infra.config.stackcheck import check_stack
    from tests.conftest import stack_values

    values = {**stack_values("prod"), **prod_with_teams()}
    long_team = {**TEAMS[1], "name": "l" * 40, "namespace": "team-long"}
    values["ml-cluster:kueue"] = {**values["ml-cluster:kueue"], "teams": [TEAMS[0], long_team]}
    cfg = parse_stack_config({key: decode_config_value(value) for key, value in values.items()})
    check_stack(cfg, "prod", "123456789012")  # mlc-prod-team-lll...: 54 characters
    with pytest.raises(ConfigError) as caught:
        check_stack(cfg, "prod-eu-west-1-a", "123456789012")
    [line] = [line for line in caught.value.lines() if "kueue.teams[1].name" in line]
    assert f"IAM role name 'mlc-prod-eu-west-1-a-team-{'l' * 40}' is 66 characters (IAM allows 64)" in line


@pytest.mark.parametrize(("namespace", "why"), [
    ("kube-system", "kube-system is a Kubernetes system namespace"),
    ("kube-node-lease", "kube-node-lease is a Kubernetes system namespace"),
    ("default", "default is a Kubernetes system namespace"),
    ("training", "training is a namespace the stack installs into"),
    ("kueue-system", "kueue-system is a namespace the stack installs into"),
    ("gpu-health", "gpu-health is a namespace the stack installs into"),
])
def test_a_team_in_a_namespace_it_does_not_own_is_one_line(namespace: str, why: str) -> None:
    """A deny-all NetworkPolicy, a quota and edit rights in kube-system (or the stack's own namespaces) would
    break the cluster: one rule for every name a tenant may not take."""
    from infra.config import parse_stack_config
    from infra.config.schema import decode_config_value

    values = {**stack_values("prod"), **prod_with_teams()}
    values["ml-cluster:kueue"] = {**values["ml-cluster:kueue"],
                                  "teams": [TEAMS[0], {**TEAMS[1], "namespace": namespace}]}
    with pytest.raises(ConfigError) as caught:
        parse_stack_config({key: decode_config_value(value) for key, value in values.items()})
    [line] = caught.value.lines()
    assert f"kueue.teams[1].namespace: {why}" in line, line
