"""The offline plan: every stack plans, its JSON has the documented shape, Kubernetes objects are strictly valid,
secrets never appear, and --manifests / --diff work from the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.plan.engine import (
    OFFLINE_SECRET,
    FixtureError,
    Fixtures,
    kubernetes_objects,
    plan_stack,
    validate_kubernetes_objects,
)
from tests.conftest import CLI, STACKS, PlanRun, stack_values
from tests.monitoring.crds import validate_custom_resource

REPO = Path(__file__).resolve().parents[2]
OPTION_KEYS = {"protect", "retainOnDelete", "deleteBeforeReplace", "dependsOn", "ignoreChanges"}


def run_plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "plan.py"), *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize("stack", STACKS)
def test_plan_document_shape(stack: str, stack_plan: Any) -> None:
    plan = stack_plan(stack)
    assert plan["project"] == "ml-cluster" and plan["stack"] == stack
    assert plan["resources"], "a stack with no resources"
    names = {r["name"] for r in plan["resources"]}
    for resource in plan["resources"]:
        assert set(resource) == {"type", "name", "parent", "provider", "inputs", "options"}
        assert isinstance(resource["type"], str) and ":" in resource["type"]
        assert resource["parent"] is None or resource["parent"] in names
        assert resource["provider"] is None or resource["provider"] in names
        assert set(resource["options"]) == OPTION_KEYS
        assert all(dep in names for dep in resource["options"]["dependsOn"])


def _floats(node: Any) -> list[float]:
    if isinstance(node, float):
        return [node] if node.is_integer() else []
    if isinstance(node, dict):
        return [f for value in node.values() for f in _floats(value)]
    if isinstance(node, list):
        return [f for value in node for f in _floats(value)]
    return []


@pytest.mark.parametrize("stack", STACKS)
def test_integers_are_restored(stack: str, stack_plan: Any) -> None:
    assert _floats([r["inputs"] for r in stack_plan(stack)["resources"]]) == []


@pytest.mark.parametrize("stack", STACKS)
def test_every_kubernetes_object_is_strictly_valid(stack: str, stack_plan: Any) -> None:
    version = stack_values(stack).get("ml-cluster:cluster", stack_values(stack).get("ml-cluster:onprem"))[
        "kubernetesVersion"]
    plan = stack_plan(stack)
    for resource in kubernetes_objects(plan):
        manifest = resource["inputs"]
        assert manifest.get("apiVersion") and manifest.get("kind"), resource["name"]
        assert manifest.get("metadata", {}).get("name"), f"{resource['name']} has no explicit metadata.name"
    # The Prometheus operator's kinds against the CRDs of the pinned kube-prometheus-stack.
    assert validate_kubernetes_objects(plan, version, custom=validate_custom_resource) == []


def test_validator_rejects_an_invalid_object() -> None:
    plan = {"resources": [{"type": "kubernetes:core/v1:ConfigMap", "name": "x", "inputs": {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"k": 1}, "bogus": True}}]}
    problems = validate_kubernetes_objects(plan, "1.33")
    assert len(problems) == 1 and "ConfigMap x" in problems[0]


@pytest.mark.parametrize("stack", STACKS)
def test_secrets_never_appear(stack: str, stack_plan: Any) -> None:
    text = json.dumps(stack_plan(stack))
    assert OFFLINE_SECRET not in text
    for value in stack_values(stack).values():
        if isinstance(value, dict) and "secure" in value:
            assert value["secure"] not in text
    assert stack_plan(stack)["outputs"]["kubeconfig"] == "[secret]"


def test_eks_cluster_settings(stack_plan: Any) -> None:
    for stack in ("dev", "prod"):
        plan = stack_plan(stack)
        (cluster,) = [r for r in plan["resources"] if r["type"] == "aws:eks/cluster:Cluster"]
        config = stack_values(stack)["ml-cluster:cluster"]
        inputs = cluster["inputs"]
        assert inputs["version"] == config["kubernetesVersion"] and inputs["name"] == config["name"]
        assert inputs["accessConfig"]["authenticationMode"] == "API"
        assert inputs["encryptionConfig"]["resources"] == ["secrets"]
        assert inputs["enabledClusterLogTypes"] == config["logTypes"]
        assert inputs["vpcConfig"]["endpointPublicAccess"] == config["endpointPublicAccess"]
        entries = [r for r in plan["resources"] if r["type"] == "aws:eks/accessEntry:AccessEntry"]
        assert sorted(e["inputs"]["principalArn"] for e in entries) == sorted(
            e["principalArn"] for e in config["accessEntries"])
        (provider,) = [r for r in plan["resources"] if r["type"] == "pulumi:providers:kubernetes"]
        assert provider["inputs"]["kubeconfig"] == "[secret]"


def test_created_network_has_a_private_and_public_subnet_per_az(stack_plan: Any) -> None:
    plan = stack_plan("staging")
    zones = stack_values("staging")["ml-cluster:network"]["create"]["availabilityZones"]
    subnets = [r["inputs"] for r in plan["resources"] if r["type"] == "aws:ec2/subnet:Subnet"]
    assert sorted(s["availabilityZone"] for s in subnets) == sorted(zones * 2)
    cidrs = [s["cidrBlock"] for s in subnets]
    assert len(set(cidrs)) == len(cidrs)
    nats = [r for r in plan["resources"] if r["type"] == "aws:ec2/natGateway:NatGateway"]
    assert len(nats) == len(zones)  # staging: natGateways perAz
    assert len([r for r in stack_plan("dev")["resources"] if r["type"] == "aws:ec2/natGateway:NatGateway"]) == 1


def test_adopted_network_looks_up_each_subnet_az(stack_plan: Any) -> None:
    plan = stack_plan("prod")
    assert not [r for r in plan["resources"] if r["type"] in ("aws:ec2/vpc:Vpc", "aws:ec2/subnet:Subnet")]
    fixtures = json.loads((REPO / "stacks/fixtures/subnets.json").read_text())
    private = stack_values("prod")["ml-cluster:network"]["existing"]["privateSubnetIds"]
    assert plan["outputs"]["subnetAzs"] == {s: fixtures[s]["availabilityZone"] for s in private}


def test_adopted_subnet_from_another_vpc_is_a_config_error(plan_config: Any) -> None:
    from infra.config import ConfigError

    network = stack_values("prod")["ml-cluster:network"]
    network["existing"]["vpcId"] = "vpc-0fffffffffffffff0"
    with pytest.raises(ConfigError) as caught:
        plan_config("prod", {"ml-cluster:network": network})
    assert "ml-cluster:network.existing.privateSubnetIds[0]" in str(caught.value)


def test_onprem_creates_nothing_in_aws(stack_plan: Any) -> None:
    plan = stack_plan("onprem")
    cluster_things = [r for r in plan["resources"] if r["type"].startswith(("aws:eks/", "aws:ec2/"))]
    assert cluster_things == []
    (provider,) = [r for r in plan["resources"] if r["type"] == "pulumi:providers:kubernetes"
                   and r["name"] == "mlc-onprem-cluster-k8s"]
    assert provider["inputs"]["kubeconfig"] == "[secret]"
    assert provider["inputs"]["context"] == stack_values("onprem")["ml-cluster:onprem"]["context"]


def test_unanswerable_data_source_names_the_fixture(tmp_path: Path) -> None:
    (tmp_path / "caller_identity.json").write_text(json.dumps({"accountId": "111122223333"}))
    (tmp_path / "subnets.json").write_text("{}")
    with pytest.raises(FixtureError) as caught:
        plan_stack("prod", fixtures=Fixtures(tmp_path))
    assert caught.value.fixture.endswith("subnets.json") and "subnet-0a1b2c3d4e5f60001" in caught.value.why


def test_cli_json_is_one_document_and_manifests_are_written(dev_plan_process: PlanRun) -> None:
    result = dev_plan_process.result  # scripts/plan.py --stack dev --json --manifests DIR, in its own process
    assert result.returncode == 0, result.stderr.decode()
    plan = json.loads(result.stdout)
    files = sorted(dev_plan_process.manifests.glob("*.yaml"))
    assert len(files) == len(list(kubernetes_objects(plan)))
    for path in files:
        manifest = yaml.safe_load(path.read_text())
        assert manifest["apiVersion"] and manifest["kind"] and manifest["metadata"]["name"]


def test_cli_summary_counts_by_type(plan_cli: CLI) -> None:
    code, out, err = plan_cli("--stack", "dev")
    assert code == 0, err
    assert out.startswith("ml-cluster / dev: ")
    assert "aws:eks/cluster:Cluster" in out and "kubeconfig: [secret]" in out


def test_cli_diff_reports_added_removed_and_changed_paths(tmp_path: Path, stack_plan: Any, plan_cli: CLI) -> None:
    old = json.loads(json.dumps(stack_plan("dev")))
    (cluster,) = [r for r in old["resources"] if r["type"] == "aws:eks/cluster:Cluster"]
    cluster["inputs"]["version"] = "1.34"
    removed = old["resources"].pop()
    old["resources"].append({"type": "aws:s3/bucket:Bucket", "name": "gone", "parent": None, "provider": None,
                             "inputs": {}, "options": removed["options"]})
    (tmp_path / "old.json").write_text(json.dumps(old))
    code, out, err = plan_cli("--stack", "dev", "--diff", str(tmp_path / "old.json"), "--json")
    assert code == 0, err
    changes = json.loads(out)
    assert {"type": removed["type"], "name": removed["name"]} in changes["added"]
    assert changes["removed"] == [{"type": "aws:s3/bucket:Bucket", "name": "gone"}]
    changed = {(c["type"], c["name"]): c["paths"] for c in changes["changed"]}
    assert changed[("aws:eks/cluster:Cluster", cluster["name"])] == ["inputs.version"]
    text = plan_cli("--stack", "dev", "--diff", str(tmp_path / "old.json"))[1]
    assert "1 to remove" in text and "~ aws:eks/cluster:Cluster" in text


@pytest.mark.slow  # two CLI plans; test_cli_diff_reports_added_removed_and_changed_paths keeps --diff in make test
def test_cli_diff_against_itself_is_empty(tmp_path: Path) -> None:
    first = run_plan("--stack", "onprem", "--json")
    (tmp_path / "plan.json").write_text(first.stdout)
    result = run_plan("--stack", "onprem", "--diff", str(tmp_path / "plan.json"), "--json")
    assert json.loads(result.stdout) | {"stack": "onprem"} == {"stack": "onprem", "added": [], "removed": [],
                                                                "changed": []}


def test_cli_bad_diff_file_is_an_error(tmp_path: Path, plan_cli: CLI) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    code, _, err = plan_cli("--stack", "dev", "--diff", str(tmp_path / "bad.json"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'bad.json'}: ")


def test_unknown_instance_type_names_the_pool_and_the_fixture(tmp_path: Path, plan_cli: CLI) -> None:
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text((REPO / "stacks/Pulumi.dev.yaml").read_text().replace("g5.xlarge", "g9.mega"))
    code, _, err = plan_cli("--stack", "dev", "--config", str(path))
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert any(line.startswith("error: ml-cluster:nodePools[") and "g9.mega" in line for line in lines), lines
    assert any(line.startswith("error: stacks/fixtures/instance_types.json: ") for line in lines), lines
    # a typo of a type the fixture knows: the type meant, not an invitation to add the typo to the fixture
    path.write_text((REPO / "stacks/Pulumi.dev.yaml").read_text().replace("g5.xlarge", "g5.xlarg"))
    lines = plan_cli("--stack", "dev", "--config", str(path))[2].strip().splitlines()
    [fixture] = [line for line in lines if line.startswith("error: stacks/fixtures/instance_types.json: ")]
    assert fixture.endswith("no entry for instance type 'g5.xlarg': did you mean 'g5.xlarge'?"), fixture


def test_a_job_on_a_claim_the_stack_does_not_make_stops_before_any_resource(plan_config: Any) -> None:
    from infra.config import ConfigError

    jobs = stack_values("dev")["ml-cluster:jobs"]
    efs_job = next(index for index, job in enumerate(jobs) if job.get("dataset", {}).get("claimName"))
    jobs[efs_job]["dataset"]["claimName"] = "no-such-claim"
    with pytest.raises(ConfigError) as caught:
        plan_config("dev", {"ml-cluster:jobs": jobs})
    assert any("no-such-claim" in why for _, why in caught.value.problems), caught.value.problems


@pytest.mark.parametrize(("document", "why"), [
    ({"stack": "dev", "resources": [1, "x"]}, "resources[0]: not a resource (a mapping with type and name)"),
    ({"stack": "dev", "resources": [{"urn": 5}]}, "resources[0]: not a resource (a mapping with type and name)"),
    ({"stack": "dev", "resources": [{"type": "t", "name": "n", "options": 5}]}, "resources[0].options: not a mapping"),
    ({"stack": "staging", "resources": []}, "is a plan of stack staging, not dev"),
])
def test_cli_diff_refuses_a_malformed_or_foreign_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str], document: Any,
                                                      why: str) -> None:
    from scripts import plan as plan_cli

    def no_plan(stack: str, config: Path | None = None) -> Any:
        raise AssertionError("the old plan is checked before planning")

    monkeypatch.setattr(plan_cli, "plan_stack", no_plan)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(document))
    for extra in ([], ["--cost"]):
        assert plan_cli.main(["--stack", "dev", "--diff", str(old), *extra]) == 2
        assert capsys.readouterr().err == f"error: {old}: {why}\n"


@pytest.mark.parametrize("stack", ["../x", "../stacks/Pulumi.dev", "/etc/passwd", "Dev"])
def test_a_stack_name_with_path_characters_is_refused_before_any_file_is_read(
        stack: str, capsys: pytest.CaptureFixture[str]) -> None:
    from scripts import plan as plan_cli
    from scripts import preflight as preflight_cli

    for main in (plan_cli.main, preflight_cli.main):
        assert main(["--stack", stack]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: stack: {stack!r} is not a valid stack name") and err.count("\n") == 1, err


def test_manifests_are_all_written_or_none(tmp_path: Path, stack_plan: Any) -> None:
    """A target name taken by a directory stops the write before any file lands, and leaves no temporary file."""
    from infra.plan.view import write_manifests

    plan = stack_plan("onprem")
    names = [path.name for path in write_manifests(plan, tmp_path / "first")]
    target = tmp_path / "second"
    (target / names[4]).mkdir(parents=True)
    with pytest.raises(OSError) as caught:
        write_manifests(plan, target)
    assert caught.value.filename == str(target / names[4])
    assert sorted(path.name for path in target.iterdir()) == [names[4]]


def test_manifests_of_an_earlier_run_do_not_stay_beside_the_new_ones(tmp_path: Path, stack_plan: Any) -> None:
    """Before: --manifests into a folder holding another stack's manifests left them beside the new set, and
    `kubectl diff -f DIR` would have applied both. Files of other names are the user's and stay."""
    from infra.plan.view import write_manifests

    target = tmp_path / "out"
    first = {path.name for path in write_manifests(stack_plan("dev"), target)}
    (target / "README.txt").write_text("mine")
    second = {path.name for path in write_manifests(stack_plan("onprem"), target)}
    assert {path.name for path in target.iterdir()} == second | {"README.txt"}
    assert first - second  # dev's own objects were there and are gone


def test_a_program_stopped_by_its_config_never_leaves_the_plan_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that created an Output whose value never comes, then stopped on its config: the plan still ends
    (with the ConfigError) instead of waiting for that Output forever."""
    import asyncio
    import threading

    import pulumi

    from infra.config import ConfigError, ConfigExit
    from infra.plan import engine

    def stopped_program(path: str, init_globals: Any = None, run_name: str = "") -> None:
        never = asyncio.get_event_loop().create_future()
        pulumi.Output.from_input(never).apply(lambda value: value)
        raise ConfigExit(ConfigError([("stack", "stopped on purpose")]))

    monkeypatch.setattr(engine.runpy, "run_path", stopped_program)
    outcome: list[BaseException] = []

    def plan() -> None:
        try:
            engine.plan_stack("dev")
        except BaseException as exc:  # noqa: BLE001 - what the plan ended with is the assertion
            outcome.append(exc)

    worker = threading.Thread(target=plan, daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "plan_stack still waiting for an Output of a stopped program"
    assert isinstance(outcome[0], ConfigError) and outcome[0].problems == [("stack", "stopped on purpose")]


def test_cli_writes_the_job_facts_that_render_jobs_without_a_cluster(dev_plan_process: PlanRun) -> None:
    facts, result = dev_plan_process.facts, dev_plan_process.result  # scripts/plan.py --facts FILE, its own process
    assert result.returncode == 0, result.stderr.decode()
    assert f"wrote the stack's job facts to {facts}" in result.stderr.decode()
    from workloads.cluster_facts import facts_from_dict

    assert facts_from_dict(json.loads(facts.read_text())).stack == "dev"
    rendered = subprocess.run([sys.executable, "-m", "workloads.submit", "render",
                               str(REPO / "workloads" / "jobs" / "resnet50-s3-copy.yaml"), "--facts", str(facts)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    assert rendered.returncode == 0 and "kind: Job" in rendered.stdout, rendered.stderr
