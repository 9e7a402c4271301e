"""nodePools[].releaseVersion pins a node group's AMI release; an AL2023 release of another Kubernetes minor than
the cluster's, or one on existing nodes, is a config error naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config.schema import ConfigError
from tests.conftest import resources_of, stack_values


def _pools(**gpu_pool: Any) -> dict[str, Any]:
    pools = stack_values("dev")["ml-cluster:nodePools"]
    pools[1].update(gpu_pool)  # gpu-a10g
    return {"ml-cluster:nodePools": pools}


def _groups(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r["inputs"] for r in resources_of(plan, "aws:eks/nodeGroup:NodeGroup")}


def test_a_pinned_release_reaches_the_node_group_and_the_others_stay_unpinned(plan_config: Any) -> None:
    groups = _groups(plan_config("dev", _pools(releaseVersion="1.35.0-20251120")))
    assert groups["mlc-dev-nodepools-gpu-a10g-ng"]["releaseVersion"] == "1.35.0-20251120"
    assert "releaseVersion" not in groups["mlc-dev-nodepools-system-ng"]


def test_an_al2023_release_of_another_minor_is_refused(plan_config: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        plan_config("dev", _pools(releaseVersion="1.34.2-20251120"))
    assert ("ml-cluster:nodePools[1].releaseVersion",
            "node pool gpu-a10g: AL2023 release 1.34.2-20251120 is for Kubernetes 1.34, the cluster runs 1.35: pin "
            "a 1.35.x release (or remove releaseVersion)") in caught.value.shown()


def test_a_bottlerocket_release_has_its_own_numbering(plan_config: Any) -> None:
    groups = _groups(plan_config("dev", _pools(amiFamily="bottlerocket", releaseVersion="1.50.0-4c1b7c84")))
    assert groups["mlc-dev-nodepools-gpu-a10g-ng"]["releaseVersion"] == "1.50.0-4c1b7c84"


def test_existing_nodes_take_no_release(plan_config: Any) -> None:
    pools = stack_values("onprem")["ml-cluster:nodePools"]
    pools[0]["releaseVersion"] = "1.36.0-20251120"
    with pytest.raises(ConfigError) as caught:
        plan_config("onprem", {"ml-cluster:nodePools": pools})
    assert any(path.startswith("ml-cluster:nodePools[0]") and "releaseVersion is an EKS AMI release" in why
               for path, why in caught.value.shown()), caught.value.shown()
