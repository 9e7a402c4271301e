"""Every stack in stacks/, planned offline, passes the whole policy pack (advisories are allowed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra.plan import engine
from infra.policy.plan import plan_from_document
from infra.policy.rules import PolicyContext, evaluate
from infra.policy.stackfile import stack_file_path, stack_protected
from tests.conftest import STACKS


def with_mock_ids(document: dict[str, Any]) -> dict[str, Any]:
    """Add the ids the offline engine assigned, so a resource's input holding another's id (a bucket policy's
    `bucket`, say) is read as a reference to it, as CrossGuard sees through property dependencies."""
    if any("propertyDependencies" in r or "id" in r for r in document["resources"]):
        return document
    resources = [{**r, "id": engine.offline_id(r["type"], r["name"])} for r in document["resources"]]
    return {**document, "resources": resources}


@pytest.mark.parametrize("stack", STACKS)
def test_stack_passes_every_mandatory_policy(stack: str, stack_plan: Callable[[str], dict[str, Any]]) -> None:
    ctx = PolicyContext(stack_protected=stack_protected(stack_file_path(engine.STACKS_DIR, stack)))
    found = evaluate(plan_from_document(with_mock_ids(stack_plan(stack))), ctx)
    mandatory = [str(v) for v in found if v.enforcement == "mandatory"]
    assert mandatory == [], "\n".join(mandatory)


def test_prod_is_the_protected_stack() -> None:
    # The protected-stack rules only bite where a stack file says so; prod must.
    assert stack_protected(stack_file_path(engine.STACKS_DIR, "prod")) is True
    assert stack_protected(stack_file_path(engine.STACKS_DIR, "dev")) is False


def test_the_bucket_joins_are_real_on_a_planned_stack(stack_plan: Callable[[str], dict[str, Any]]) -> None:
    # Guard against a vacuous pass: drop dev's public access blocks and the pack must name every bucket.
    document = stack_plan("dev")
    buckets = {r["name"] for r in document["resources"] if r["type"] == "aws:s3/bucket:Bucket"}
    assert buckets, "dev plans no buckets"
    kept = [r for r in document["resources"] if r["type"] != "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"]
    found = evaluate(plan_from_document(with_mock_ids({**document, "resources": kept})), PolicyContext())
    flagged = {v.resource.name for v in found if v.policy == "s3-bucket-public-access-blocked" and v.resource}
    assert flagged == buckets
