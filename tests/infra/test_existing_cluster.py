"""A stack laid onto an EKS cluster it reads and never owns (cluster.existing): the committed example plans offline
from the DescribeCluster fixture with no cluster, VPC or subnet in it and no rule on a group it does not own; the
same config planned as "create" differs only in the cluster's own resources; every way the cluster does not fit
the stack file is one config error line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import ConfigError
from infra.plan.engine import FIXTURES_DIR, STACKS_DIR, Fixtures, offline_id, plan_stack

FOUND = json.loads((FIXTURES_DIR / "clusters.json").read_text())["ml-shared"]
NEVER_OWNED = ("aws:eks/cluster:Cluster", "aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet", "aws:ec2/natGateway:NatGateway",
               "aws:ec2/internetGateway:InternetGateway", "aws:ec2/routeTable:RouteTable", "aws:ec2/eip:Eip")


def existing_values() -> dict[str, Any]:
    return yaml.safe_load((STACKS_DIR / "Pulumi.existing.yaml").read_text())


def plan_values(tmp_path: Path, document: dict[str, Any], fixtures: Fixtures | None = None) -> dict[str, Any]:
    path = tmp_path / "Pulumi.existing.yaml"
    path.write_text(yaml.safe_dump(document))
    return plan_stack("existing", path, fixtures)


def test_the_example_adds_only_what_it_asks_for(stack_plan: Any) -> None:
    plan = stack_plan("existing")
    types = {r["type"] for r in plan["resources"]}
    assert not types & set(NEVER_OWNED)
    assert {"aws:eks/nodeGroup:NodeGroup", "aws:eks/addon:Addon", "aws:efs/mountTarget:MountTarget",
            "aws:eks/accessEntry:AccessEntry", "kubernetes:helm.sh/v3:Release"} <= types
    cluster_sg = FOUND["vpcConfig"]["clusterSecurityGroupId"]
    rules = [r["inputs"] for r in plan["resources"] if r["type"].startswith("aws:vpc/securityGroup")]
    assert rules and all(rule["securityGroupId"] != cluster_sg for rule in rules)  # nothing added to its group
    groups = [r["inputs"] for r in plan["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup"]
    assert {group["clusterName"] for group in groups} == {"ml-shared"} and all(g["version"] == "1.35" for g in groups)
    assert plan["outputs"]["clusterEndpoint"] == FOUND["endpoint"] and plan["outputs"]["clusterName"] == "ml-shared"


def test_planned_as_create_it_differs_only_in_the_clusters_own_resources(tmp_path: Path, stack_plan: Any) -> None:
    existing = stack_plan("existing")
    document = existing_values()
    document["config"]["ml-cluster:cluster"]["existing"] = False
    created = plan_values(tmp_path, document)

    def by_name(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in plan["resources"]}

    mine, theirs = by_name(created), by_name(existing)
    only_created = {name for name in set(mine) - set(theirs)}
    assert only_created and all(name.startswith("mlc-existing-cluster") for name in only_created), only_created
    assert {mine[name]["type"] for name in only_created} >= {"aws:eks/cluster:Cluster", "aws:kms/key:Key",
                                                            "aws:cloudwatch/logGroup:LogGroup"}
    assert set(theirs) - set(mine) == set()
    # everything both plans hold is the same resource, but for the cluster's own security group, which the nodes
    # join: the one DescribeCluster names, or the one the created cluster gets
    created_sg = offline_id("aws:ec2/securityGroup:SecurityGroup", "ml-shared")  # the engine's id for its group
    found_sg = FOUND["vpcConfig"]["clusterSecurityGroupId"]

    def same_sg(inputs: dict[str, Any]) -> str:
        return json.dumps(inputs, sort_keys=True).replace(created_sg, found_sg)

    differing = {name for name in set(mine) & set(theirs) if not name.startswith("mlc-existing-cluster")
                 and same_sg(mine[name]["inputs"]) != same_sg(theirs[name]["inputs"])}
    assert not differing, differing


@pytest.mark.parametrize(("edit", "path", "why"), [
    (lambda found: found.update(version="1.34"), "ml-cluster:cluster.kubernetesVersion",
     '1.35, but cluster ml-shared runs 1.34: set kubernetesVersion: "1.34"'),
    (lambda found: found["vpcConfig"].update(vpcId="vpc-0aaaaaaaaaaaaaaa0"), "ml-cluster:network.existing.vpcId",
     "vpc-0123456789abcdef0, but cluster ml-shared is in vpc-0aaaaaaaaaaaaaaa0"),
    (lambda found: found["accessConfigs"][0].update(authenticationMode="CONFIG_MAP"), "ml-cluster:cluster.name",
     "authenticates with CONFIG_MAP only"),
    (lambda found: found.update(status="UPDATING"), "ml-cluster:cluster.name", "is UPDATING, not ACTIVE"),
])
def test_a_cluster_that_does_not_fit_the_stack_file_is_one_line(tmp_path: Path, edit: Any, path: str,
                                                                why: str) -> None:
    fixtures = tmp_path / "fixtures"
    shutil.copytree(FIXTURES_DIR, fixtures)
    table = json.loads((fixtures / "clusters.json").read_text())
    edit(table["ml-shared"])
    (fixtures / "clusters.json").write_text(json.dumps(table))
    with pytest.raises(ConfigError) as caught:
        plan_values(tmp_path, existing_values(), Fixtures(fixtures))
    [line] = caught.value.lines()
    assert line.startswith(f"error: {path}: ") and why in line, line


@pytest.mark.parametrize(("edit", "why"), [
    (lambda config: config["ml-cluster:cluster"].update(logTypes=["api"], kmsKeyArn=None),
     "existing: true: kmsKeyArn, logTypes configure a cluster the stack creates"),
    (lambda config: config.update({"ml-cluster:network": {"create": {"cidr": "10.0.0.0/16",
                                                                      "availabilityZones": ["us-east-1a",
                                                                                            "us-east-1b"]}}}),
     "cluster.existing: the cluster's VPC is not the stack's to create: set network.existing"),
])
def test_what_only_a_created_cluster_takes_is_refused(tmp_path: Path, edit: Any, why: str) -> None:
    document = existing_values()
    edit(document["config"])
    with pytest.raises(ConfigError) as caught:
        plan_values(tmp_path, document)
    lines = caught.value.lines()
    assert len(lines) == 1 and why in lines[0], lines


def test_a_cluster_the_fixtures_do_not_know_is_one_line(tmp_path: Path) -> None:
    from infra.plan.engine import FixtureError

    document = existing_values()
    document["config"]["ml-cluster:cluster"]["name"] = "ml-nowhere"
    with pytest.raises(FixtureError) as caught:
        plan_values(tmp_path, document)
    assert "EKS cluster 'ml-nowhere'" in caught.value.why


# --- preflight against the AWS stub speaking EKS's rest-json protocol --------------------------------------------

def _describe(**changes: Any) -> dict[str, Any]:
    cluster = {"name": "ml-shared", "arn": FOUND["arn"], "version": "1.35", "status": "ACTIVE",
               "endpoint": FOUND["endpoint"],
               "certificateAuthority": {"data": "QQ=="}, "accessConfig": {"authenticationMode": "API_AND_CONFIG_MAP"},
               "resourcesVpcConfig": {"vpcId": "vpc-0123456789abcdef0",
                                      "subnetIds": FOUND["vpcConfig"]["subnetIds"],
                                      "clusterSecurityGroupId": "sg-0fedcba9876543210"}}
    cluster.update(changes)
    return {"cluster": cluster}


@pytest.fixture
def eks_stub() -> Any:
    from tests.awsstub import AwsStub

    stub = AwsStub().start()
    yield stub
    stub.stop()


def _eks(stub: Any) -> Any:
    return stub.client("eks")


def _config() -> Any:
    from infra.config.schema import decode_config_value, parse_stack_config

    values = existing_values()["config"]
    return parse_stack_config({key: decode_config_value(value) for key, value in values.items()})


def _addon(name: str, version: str, tags: dict[str, str] | None = None) -> Any:
    return lambda query: (200, {"addon": {"addonName": name, "addonVersion": version, "tags": tags or {}}})


def _config_with(**storage: Any) -> Any:
    from infra.config.schema import decode_config_value, parse_stack_config

    values = existing_values()["config"]
    values["ml-cluster:storage"].update(storage)
    return parse_stack_config({key: decode_config_value(value) for key, value in values.items()})


def test_preflight_finds_each_conflict_with_its_fix(eks_stub: Any) -> None:
    from infra.account.preflight import FAIL, PASS, check_existing_cluster

    eks_stub.routes[("GET", "/clusters/ml-shared")] = lambda query: (200, _describe())
    eks_stub.routes[("GET", "/clusters/ml-shared/addons")] = lambda query: (
        200, {"addons": ["aws-efs-csi-driver", "coredns", "vpc-cni"]})
    eks_stub.routes[("GET", "/clusters/ml-shared/addons/aws-efs-csi-driver")] = _addon("aws-efs-csi-driver",
                                                                                      "v2.1.4-eksbuild.1")
    eks_stub.routes[("GET", "/addons/supported-versions")] = lambda query: (200, {"addons": [{
        "addonName": query["addonName"], "addonVersions": [
            {"addonVersion": "v2.1.9-eksbuild.1", "compatibilities": [{"clusterVersion": "1.35",
                                                                       "defaultVersion": True}]},
            {"addonVersion": "v2.1.4-eksbuild.1", "compatibilities": [{"clusterVersion": "1.35",
                                                                       "defaultVersion": False}]}]}]})
    eks_stub.routes[("GET", "/clusters/ml-shared/node-groups")] = lambda query: (200, {"nodegroups": ["core", "gpu"]})
    eks_stub.routes[("GET", "/clusters/ml-shared/node-groups/core")] = lambda query: (
        200, {"nodegroup": {"nodegroupName": "core", "tags": {}}})
    eks_stub.routes[("GET", "/clusters/ml-shared/node-groups/gpu")] = lambda query: (
        200, {"nodegroup": {"nodegroupName": "gpu", "tags": {"k8s.io/cluster-autoscaler/enabled": "true"}}})
    from infra.account.kubeapi import KubeApi
    from tests.infra.test_existing_helm import stored
    from tests.jobs.kubeapi import TOKEN, fake_api_server

    with fake_api_server() as api:  # the cluster's Kubernetes API, reached with the endpoint DescribeCluster named
        api.add(stored("kueue", "kueue-system", "kueue", "0.14.1"))
        api.add(stored("gpu-operator", "gpu-operator", "gpu-operator", "v25.3.0"))
        reached = []

        def kube_for(found: Any) -> KubeApi:
            reached.append(found.endpoint)
            return KubeApi(api.url, TOKEN, timeout_s=5)

        checks = {check.name: check for check in check_existing_cluster(_eks(eks_stub), _config(), kube_for,
                                                                        stack="existing")}
    assert reached == [FOUND["endpoint"]]
    assert checks["cluster ml-shared"].status == PASS
    addon = checks["add-on aws-efs-csi-driver"]  # another version than the stack would install (EKS's default)
    assert addon.status == FAIL and "at v2.1.4-eksbuild.1" in addon.detail and "v2.1.9-eksbuild.1" in addon.detail
    assert addon.fix.startswith("adopt it: set ml-cluster:storage.externalAddons.aws-efs-csi-driver: v2.1.4-eksbuild.1")
    assert "add-on coredns" not in checks  # the cluster's own add-ons the stack does not install are left alone
    assert checks["node group gpu"].status == FAIL and "autoscaler.enabled: false" in checks["node group gpu"].fix
    assert "node group core" not in checks
    kueue = checks["helm kueue"]  # the stack's own place and chart: its own from an earlier `up`
    assert kueue.status == PASS and "kueue 0.14.1" in kueue.detail and "this stack's own" in kueue.detail
    plugin = checks["helm nvidia-device-plugin"]  # the GPU Operator runs a device plugin of its own
    assert plugin.status == FAIL and "gpu-operator v25.3.0" in plugin.detail


@pytest.mark.parametrize(("tags", "kept", "status", "says"), [
    ({"project": "ml-cluster", "stack": "existing"}, {}, "PASS", "this stack's own (tagged project=ml-cluster"),
    ({"project": "ml-cluster", "stack": "prod"}, {}, "FAIL", "not by this stack"),  # another stack's
    ({}, {"aws-efs-csi-driver": "v2.1.4-eksbuild.1"}, "PASS", "adopted: ml-shared runs aws-efs-csi-driver "
                                                             "v2.1.4-eksbuild.1 as ml-cluster:storage.externalAddons"),
    ({}, {"aws-efs-csi-driver": "v2.1.9-eksbuild.1"}, "FAIL", "runs aws-efs-csi-driver v2.1.4-eksbuild.1, "
                                                             "ml-cluster:storage.externalAddons says v2.1.9"),
    ({}, {"aws-efs-csi-driver": "v2.1.4-eksbuild.1", "aws-ebs-csi-driver": "v1.50.1-eksbuild.1"}, "FAIL",
     "names aws-ebs-csi-driver v1.50.1-eksbuild.1, but ml-shared runs no such add-on"),
])
def test_an_addon_is_a_fail_only_when_it_is_neither_the_stacks_own_nor_adopted_at_its_version(
        eks_stub: Any, tags: dict[str, str], kept: dict[str, str], status: str, says: str) -> None:
    from infra.account.preflight import check_existing_cluster

    eks_stub.routes[("GET", "/clusters/ml-shared")] = lambda query: (200, _describe())
    eks_stub.routes[("GET", "/clusters/ml-shared/addons")] = lambda query: (200, {"addons": ["aws-efs-csi-driver"]})
    eks_stub.routes[("GET", "/clusters/ml-shared/addons/aws-efs-csi-driver")] = _addon(
        "aws-efs-csi-driver", "v2.1.4-eksbuild.1", tags)
    eks_stub.routes[("GET", "/clusters/ml-shared/node-groups")] = lambda query: (200, {"nodegroups": []})
    rows = [c for c in check_existing_cluster(_eks(eks_stub), _config_with(externalAddons=kept), stack="existing")
            if c.name.startswith("add-on")]
    assert any(row.status == status and says in row.detail for row in rows), rows
    assert len(rows) == len({"aws-efs-csi-driver", *kept})


@pytest.mark.parametrize(("tags", "autoscaler", "fails"), [
    ({"k8s.io/cluster-autoscaler/enabled": "true"}, {}, True),  # someone's autoscaler scales it already
    ({"k8s.io/cluster-autoscaler/enabled": "true", "project": "ml-cluster", "stack": "existing"}, {}, False),  # ours
    ({"k8s.io/cluster-autoscaler/enabled": "true"}, {"external": {"version": "9.46.6"}}, False),  # theirs adopted
    ({"k8s.io/cluster-autoscaler/enabled": "true"}, {"enabled": False}, False),
])
def test_a_node_group_is_a_fail_only_when_a_second_autoscaler_would_scale_it(
        eks_stub: Any, tags: dict[str, str], autoscaler: dict[str, Any], fails: bool) -> None:
    from infra.account.preflight import check_existing_cluster
    from infra.config.schema import decode_config_value, parse_stack_config

    values = existing_values()["config"]
    values["ml-cluster:nodes"] = {"autoscaler": autoscaler}
    cfg = parse_stack_config({key: decode_config_value(value) for key, value in values.items()})
    eks_stub.routes[("GET", "/clusters/ml-shared")] = lambda query: (200, _describe())
    eks_stub.routes[("GET", "/clusters/ml-shared/addons")] = lambda query: (200, {"addons": []})
    eks_stub.routes[("GET", "/clusters/ml-shared/node-groups")] = lambda query: (200, {"nodegroups": ["gpu"]})
    eks_stub.routes[("GET", "/clusters/ml-shared/node-groups/gpu")] = lambda query: (
        200, {"nodegroup": {"nodegroupName": "gpu", "tags": tags}})
    rows = [c for c in check_existing_cluster(_eks(eks_stub), cfg, stack="existing") if c.name == "node group gpu"]
    assert bool(rows) == fails, rows


def test_a_cluster_in_another_region_than_the_stack_is_one_fail_row(eks_stub: Any) -> None:
    from infra.account.preflight import FAIL, check_existing_cluster

    arn = FOUND["arn"].replace("us-east-1", "eu-west-1")
    eks_stub.routes[("GET", "/clusters/ml-shared")] = lambda query: (200, _describe(arn=arn))
    [row] = [c for c in check_existing_cluster(_eks(eks_stub), _config()) if c.name == "cluster ml-shared"]
    assert row.status == FAIL and row.detail.startswith("aws:region: us-east-1, but cluster ml-shared is in eu-west-1")


@pytest.mark.parametrize(("answer", "says", "fix"), [
    ((404, {"__type": "ResourceNotFoundException", "message": "No cluster found for name: ml-shared."}),
     "ResourceNotFoundException", "aws eks list-clusters --region us-east-1"),
    ((403, {"__type": "AccessDeniedException", "message": "not authorized to perform: eks:DescribeCluster"}),
     "AccessDeniedException", "grant eks:DescribeCluster"),
    ((200, _describe(version="1.34")), "cluster.kubernetesVersion: 1.35, but cluster ml-shared runs 1.34", "the fix"),
    ((200, _describe(accessConfig={"authenticationMode": "CONFIG_MAP"})), "authenticates with CONFIG_MAP only",
     "the fix"),
    ((200, _describe(resourcesVpcConfig={"vpcId": 5})),
     "answered a broken cluster: cluster ml-shared: resourcesVpcConfig.vpcId: 5 is a number", "AWS_ENDPOINT_URL_EKS"),
    ((200, {"clusters": []}), "cluster ml-shared: answer: missing, not an object", "AWS_ENDPOINT_URL_EKS"),
])
def test_an_unreadable_wrong_or_unfit_cluster_is_one_fail_row(eks_stub: Any, answer: tuple[int, dict[str, Any]],
                                                              says: str, fix: str) -> None:
    from infra.account.preflight import FAIL, check_existing_cluster

    eks_stub.routes[("GET", "/clusters/ml-shared")] = lambda query: answer
    checks = [c for c in check_existing_cluster(_eks(eks_stub), _config()) if c.name == "cluster ml-shared"]
    [check] = checks
    assert check.status == FAIL and says in check.detail and fix in check.fix, check


@pytest.mark.parametrize("stack", ["dev", "prod", "existing"])
def test_the_addons_and_charts_preflight_looks_for_are_the_ones_the_plan_installs(stack_plan: Any,
                                                                                  stack: str) -> None:
    """One list of add-ons (infra/config/addons.py) and one of charts (infra/config/charts.py) for the components
    and preflight: prod's FSx driver, the node monitoring agent and the EFA device plugin included."""
    from infra.config.addons import stack_addons
    from infra.config.charts import stack_charts
    from infra.config.schema import decode_config_value, parse_stack_config

    values = yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())["config"]
    cfg = parse_stack_config({key: decode_config_value(value) for key, value in values.items()})
    planned = sorted(r["inputs"]["addonName"] for r in stack_plan(stack)["resources"]
                     if r["type"] == "aws:eks/addon:Addon")
    assert planned == stack_addons(cfg)
    releases = sorted((r["inputs"]["name"], r["inputs"]["namespace"], r["inputs"]["version"])
                      for r in stack_plan(stack)["resources"] if r["type"] == "kubernetes:helm.sh/v3:Release")
    assert releases == sorted((c.chart.release, c.namespace, c.version) for c in stack_charts(cfg) if not c.external)
