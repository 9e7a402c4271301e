"""`ml-cluster:jobEgress`: open by default; restricted egress is planned as one NetworkPolicy, or refused up front."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra.config import ConfigError
from tests.conftest import resources_of

Plan = dict[str, Any]
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"


def _policies(plan: Plan) -> dict[str, dict[str, Any]]:
    return {r["inputs"]["metadata"]["name"]: r["inputs"] for r in resources_of(plan, POLICY)}


def test_egress_is_open_by_default(stack_plan: Callable[[str], Plan]) -> None:
    assert "restrict-egress" not in _policies(stack_plan("dev"))


def test_restricted_egress_is_one_policy_with_the_given_ranges(plan_config: Callable[..., Plan]) -> None:
    plan = plan_config("dev", {"ml-cluster:jobEgress": {"mode": "restricted", "allowCidrs": ["52.92.0.0/17"]}})
    policy = _policies(plan)["restrict-egress"]
    assert policy["metadata"]["namespace"] == "training"
    destinations = [peer.get("ipBlock", {}).get("cidr") for rule in policy["spec"]["egress"] for peer in rule["to"]]
    assert "52.92.0.0/17" in destinations and "169.254.170.23/32" in destinations


@pytest.mark.parametrize(("egress", "message"), [
    ({"mode": "restricted"}, r"jobEgress: .*mode restricted needs allowCidrs"),
    ({"mode": "restricted", "allowCidrs": ["10.0.0.1/8"]}, r"jobEgress\.allowCidrs: .*not a CIDR block"),
    ({"mode": "closed"}, r"jobEgress\.mode"),
])
def test_bad_egress_config_is_refused(egress: dict[str, Any], message: str, plan_config: Callable[..., Plan]) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_config("dev", {"ml-cluster:jobEgress": egress})
