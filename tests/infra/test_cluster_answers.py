"""A DescribeCluster answer or a clusters.json entry is read field by field, each checked by type: a missing, null,
mistyped or junk-nested field is one error naming the cluster and the field, never a 'None' read as text."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.existing_cluster import ClusterAnswerError, found_from_describe, found_from_get_cluster
from infra.plan.engine import FIXTURES_DIR, STACKS_DIR, FixtureError, Fixtures, plan_stack

ENTRY = json.loads((FIXTURES_DIR / "clusters.json").read_text())["ml-shared"]  # getCluster's shape
DESCRIBED = {  # the same cluster as DescribeCluster's `cluster` (boto3 / aws eks describe-cluster)
    "name": "ml-shared", "arn": ENTRY["arn"], "version": "1.35", "status": "ACTIVE", "endpoint": ENTRY["endpoint"],
    "certificateAuthority": {"data": "QQ=="}, "platformVersion": "eks.12", "createdAt": "2026-03-02T09:14:27Z",
    "resourcesVpcConfig": {"vpcId": "vpc-0123456789abcdef0", "subnetIds": ENTRY["vpcConfig"]["subnetIds"],
                           "securityGroupIds": [], "clusterSecurityGroupId": "sg-0fedcba9876543210",
                           "endpointPublicAccess": False, "endpointPrivateAccess": True, "publicAccessCidrs": []},
    "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"}, "tags": {"owner": "platform-team"},
    "identity": {"oidc": {"issuer": "https://oidc.eks.us-east-1.amazonaws.com/id/0123"}},
}


def test_a_whole_answer_reads_in_both_shapes() -> None:
    described, entry = found_from_describe(DESCRIBED, asked="ml-shared"), found_from_get_cluster(ENTRY)
    for found in (described, entry):
        assert (found.name, found.version, found.vpc_id, found.region) == ("ml-shared", "1.35",
                                                                          "vpc-0123456789abcdef0", "us-east-1")
        assert found.subnet_ids == tuple(ENTRY["vpcConfig"]["subnetIds"])
        assert found.authentication_mode == "API_AND_CONFIG_MAP" and found.tags == (("owner", "platform-team"),)


def test_an_old_cluster_without_access_config_reads_as_config_map() -> None:
    answer = copy.deepcopy(DESCRIBED)
    del answer["accessConfig"]
    assert found_from_describe(answer).authentication_mode == "CONFIG_MAP"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(answer: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            answer = answer[key]
        answer[last] = value
    return edit


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def edit(answer: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            answer = answer[key]
        del answer[last]
    return edit


@pytest.mark.parametrize(("edit", "field", "why"), [
    # missing
    (_drop("version"), "version", "missing (a string)"),
    (_drop("resourcesVpcConfig"), "resourcesVpcConfig", "missing: resourcesVpcConfig.vpcId (a string) is required"),
    (_drop("resourcesVpcConfig.subnetIds"), "resourcesVpcConfig.subnetIds", "missing (a list of strings)"),
    (_drop("endpoint"), "endpoint", "missing (a string)"),  # an ACTIVE cluster has one
    # wrong type
    (_set("version", 1.35), "version", "1.35 is a number, not a string"),
    (_set("status", True), "status", "true is a boolean, not a string"),
    (_set("resourcesVpcConfig.vpcId", ["vpc-0123456789abcdef0"]), "resourcesVpcConfig.vpcId",
     "is a list, not a string"),
    (_set("resourcesVpcConfig.endpointPublicAccess", "false"), "resourcesVpcConfig.endpointPublicAccess",
     '"false" is a string, not true or false'),
    (_set("tags", ["owner"]), "tags", "is a list, not an object of strings"),
    (_set("createdAt", True), "createdAt", "true is a boolean, not a timestamp"),
    # null
    (_set("version", None), "version", "null, not a string"),
    (_set("certificateAuthority", None), "certificateAuthority",
     "null: certificateAuthority.data (a string) is required"),
    (_set("resourcesVpcConfig.clusterSecurityGroupId", None), "resourcesVpcConfig.clusterSecurityGroupId",
     "null, not a string"),
    # nested junk
    (_set("resourcesVpcConfig", "vpc-0123456789abcdef0"), "resourcesVpcConfig", "is a string, not an object"),
    (_set("resourcesVpcConfig.subnetIds", ["subnet-0a1b2c3d4e5f60001", {"id": 1}]),
     "resourcesVpcConfig.subnetIds[1]", 'is an object, not a string'),
    (_set("accessConfig", [{"authenticationMode": "API"}]), "accessConfig", "is a list, not an object"),
    (_set("identity.oidc", "https://oidc"), "identity.oidc", "is a string, not an object"),
    (_set("tags.owner", {"team": "x"}), "tags.owner", "is an object, not a string"),
    # a string, but not one EKS answers
    (_set("resourcesVpcConfig.vpcId", "None"), "resourcesVpcConfig.vpcId", '"None" is not what EKS answers there'),
    (_set("arn", "arn:aws:s3:::ml-shared"), "arn", "is not what EKS answers there"),
    (_set("name", "ml-other"), "name", "the answer is another cluster's"),
])
def test_a_broken_describe_cluster_field_is_one_error_naming_it(edit: Any, field: str, why: str) -> None:
    answer = copy.deepcopy(DESCRIBED)
    edit(answer)
    with pytest.raises(ClusterAnswerError) as caught:
        found_from_describe(answer, asked="ml-shared")
    assert (caught.value.cluster, caught.value.field) == ("ml-shared", field), str(caught.value)
    assert why in caught.value.why and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize("answer", [None, [], "ml-shared", 3])
def test_an_answer_that_is_not_an_object_is_one_error(answer: Any) -> None:
    with pytest.raises(ClusterAnswerError, match=r"^cluster ml-shared: answer: .* not an object$"):
        found_from_describe(answer, asked="ml-shared")


def test_a_creating_cluster_has_no_endpoint_yet_and_is_reported_by_its_status() -> None:
    answer = copy.deepcopy(DESCRIBED)
    answer.update(status="CREATING")
    del answer["endpoint"], answer["certificateAuthority"]
    found = found_from_describe(answer)
    assert (found.status, found.endpoint) == ("CREATING", "")


@pytest.mark.parametrize(("edit", "field"), [
    (lambda entry: entry.update(certificateAuthorities=[]), "certificateAuthorities[0]"),
    (lambda entry: entry["accessConfigs"][0].update(authenticationMode=7), "accessConfigs[0].authenticationMode"),
    (lambda entry: entry.update(vpcConfig={"vpcId": None}), "vpcConfig.vpcId"),
])
def test_a_broken_clusters_json_entry_is_one_error_naming_it(edit: Any, field: str) -> None:
    entry = copy.deepcopy(ENTRY)
    edit(entry)
    with pytest.raises(ClusterAnswerError) as caught:
        found_from_get_cluster(entry, asked="ml-shared")
    assert caught.value.field == field


def test_the_offline_plan_stops_at_a_broken_fixture_entry_with_one_line(tmp_path: Path) -> None:
    fixtures = tmp_path / "fixtures"
    shutil.copytree(FIXTURES_DIR, fixtures)
    table = json.loads((fixtures / "clusters.json").read_text())
    table["ml-shared"]["vpcConfig"] = "junk"  # the SDK's own typed result raised a bare TypeError on this
    (fixtures / "clusters.json").write_text(json.dumps(table))
    stack = tmp_path / "Pulumi.existing.yaml"
    stack.write_text(yaml.safe_dump(yaml.safe_load((STACKS_DIR / "Pulumi.existing.yaml").read_text())))
    with pytest.raises(FixtureError) as caught:
        plan_stack("existing", stack, Fixtures(fixtures))
    assert caught.value.why == 'cluster ml-shared: vpcConfig: "junk" is a string, not an object'
