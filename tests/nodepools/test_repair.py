"""Node auto repair on the managed node groups and the EKS node monitoring agent add-on that feeds it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from infra.config import ConfigError
from infra.nodes.gpu import node_monitoring_agent_values
from infra.nodes.poolplan import plan_node_pools
from infra.nodes.repair import ACCELERATED_OVERRIDES, node_repair_config
from infra.plan.engine import Fixtures, plan_stack
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool

REPO = Path(__file__).resolve().parents[2]
# aws/eks-node-monitoring-agent v1.7.0 (c399089dec), charts/configuration.schema.json: the add-on's
# configuration values are checked against it.
AGENT_SCHEMA = Path(__file__).parent / "upstream" / "eks-node-monitoring-agent-v1.7.0-configuration.schema.json"
# The agent's reason names for AcceleratedHardwareReady (pkg/reasons/reasons.yaml:285-378 at v1.7.0) and the XIDs
# that set the condition (monitors/nvidia/dcgm/dcgm_policies.go:98).
AGENT_REASONS = {"DCGMDiagnosticFailure", "DCGMError", "NvidiaDeviceCountMismatch", "NvidiaDoubleBitError",
                 "NvidiaNCCLError", "NvidiaNVLinkError", "NvidiaPCIeError", "NvidiaPageRetirement", "NvidiaPowerError",
                 "NvidiaThermalError", "FabricManagerNotRunning", "NvidiaFabricError"}
AGENT_V164_XIDS = {46, 48, 54, 62, 63, 64, 74, 79, 95, 109, 110, 119, 120, 140}


def _groups(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r["inputs"] for r in plan["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup"}


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_every_gpu_node_group_has_repair_on_and_the_agent_is_installed(stack_plan, stack: str) -> None:  # type: ignore[no-untyped-def]
    plan = stack_plan(stack)
    groups = _groups(plan)
    gpu = {name: inputs for name, inputs in groups.items() if "nvidia.com/gpu" in str(inputs.get("taints"))}
    assert gpu
    for name, inputs in groups.items():
        repair = inputs["nodeRepairConfig"]
        if name not in gpu:
            assert repair == {"enabled": False}, name
            continue
        assert repair["enabled"] is True
        assert 1 <= repair["maxParallelNodesRepairedCount"] <= repair["maxUnhealthyNodeThresholdCount"]
        # a fleet-wide fault must not replace the pool: repair stops well below its size
        assert repair["maxUnhealthyNodeThresholdCount"] <= max(1, -(-inputs["scalingConfig"]["maxSize"] // 5))
        overrides = repair["nodeRepairConfigOverrides"]
        assert {o["nodeMonitoringCondition"] for o in overrides} == {"AcceleratedHardwareReady"}
        assert {o["repairAction"] for o in overrides} <= {"Replace", "Reboot", "NoAction"}
        assert all(o["minRepairWaitTimeMins"] >= 1 for o in overrides)
    addon, = [r["inputs"] for r in plan["resources"] if r["type"] == "aws:eks/addon:Addon"
              and r["inputs"]["addonName"] == "eks-node-monitoring-agent"]
    jsonschema.validate(json.loads(addon["configurationValues"]), json.loads(AGENT_SCHEMA.read_text()))


def test_override_reasons_are_the_agents_own_names() -> None:
    for override in ACCELERATED_OVERRIDES:
        match = re.fullmatch(r"NvidiaXID(\d+)Error", override.reason)
        if match:
            assert int(match.group(1)) in AGENT_V164_XIDS, override.reason
        else:
            assert override.reason in AGENT_REASONS, override.reason
    reasons = [override.reason for override in ACCELERATED_OVERRIDES]
    assert len(reasons) == len(set(reasons))
    hardware = {"NvidiaXID79Error", "NvidiaXID48Error", "NvidiaXID74Error", "NvidiaXID95Error",
                "NvidiaDeviceCountMismatch"}
    assert all(o.action == "Replace" for o in ACCELERATED_OVERRIDES if o.reason in hardware)


def test_repair_is_configurable_per_pool() -> None:
    gpu_off, cpu_on, gpu_plain = plan_node_pools(eks_config([
        gpu_pool("a", nodeRepair={"enabled": False}),
        {"name": "cpu", "instanceTypes": ["m6i.large"], "maxSize": 20, "nodeRepair": {"enabled": True}},
        gpu_pool("b", maxSize=40, nodeRepair={"maxParallel": 3, "gpuOverrides": False}),
    ]), fixture_lookup)
    assert node_repair_config(gpu_off) == {"enabled": False}
    assert node_repair_config(cpu_on) == {"enabled": True, "max_parallel_nodes_repaired_count": 1,
                                          "max_unhealthy_node_threshold_count": 4}
    assert node_repair_config(gpu_plain) == {"enabled": True, "max_parallel_nodes_repaired_count": 3,
                                             "max_unhealthy_node_threshold_count": 8}


def test_parallel_repairs_never_exceed_the_unhealthy_limit() -> None:
    [plan] = plan_node_pools(eks_config([gpu_pool(nodeRepair={"maxParallel": 5, "maxUnhealthy": 2})]), fixture_lookup)
    config = node_repair_config(plan)
    assert config["max_parallel_nodes_repaired_count"] == 2 and config["max_unhealthy_node_threshold_count"] == 2


def test_existing_nodes_cannot_ask_for_eks_repair() -> None:
    with pytest.raises(ConfigError, match="nodeRepair"):
        eks_config([{"name": "lab", "gpu": True, "nodeRepair": {"enabled": True},
                     "existing": {"nodes": ["n1"], "vcpus": 8, "memory": "64Gi", "gpuType": "a100",
                                  "gpusPerNode": 1}}])


def test_the_agents_dcgm_daemonset_tolerates_the_gpu_taint() -> None:
    plans = plan_node_pools(eks_config([gpu_pool(taints=[{"key": "team", "value": "a", "effect": "NO_EXECUTE"}])]),
                            fixture_lookup)
    values = node_monitoring_agent_values(plans)
    jsonschema.validate(values, json.loads(AGENT_SCHEMA.read_text()))
    tolerated = {(t["key"], t["effect"]) for t in values["dcgmAgent"]["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("team", "NoExecute")} <= tolerated


def test_an_agent_default_older_than_the_overrides_is_a_config_error(tmp_path: Path) -> None:
    directory = tmp_path / "fixtures"
    shutil.copytree(REPO / "stacks" / "fixtures", directory)
    defaults = json.loads((directory / "addon_versions.json").read_text())
    defaults["eks-node-monitoring-agent 1.35"] = "v1.6.3-eksbuild.1"
    (directory / "addon_versions.json").write_text(json.dumps(defaults))
    with pytest.raises(ConfigError) as caught:
        plan_stack("dev", fixtures=Fixtures(directory))
    assert "eks-node-monitoring-agent" in str(caught.value) and "v1.6.4" in str(caught.value)
