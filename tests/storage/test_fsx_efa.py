"""An EFA-enabled FSx for Lustre file system: the provider argument, the all-traffic rules EFA needs on both
security groups, the EFA pools' Lustre client script, and the config rule that an EFA pool must mount it."""

from __future__ import annotations

import base64
import shutil
import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from infra.config.stackcheck import fsx_zone_problems
from infra.storage import fsx_boot_scripts
from infra.storage.firewall import SELF
from infra.storage.fsx import lustre_efa_client_script, lustre_rules
from tests.conftest import resources_of, stack_values
from tests.storage.test_fsx_config import prod_config, prod_storage

FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"


def test_efa_adds_all_traffic_to_and_from_the_nodes_and_itself() -> None:
    plain = lustre_rules(("nodes", SELF))
    efa = lustre_rules(("nodes", SELF), efa=True)
    added = [rule for rule in efa if rule not in plain]
    assert [(r.direction, r.peer, r.protocol) for r in added] == [
        ("ingress", "nodes", "-1"), ("egress", "nodes", "-1"), ("ingress", "self", "-1"), ("egress", "self", "-1")]
    assert all(r.protocol == "tcp" for r in plain) and len(plain) == 8


def test_the_client_script_picks_every_fourth_device_on_a_p5_and_is_valid_bash() -> None:
    p5 = lustre_efa_client_script(32)
    assert "awk 'NR % 4 == 1'" in p5 and "--peer-credits 32" in p5
    assert "lnetctl udsp add --src efa --priority 0" in p5 and "modprobe kefalnd ipif_name=" in p5
    assert "sed -n '1p;$p'" in lustre_efa_client_script(2)
    bash = shutil.which("bash")
    assert bash is not None
    subprocess.run([bash, "-n", "-c", p5], check=True)  # parses (nothing runs)


def test_only_efa_pools_that_mount_an_efa_file_system_get_the_script() -> None:
    pool = {name: SimpleNamespace(name=name, efa_interfaces=n, is_bottlerocket=br)
            for name, n, br in (("gpu-h100", 32, False), ("gpu-a100", 0, False), ("gpu-br", 32, True))}
    both = prod_config(prod_storage(efa=True, nodePools=["gpu-h100", "gpu-a100"])).storage
    assert set(fsx_boot_scripts(both, list(pool.values()))) == {"gpu-h100"}
    assert fsx_boot_scripts(prod_config(prod_storage()).storage, list(pool.values())) == {}


def test_efa_without_an_efa_pool_is_one_line() -> None:
    cfg = prod_config(prod_storage(efa=True, nodePools=["gpu-a100"]))
    found = fsx_zone_problems(cfg, ["us-east-1a"])
    assert ("ml-cluster:storage.fsxLustre.efa", "true, but none of nodePools (gpu-a100) is an EFA pool (efa: true): "
            "no client would reach the file system over EFA") in found
    assert not any(where.endswith(".efa") for where, _ in fsx_zone_problems(prod_config(prod_storage(efa=True)),
                                                                              ["us-east-1a"]))


@pytest.mark.slow
def test_prod_with_an_efa_file_system_plans(plan_config) -> None:  # type: ignore[no-untyped-def]
    storage: dict[str, Any] = dict(stack_values("prod")["ml-cluster:storage"])
    storage["fsxLustre"] = {**storage["fsxLustre"], "efa": True}
    plan = plan_config("prod", {"ml-cluster:storage": storage})
    [fs] = resources_of(plan, FS)
    assert fs["inputs"]["efaEnabled"] is True
    [group] = fs["inputs"]["securityGroupIds"]
    nodes = plan["outputs"]["storage"]["efs"]["nodeSecurityGroupId"]
    every = {(r["inputs"]["securityGroupId"], r["inputs"].get("referencedSecurityGroupId"), token)
             for token in (INGRESS, EGRESS) for r in resources_of(plan, token) if r["inputs"]["ipProtocol"] == "-1"}
    for pair in ((group, nodes), (group, group), (nodes, group)):
        assert {(*pair, INGRESS), (*pair, EGRESS)} <= every
    [template] = [r for r in resources_of(plan, "aws:ec2/launchTemplate:LaunchTemplate") if "gpu-h100" in r["name"]]
    assert "lnetctl net add --net efa" in base64.b64decode(template["inputs"]["userData"]).decode()
