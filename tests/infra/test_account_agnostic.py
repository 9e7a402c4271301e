"""The stack files name no account: run under another account, everything the stack derives follows it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra.plan.engine import Fixtures, plan_stack
from tests.conftest import AWS_STACKS, stack_values

REPO = Path(__file__).resolve().parents[2]
OTHER_ACCOUNT = "210987654321"
FILE_ACCOUNT = "111122223333"  # the committed fixtures' account


@pytest.mark.parametrize("stack", AWS_STACKS)
def test_buckets_images_and_policies_follow_the_callers_account(stack: str, tmp_path: Path) -> None:
    fixtures = tmp_path / "fixtures"
    shutil.copytree(REPO / "stacks" / "fixtures", fixtures)
    identity = json.loads((fixtures / "caller_identity.json").read_text())
    (fixtures / "caller_identity.json").write_text(json.dumps({**identity, "accountId": OTHER_ACCOUNT}))
    plan = plan_stack(stack, fixtures=Fixtures(fixtures))
    # Only what the user wrote may still name the file's account: access-entry principals and tenant teams'
    # members (their own roles).
    values = stack_values(stack)
    written = {entry["principalArn"] for entry in (values.get("ml-cluster:cluster") or {}).get("accessEntries", [])}
    written |= {member["principalArn"] for team in (values.get("ml-cluster:kueue") or {}).get("teams", [])
                for member in team.get("members", []) if "principalArn" in member}
    text = json.dumps(plan)
    for arn in written:
        text = text.replace(arn, "")
    assert FILE_ACCOUNT not in text
    buckets = [r["inputs"]["bucket"] for r in plan["resources"] if r["type"] == "aws:s3/bucket:Bucket"]
    assert buckets and all(name.endswith(f"-{OTHER_ACCOUNT}") for name in buckets)
    assert plan["outputs"]["imageRepository"].startswith(f"{OTHER_ACCOUNT}.dkr.ecr.")


def test_a_stack_that_pins_its_account_plans_as_that_account(tmp_path: Path) -> None:
    """A user's own stack (`make new-stack` pins ml-cluster:accountId): the offline plan's buckets, image repository
    and role ARNs carry that account, not the fixture's (the fixtures answer the data sources, not the identity)."""
    import yaml

    values = stack_values("dev")
    values["ml-cluster:accountId"] = OTHER_ACCOUNT
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": values}))
    plan = plan_stack("dev", path)
    buckets = [r["inputs"]["bucket"] for r in plan["resources"] if r["type"] == "aws:s3/bucket:Bucket"]
    assert buckets and all(OTHER_ACCOUNT in name for name in buckets), buckets
    written = ("aws:eks/accessEntry:AccessEntry", "aws:eks/accessPolicyAssociation:AccessPolicyAssociation")
    derived = json.dumps([r for r in plan["resources"] if r["type"] not in written])  # the file's own ARNs aside
    assert FILE_ACCOUNT not in derived


def test_an_unpinned_stack_naming_another_account_gets_one_note() -> None:
    from infra.plan.account import plan_account

    values = {"ml-cluster:cluster": {"accessEntries": [{"principalArn": f"arn:aws:iam::{OTHER_ACCOUNT}:role/a"}]}}
    account, note = plan_account(values, FILE_ACCOUNT)
    assert account == FILE_ACCOUNT and note is not None and OTHER_ACCOUNT in note and "ml-cluster:accountId" in note
    assert plan_account({}, FILE_ACCOUNT) == (FILE_ACCOUNT, None)
