"""An add-on left unpinned gets EKS's default for the cluster version: the plan asks EKS (getAddonVersion) for it
and refuses a default older than what the stack needs (Mountpoint for S3 below v2 has no Pod Identity)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from infra.config import ConfigError
from infra.plan.engine import Fixtures, plan_stack
from tests.conftest import stack_values

REPO = Path(__file__).resolve().parents[2]
MOUNTPOINT = "aws-mountpoint-s3-csi-driver"


def _fixtures_with_default(tmp_path: Path, version: str) -> Fixtures:
    directory = tmp_path / "fixtures"
    shutil.copytree(REPO / "stacks" / "fixtures", directory)
    defaults = json.loads((directory / "addon_versions.json").read_text())
    defaults[f"{MOUNTPOINT} 1.35"] = version
    (directory / "addon_versions.json").write_text(json.dumps(defaults))
    return Fixtures(directory)


def test_an_eks_default_below_the_minimum_is_a_config_error(tmp_path: Path) -> None:
    assert MOUNTPOINT not in (stack_values("dev").get("ml-cluster:storage") or {}).get("addonVersions", {})
    with pytest.raises(ConfigError) as caught:
        plan_stack("dev", fixtures=_fixtures_with_default(tmp_path, "v1.15.0-eksbuild.1"))
    message = str(caught.value)
    assert "ml-cluster:storage.addonVersions" in message and "v1.15.0-eksbuild.1" in message
    assert "Kubernetes 1.35" in message


def test_a_pin_makes_the_default_irrelevant(tmp_path: Path) -> None:
    document = {"config": {**stack_values("dev")}}
    storage = document["config"]["ml-cluster:storage"]
    storage["addonVersions"] = {**storage.get("addonVersions", {}), MOUNTPOINT: "v2.1.0-eksbuild.1"}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    plan = plan_stack("dev", path, fixtures=_fixtures_with_default(tmp_path, "v1.15.0-eksbuild.1"))
    addon, = [r for r in plan["resources"] if r["type"] == "aws:eks/addon:Addon"
              and r["inputs"]["addonName"] == MOUNTPOINT]
    assert addon["inputs"]["addonVersion"] == "v2.1.0-eksbuild.1"


def test_a_recent_default_plans_and_stays_unpinned(stack_plan) -> None:  # type: ignore[no-untyped-def]
    addon, = [r for r in stack_plan("dev")["resources"] if r["type"] == "aws:eks/addon:Addon"
              and r["inputs"]["addonName"] == MOUNTPOINT]
    assert "addonVersion" not in addon["inputs"]
