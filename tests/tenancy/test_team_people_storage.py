"""Prod with two tenant teams: the people (EKS access entries, RoleBindings) and the teams' own EFS directories."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import ConfigError, parse_stack_config
from infra.config.schema import decode_config_value
from infra.config.stackcheck import check_stack
from infra.plan.engine import plan_stack
from infra.plan.view import team_summary
from infra.policy.plan import plan_from_document
from infra.policy.rules import POLICIES, PolicyContext, evaluate
from tests.conftest import STACKS_DIR, resources_of, stack_values
from tests.tenancy.teams import AUDITOR, LANGUAGE_ENGINEERS, TEAMS, VISION_ENGINEERS, prod_with_teams, team_job

EDIT = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSEditPolicy"
VIEW = "arn:aws:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"


def _plan(tmp: Path, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    document = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())
    document["config"].update(prod_with_teams(jobs=jobs))
    path = tmp / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(document))
    return plan_stack("prod", path)


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    vision = {**team_job("vision", "vision/imagenet/", "vision/run1/"),
              "checkpoint": {"claimName": "team-shared", "mountPath": "/checkpoints"}}
    return _plan(tmp_path_factory.mktemp("teams"), [vision])


def _team_inputs(plan: dict[str, Any], type_token: str) -> list[dict[str, Any]]:
    return [r["inputs"] for r in resources_of(plan, type_token) if "-team-" in r["name"]]


def test_each_member_gets_one_access_entry_scoped_to_its_teams_namespaces(plan: dict[str, Any]) -> None:
    entries = {e["principalArn"]: e for e in _team_inputs(plan, "aws:eks/accessEntry:AccessEntry")}
    assert set(entries) == {VISION_ENGINEERS, LANGUAGE_ENGINEERS, AUDITOR}
    assert entries[AUDITOR]["kubernetesGroups"] == ["ml-cluster.io:team-language", "ml-cluster.io:team-vision"]
    assert entries[VISION_ENGINEERS]["kubernetesGroups"] == ["ml-cluster.io:team-vision"]
    assert {e["type"] for e in entries.values()} == {"STANDARD"}
    scopes = {(a["principalArn"], a["policyArn"]): a["accessScope"]
              for a in _team_inputs(plan, "aws:eks/accessPolicyAssociation:AccessPolicyAssociation")}
    assert scopes == {
        (VISION_ENGINEERS, EDIT): {"type": "namespace", "namespaces": ["team-vision"]},
        (LANGUAGE_ENGINEERS, EDIT): {"type": "namespace", "namespaces": ["team-language"]},
        (AUDITOR, VIEW): {"type": "namespace", "namespaces": ["team-language", "team-vision"]},
    }


def test_groups_are_bound_in_their_teams_namespace_only(plan: dict[str, Any]) -> None:
    bindings = {(b["metadata"]["namespace"], b["metadata"]["name"]): (b["roleRef"], b["subjects"])
                for b in _team_inputs(plan, "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")}
    group = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group"}
    view = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"}
    assert bindings == {
        ("team-vision", "team-view"): (view, [{**group, "name": "vision-oncall"}]),
        ("team-vision", "team-principals-view"): (view, [{**group, "name": "ml-cluster.io:team-vision"}]),
        ("team-language", "team-principals-view"): (view, [{**group, "name": "ml-cluster.io:team-language"}]),
    }
    # No team member is bound cluster-wide (the stack's own components may be, e.g. the GPU health checker).
    cluster_bindings = resources_of(plan, "kubernetes:rbac.authorization.k8s.io/v1:ClusterRoleBinding")
    subjects = [s for b in cluster_bindings for s in b["inputs"].get("subjects") or []]
    assert not [s for s in subjects if s["kind"] == "Group" or "team" in s.get("namespace", "")]


def test_each_team_volume_is_an_access_point_on_its_own_directory(plan: dict[str, Any]) -> None:
    points = {p["rootDirectory"]["path"]: p for p in _team_inputs(plan, "aws:efs/accessPoint:AccessPoint")}
    assert set(points) == {"/teams/vision", "/teams/language"}
    assert points["/teams/vision"]["posixUser"] == {"uid": 20001, "gid": 20001}
    assert points["/teams/vision"]["rootDirectory"]["creationInfo"] == {
        "ownerUid": 20001, "ownerGid": 20001, "permissions": "0770"}
    file_system = plan["outputs"]["storage"]["efs"]["fileSystemId"]  # the stack's one file system
    assert {p["fileSystemId"] for p in points.values()} == {file_system}
    volumes = {v["spec"]["claimRef"]["namespace"]: v for v in _team_inputs(plan, "kubernetes:core/v1:PersistentVolume")}
    claims = {c["metadata"]["namespace"]: c for c in _team_inputs(plan, "kubernetes:core/v1:PersistentVolumeClaim")}
    handles = set()
    for namespace, claim_name in (("team-vision", "team-shared"), ("team-language", "shared")):
        volume, claim = volumes[namespace], claims[namespace]
        handle = volume["spec"]["csi"]["volumeHandle"]
        fs_id, empty, ap_id = handle.split(":")
        assert (fs_id, empty) == (file_system, "") and ap_id.startswith("fsap-")
        handles.add(handle)
        assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        assert claim["metadata"]["name"] == claim_name == volume["spec"]["claimRef"]["name"]
        assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert len(handles) == 2  # one volume per access point: the kubelet never mixes them up
    [job] = [j["inputs"] for j in resources_of(plan, "kubernetes:batch/v1:Job")
             if j["inputs"]["metadata"]["namespace"] == "team-vision"]
    claims_used = [v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
                   if "persistentVolumeClaim" in v]
    assert claims_used == ["team-shared"]


def test_a_teams_job_cannot_mount_another_teams_claim(plan_config: Any) -> None:
    job = {**team_job("vision", "vision/imagenet/", "vision/run1/"),
           "checkpoint": {"claimName": "shared", "mountPath": "/checkpoints"}}  # team language's claim
    with pytest.raises(ConfigError) as error:
        plan_config("prod", prod_with_teams(jobs=[job]))
    assert any(path.startswith("ml-cluster:jobs[0].checkpoint") and "shared" in why
               for path, why in error.value.problems), error.value.problems


def _check(teams: list[dict[str, Any]], **overrides: Any) -> list[str]:
    values = {**stack_values("prod"), **prod_with_teams(), **overrides}
    values["ml-cluster:kueue"] = {**values["ml-cluster:kueue"], "teams": teams}
    try:
        cfg = parse_stack_config({key: decode_config_value(value) for key, value in values.items()})
        check_stack(cfg, "prod", "123456789012")
    except ConfigError as error:
        return error.lines()
    return []


def _with(index: int, **changes: Any) -> list[dict[str, Any]]:
    teams = [dict(team) for team in TEAMS]
    teams[index].update(changes)
    return teams


def test_the_two_teams_pass_the_checks() -> None:
    assert _check(TEAMS) == []


@pytest.mark.parametrize(("teams", "where", "words"), [
    (_with(0, members=[{"principalArn": "arn:aws:sts::123456789012:assumed-role/x/y"}]),
     "kueue.teams[0].members[0].principalArn", "should match pattern"),
    (_with(0, members=[{"principalArn": VISION_ENGINEERS, "group": "g"}]), "kueue.teams[0].members[0]",
     "exactly one of"),
    (_with(0, members=[{"group": "system:authenticated"}]), "kueue.teams[0].members[0]", "system: groups"),
    (_with(0, members=[{"group": "g"}, {"group": "g", "access": "view"}]), "kueue.teams[0]", "listed twice"),
    (_with(1, volume={"uid": 20001, "gid": 5}), "kueue", "share volume uid 20001"),
    (_with(0, volume={"uid": 0, "gid": 0}), "kueue.teams[0].volume.uid", "greater than or equal to 1"),
    (_with(0, namespace=None, datasets=[], checkpoints=[]), "kueue.teams[0]", "need a namespace"),
])
def test_bad_team_members_and_volumes_are_config_errors(teams: list[dict[str, Any]], where: str,
                                                        words: str) -> None:
    lines = _check(teams)
    assert any(f"ml-cluster:{where}:" in line and words in line for line in lines), lines


def test_a_member_with_a_cluster_access_entry_is_refused() -> None:
    cluster = {**stack_values("prod")["ml-cluster:cluster"]}
    cluster["accessEntries"] = [*cluster.get("accessEntries", []), {"principalArn": VISION_ENGINEERS}]
    lines = _check(TEAMS, **{"ml-cluster:cluster": cluster})
    assert any("kueue.teams[0].members[0].principalArn" in line and "already has a cluster access entry" in line
               for line in lines), lines


def test_a_team_volume_under_the_dynamic_base_path_is_refused() -> None:
    storage = {**stack_values("prod")["ml-cluster:storage"]}
    storage["efs"] = {**storage["efs"], "storageClass": {**storage["efs"]["storageClass"], "basePath": "/teams"}}
    lines = _check(TEAMS, **{"ml-cluster:storage": storage})
    assert any("kueue.teams[0].volume" in line and "under /teams" in line for line in lines), lines


def test_policy_pack_passes_the_teams_plan_and_catches_a_missing_quota(plan: dict[str, Any]) -> None:
    rules = [rule for rule in POLICIES if rule.name in ("team-namespaces-have-quota", "gpu-jobs-in-team-namespaces")]
    assert len(rules) == 2
    assert evaluate(plan_from_document(plan), PolicyContext(stack_protected=True), rules) == []
    without = {**plan, "resources": [r for r in plan["resources"]
                                     if r["name"] != "mlc-prod-team-language-resourcequota-team-quota"]}
    found = evaluate(plan_from_document(without), PolicyContext(stack_protected=True), rules)
    assert [str(v) for v in found] == ["mandatory: team-namespaces-have-quota: kubernetes:core/v1:Namespace "
                                       "mlc-prod-team-language-ns: team namespace team-language has no ResourceQuota"]


def test_the_plan_summary_lists_each_teams_objects_and_people(plan: dict[str, Any]) -> None:
    lines = team_summary(plan)
    assert lines[:2] == ["", "teams:"]
    vision = lines.index("  vision (namespace team-vision): GPU quota 88; role mlc-prod-team-vision; "
                         "EFS /teams/vision (claims: team-shared)")
    assert lines[vision + 1:vision + 5] == [f"    access: {VISION_ENGINEERS} (AmazonEKSEditPolicy)",
                                            f"    access: {AUDITOR} (AmazonEKSViewPolicy)",
                                            "    access: group ml-cluster.io:team-vision (view)",
                                            "    access: group vision-oncall (view)"]
    # the ConfigMap: the job facts, which the team's members read with their view/edit rights (infra/jobfacts.py)
    assert lines[vision + 5] == ("    objects: 1 ConfigMap, 1 Job, 1 LimitRange, 1 LocalQueue, 2 NetworkPolicy, "
                                 "1 PersistentVolumeClaim, 1 ResourceQuota, 2 RoleBinding, 1 ServiceAccount")


ONPREM_TEAM = {"name": "vision", "namespace": "team-vision", "quotas": [{"flavor": "a100", "gpus": 8}],
               "members": [{"group": "oidc:vision-engineers"}, {"group": "oidc:vision-oncall", "access": "view"}]}


def test_onprem_teams_get_their_people_as_groups_bound_in_their_namespace(plan_config: Any) -> None:
    kueue = {**stack_values("onprem")["ml-cluster:kueue"], "teams": [ONPREM_TEAM]}
    plan = plan_config("onprem", {"ml-cluster:kueue": kueue})
    bindings = {b["metadata"]["name"]: (b["metadata"]["namespace"], b["roleRef"]["name"],
                                        [s["name"] for s in b["subjects"]])
                for b in _team_inputs(plan, "kubernetes:rbac.authorization.k8s.io/v1:RoleBinding")}
    assert bindings == {"team-edit": ("team-vision", "edit", ["oidc:vision-engineers"]),
                        "team-view": ("team-vision", "view", ["oidc:vision-oncall"])}
    assert not [r for r in plan["resources"] if r["type"].startswith("aws:eks/") or r["type"] == "aws:iam/role:Role"]


def test_an_iam_principal_on_onprem_is_a_config_error(plan_config: Any) -> None:
    team = {**ONPREM_TEAM, "members": [{"principalArn": VISION_ENGINEERS}]}
    kueue = {**stack_values("onprem")["ml-cluster:kueue"], "teams": [team]}
    with pytest.raises(ConfigError) as error:
        plan_config("onprem", {"ml-cluster:kueue": kueue})
    assert any(path == "ml-cluster:kueue.teams[0].members[0].principalArn" and "name the group" in why
               for path, why in error.value.shown()), error.value.shown()
