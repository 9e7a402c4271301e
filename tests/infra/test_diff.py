"""Issue 12: `--diff` shows old -> new for every changed leaf, marks replacements as `pulumi preview` does (+-),
keeps secrets masked, and calls out replacements and removals of protected resources."""

from __future__ import annotations

import copy
import json
from typing import Any

from infra.plan.engine import SECRET_MARK
from infra.plan.view import diff, forces_replacement, format_diff


def _one(plan: dict[str, Any], token: str, suffix: str = "") -> dict[str, Any]:
    (found,) = [r for r in plan["resources"] if r["type"] == token and r["name"].endswith(suffix)]
    return found


def test_node_group_growth_is_an_update_with_values_and_new_instance_types_a_replacement(stack_plan: Any) -> None:
    new = stack_plan("dev")
    old = copy.deepcopy(new)
    group = _one(old, "aws:eks/nodeGroup:NodeGroup", "gpu-a10g-ng")
    group["inputs"]["scalingConfig"]["maxSize"] = 1
    changes = diff(old, new)
    (item,) = changes["changed"]
    assert item["op"] == "update" and item["changes"] == [
        {"path": "inputs.scalingConfig.maxSize", "old": 1, "new": 2, "replace": False}]
    assert "~ aws:eks/nodeGroup:NodeGroup" in format_diff(changes)
    assert "    inputs.scalingConfig.maxSize: 1 -> 2\n" in format_diff(changes)

    group["inputs"]["instanceTypes"] = ["g5.2xlarge"]
    text = format_diff(diff(old, new))
    assert "+- aws:eks/nodeGroup:NodeGroup  mlc-dev-nodepools-gpu-a10g-ng  [replace]" in text
    assert 'inputs.instanceTypes[0]: "g5.2xlarge" -> "g5.xlarge"  (forces replacement)' in text
    assert "1 to replace" in text


def test_job_template_change_replaces_and_options_only_update(stack_plan: Any) -> None:
    new = stack_plan("dev")
    old = copy.deepcopy(new)
    job = _one(old, "kubernetes:batch/v1:Job", "resnet50-s3-copy")
    job["inputs"]["spec"]["template"]["spec"]["containers"][0]["image"] = "old:1"
    job["options"]["ignoreChanges"] = []
    (item,) = diff(old, new)["changed"]
    assert item["op"] == "replace"
    by_path = {change["path"]: change for change in item["changes"]}
    assert by_path["inputs.spec.template.spec.containers[0].image"]["replace"] is True
    assert by_path["options.ignoreChanges"] == {
        "path": "options.ignoreChanges", "old": [],
        "new": ["spec.suspend", 'metadata.labels["kueue.x-k8s.io/queue-name"]'], "replace": False}


def test_secrets_stay_masked(stack_plan: Any) -> None:
    new = stack_plan("onprem")
    old = copy.deepcopy(new)
    secret = next(r for r in old["resources"] if r["type"] == "kubernetes:core/v1:Secret")
    secret["inputs"]["stringData"]["EXTRA"] = "plain"
    text = format_diff(diff(old, new))
    assert '"plain" -> (none)' in text
    assert all(SECRET_MARK in line or "->" not in line or "plain" in line for line in text.splitlines()
               if "stringData" in line)
    assert "offline-placeholder-secret" not in json.dumps(diff(old, new))


def test_protected_replacement_is_flagged_loudly(stack_plan: Any) -> None:
    new = stack_plan("prod")
    old = copy.deepcopy(new)
    bucket = next(r for r in old["resources"] if r["type"] == "aws:s3/bucket:Bucket")
    assert bucket["options"]["protect"]
    bucket["inputs"]["bucket"] = "some-other-name"
    text = format_diff(diff(old, new))
    assert text.splitlines()[1].startswith("!! 1 PROTECTED resource(s) would be replaced")
    assert f"+- aws:s3/bucket:Bucket  {bucket['name']}  [replace]  [PROTECTED]" in text
    removed = copy.deepcopy(new)
    removed["resources"] = [r for r in removed["resources"] if r["name"] != bucket["name"]]
    assert "[PROTECTED]" in format_diff(diff(new, removed)).splitlines()[-1]


def test_force_new_rules() -> None:
    assert forces_replacement("aws:efs/fileSystem:FileSystem", "inputs.performanceMode")
    assert not forces_replacement("aws:efs/fileSystem:FileSystem", "inputs.throughputMode")
    assert forces_replacement("aws:eks/nodeGroup:NodeGroup", "inputs.subnetIds[1]")
    assert not forces_replacement("aws:eks/nodeGroup:NodeGroup", "inputs.scalingConfig.desiredSize")
    assert forces_replacement("kubernetes:core/v1:ConfigMap", "inputs.metadata.name")
    assert not forces_replacement("aws:s3/bucket:Bucket", "options.protect")
