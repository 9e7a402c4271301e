"""A real `pulumi up`/`preview` refuses values only the user can know when a placeholder is left in them; the offline
plan keeps working with the same committed stack files."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import ConfigError
from infra.config.placeholders import account_problems, placeholder_problems
from infra.plan.engine import load_stack_file, placeholders_left, plan_stack
from tests.conftest import stack_values

ADMIN = "arn:aws:iam::210987654321:role/ml-platform-admins"


def _paths(problems: list[tuple[str, str]]) -> list[str]:
    return [path for path, _ in problems]


def test_the_committed_stacks_placeholders_are_each_named_with_what_to_put_there() -> None:
    dev = placeholder_problems(stack_values("dev"), deploying=True)
    assert _paths(dev) == ["ml-cluster:cluster.accessEntries[0].principalArn",
                           "ml-cluster:cluster.accessEntries[1].principalArn"]
    assert "documentation account 111122223333" in dev[0][1] and "your own account" in dev[0][1]
    prod = dict(placeholder_problems(stack_values("prod"), deploying=True))
    assert "ml-cluster:network.existing.vpcId" in prod and "aws ec2 describe-vpcs" in prod[
        "ml-cluster:network.existing.vpcId"]
    assert "ml-cluster:network.existing.privateSubnetIds[0]" in prod
    staging = dict(placeholder_problems(stack_values("staging"), deploying=True))
    assert "RFC 5737" in staging["ml-cluster:cluster.publicAccessCidrs[0]"]


@pytest.mark.parametrize(("key", "value", "path"), [
    ("ml-cluster:cluster", {"accessEntries": [{"principalArn": "arn:aws:iam::123456789012:role/admin"}]},
     "ml-cluster:cluster.accessEntries[0].principalArn"),
    ("ml-cluster:cluster", {"publicAccessCidrs": ["198.51.100.7/32"]}, "ml-cluster:cluster.publicAccessCidrs[0]"),
    ("ml-cluster:cluster", {"kmsKeyArn": "arn:aws:kms:us-east-1:444455556666:key/x"}, "ml-cluster:cluster.kmsKeyArn"),
    ("ml-cluster:tags", {"owner": "<your-team>"}, "ml-cluster:tags.owner"),
    ("ml-cluster:accountId", "111122223333", "ml-cluster:accountId"),
    ("ml-cluster:accountId", 111122223333, "ml-cluster:accountId"),
    ("ml-cluster:network", {"existing": {"vpcId": "vpc-0123456789abcdef0"}}, "ml-cluster:network.existing.vpcId"),
])
def test_each_class_of_placeholder_is_refused_where_it_sits(key: str, value: Any, path: str) -> None:
    assert _paths(placeholder_problems({key: value}, deploying=True)) == [path]


def test_real_values_pass_and_offline_only_markers_are_refused() -> None:
    real = {"aws:region": "us-west-2", "ml-cluster:accountId": "210987654321", "ml-cluster:cluster": {
        "accessEntries": [{"principalArn": ADMIN}], "publicAccessCidrs": ["0.0.0.0/0", "52.1.2.3/32"]},
        "ml-cluster:network": {"existing": {"vpcId": "vpc-0f3e9a1b7c5d24680", "privateSubnetIds": [
            "subnet-07c1e5a9b3d2f4e61"]}}}
    assert placeholder_problems(real, deploying=True) == []
    # Offline the documentation account and example networks are the fixtures' world; a <marker> is never a value.
    assert placeholder_problems(stack_values("prod"), deploying=False) == []
    assert _paths(placeholder_problems({"ml-cluster:tags": {"owner": "<team>"}}, deploying=False)) == [
        "ml-cluster:tags.owner"]


def test_secrets_are_never_inspected() -> None:
    assert placeholder_problems({"ml-cluster:kubeconfig": "<paste>"}, deploying=True,
                                secret_keys=["ml-cluster:kubeconfig"]) == []


def test_a_pinned_account_must_be_the_callers() -> None:
    assert account_problems("210987654321", "210987654321") == []
    assert account_problems(None, "210987654321") == []
    ((path, why),) = account_problems("210987654321", "999988887777")
    assert path == "ml-cluster:accountId"
    assert "999988887777" in why and "210987654321" in why and "credentials" in why


def test_a_real_run_with_a_placeholder_stops_before_any_resource(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_stack("dev", offline=False)
    lines = caught.value.lines()
    assert lines[0].startswith("error: ml-cluster:cluster.accessEntries[0].principalArn: "), lines
    assert all(line.startswith("error: ml-cluster:") for line in lines)


def test_a_real_run_with_credentials_for_another_account_stops(tmp_path: Any) -> None:
    import yaml

    values = stack_values("dev")
    values["ml-cluster:accountId"] = "210987654321"  # the fixtures' caller is 111122223333
    values["ml-cluster:cluster"]["accessEntries"] = [{"principalArn": ADMIN, "policy": "cluster-admin"}]
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": values}))
    with pytest.raises(ConfigError) as caught:
        plan_stack("dev", path, offline=False)
    assert [line.split(": ")[1] for line in caught.value.lines()] == ["ml-cluster:accountId"]


def test_the_offline_plan_can_say_what_a_real_run_would_refuse() -> None:
    assert placeholders_left(load_stack_file("dev")) == placeholder_problems(stack_values("dev"), deploying=True)
    assert placeholders_left(load_stack_file("onprem")) == []  # its secrets are never looked at
