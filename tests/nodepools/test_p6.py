"""p6-b200 and p6-b300 as first-class EFA pool types: a stack with both plans (their interfaces, EFA counts,
memlock), costs and preflights offline; p6e-gb200 is refused with one line saying what is missing."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
import yaml

from infra.config import ConfigError
from infra.plan.cost import estimate, price_queries
from infra.plan.engine import STACKS_DIR
from infra.plan.prices import fixture_prices

P6_POOLS = [
    {"name": "gpu-b200", "instanceTypes": ["p6-b200.48xlarge"], "gpu": True, "efa": True, "maxSize": 2,
     "availabilityZones": ["us-east-1a"]},
    {"name": "gpu-b300", "instanceTypes": ["p6-b300.48xlarge"], "gpu": True, "efa": True, "maxSize": 2,
     "availabilityZones": ["us-east-1a"]},
]


def prod_pools(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    values = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())["config"]
    return [*values["ml-cluster:nodePools"], *extra]


@pytest.fixture(scope="module")
def p6_plan(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from infra.plan.engine import plan_stack

    document = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())
    document["config"]["ml-cluster:nodePools"] = prod_pools(*P6_POOLS)
    path = tmp_path_factory.mktemp("p6") / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(document))
    return plan_stack("prod", path)


def test_p6_pools_plan_with_their_efa_layout(p6_plan: dict[str, Any]) -> None:
    templates = {r["name"]: r["inputs"] for r in p6_plan["resources"]
                 if r["type"] == "aws:ec2/launchTemplate:LaunchTemplate"}
    b200 = templates["mlc-prod-nodepools-gpu-b200-lt"]["networkInterfaces"]
    b300 = templates["mlc-prod-nodepools-gpu-b300-lt"]["networkInterfaces"]
    layout = [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in b200]
    assert layout == [(0, 0, "interface"), (0, 1, "efa-only")] + [(card, 0, "efa-only") for card in range(1, 8)]
    layout = [(i["networkCardIndex"], i["deviceIndex"], i["interfaceType"]) for i in b300]
    assert layout == [(0, 0, "interface")] + [(card, 0, "efa-only") for card in range(1, 17)]
    tags = {r["inputs"]["tag"]["key"]: r["inputs"]["tag"]["value"] for r in p6_plan["resources"]
            if r["type"] == "aws:autoscaling/tag:Tag" and "gpu-b300" in r["name"]}
    assert tags["k8s.io/cluster-autoscaler/node-template/resources/vpc.amazonaws.com/efa"] == "16"
    groups = {r["name"]: r["inputs"] for r in p6_plan["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup"}
    assert groups["mlc-prod-nodepools-gpu-b200-ng"]["amiType"] == "AL2023_x86_64_NVIDIA"


def test_p6_pools_cost_from_the_price_fixture(p6_plan: dict[str, Any]) -> None:
    report = estimate(p6_plan, fixture_prices(price_queries(p6_plan)), "fixture", date(2026, 11, 26))
    text = "\n".join(str(line) for line in report.lines)
    assert "p6-b200.48xlarge" in text and "p6-b300.48xlarge" in text


def test_a_gb200_ultraserver_pool_is_refused_in_one_line(plan_config: Any) -> None:
    pool = {"name": "gpu-gb200", "instanceTypes": ["p6e-gb200.36xlarge"], "gpu": True, "maxSize": 2}
    with pytest.raises(ConfigError) as caught:
        plan_config("prod", {"ml-cluster:nodePools": prod_pools(pool)})
    [line] = caught.value.lines()
    assert "p6e-gb200.36xlarge (GB200 UltraServer) needs the ARM64 NVIDIA AMI, the NVIDIA DRA driver and IMEX" in line
    assert "nodePools[" in line
