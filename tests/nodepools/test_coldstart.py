"""The cold-start budget per GPU pool and the check that Kueue's gang timeout covers it: prod's p5 pool with a
15-minute timeout, a 15-minute burn-in and a 10 GB image is a config error naming the numbers; a longer timeout or
parallel pull makes it plan; the plan summary's table is the hand computation below."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.config.schema import parse_stack_config
from infra.nodes.coldstart import ColdStart, cold_starts, timeout_problems
from infra.nodes.poolplan import plan_node_pools
from infra.plan.engine import STACKS_DIR
from infra.plan.view import coldstart_lines
from infra.topology import gpu_topologies
from tests.nodepools.helpers import fixture_lookup

GB = 1_000_000_000


def prod(timeout: str = "15m", parallel: bool = False, topology: bool = False, **cold: Any) -> dict[str, Any]:
    """prod's stack values with the cold-start inputs of the test (Kueue's topology off unless asked: the timeout
    then covers the whole cold start)."""
    values = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())["config"]
    values["ml-cluster:kueue"] = {**values["ml-cluster:kueue"], "topology": {"enabled": topology},
                                  "waitForPodsReady": {"timeout": timeout}}
    values["ml-cluster:nodes"] = {**values["ml-cluster:nodes"], "imagePull": {"parallel": parallel},
                                  "coldStart": {"burnInMinutes": 15, "imageSize": "10G", **cold}}
    return values


def budgets(values: dict[str, Any]) -> tuple[list[ColdStart], str]:
    cfg = parse_stack_config(values)
    plans = plan_node_pools(cfg, fixture_lookup)
    found = cold_starts(plans, cfg.nodes.cold_start, cfg.nodes.image_pull.parallel, cfg.gpu.health,
                        cfg.gpu.health.runs(cfg.protected), gpu_topologies(cfg.kueue, plans))
    return found, cfg.kueue.wait_for_pods_ready.timeout


def test_a_p5_gang_that_cannot_start_in_the_timeout_is_a_config_error_with_the_numbers() -> None:
    found, timeout = budgets(prod())
    problems = timeout_problems(timeout, found)
    # by hand: boot 10 min (p5, the stated assumption) + burn-in 15 + (10 GB + 1 GB DCGM) / 96.4 MB/s = 114.1 s
    # = 1.9 min + first shard 1 = 27.9 min, for both GPU pools' shapes (p4d boots in 8: 25.9)
    h100 = next(p for p in problems if "pool gpu-h100" in p)
    assert h100.startswith("15m (15 min) is below the cold-start budget of pool "
                           "gpu-h100: boot 10.0 min (p5.48xlarge) + burn-in 15.0 min + image pull 1.9 min (11.0 GB "
                           "at 96.4 MB/s, serial) + first shard 1.0 min = 27.9 min")
    assert "at least 28m" in h100
    assert any("pool gpu-a100: boot 8.0 min (p4d.24xlarge)" in p for p in problems)
    # a timeout that covers it plans
    assert timeout_problems(*reversed(budgets(prod("28m")))) == []
    # parallel pull on AL2023: 11 GB / 180 MB/s = 61.1 s: 600 + 900 + 61.1 + 60 = 1621.1 s, so a 1650 s timeout
    # plans with it, where serial (1674.1 s) did not
    assert timeout_problems(*reversed(budgets(prod("1650s")))) != []
    assert timeout_problems(*reversed(budgets(prod("1650s", parallel=True)))) == []


def test_on_a_topology_flavor_the_timeout_starts_after_the_nodes_are_ready() -> None:
    found, _ = budgets(prod(topology=True))
    h100 = next(b for b in found if b.pool == "gpu-h100")
    assert h100.after_admission and h100.total_s == pytest.approx(27.9 * 60, abs=6)
    # only the training image's pull (10 GB / 96.4 MB/s = 103.7 s) and the first shard (60 s) are timed
    assert h100.timed_s == pytest.approx(10 * GB / 96.4e6 + 60)
    assert next(b for b in found if b.pool == "gpu-a100").timed_s == pytest.approx(25.9 * 60, abs=6)


def test_the_plan_summary_table_is_the_hand_computation() -> None:
    found, timeout = budgets(prod("30m", parallel=True))
    lines = coldstart_lines({"outputs": {"coldStart": {"timeout": timeout, "pools": [b.row() for b in found]}}})
    assert lines[1] == "cold start (kueue.waitForPodsReady.timeout 30m; minutes):"
    h100 = next(line for line in lines if line.lstrip().startswith("gpu-h100"))
    # 10 + 15 + 11 GB / 180 MB/s (1.0) + 1 = 27.0 <= 30
    assert h100.split() == ["gpu-h100", "p5.48xlarge", "10.0", "15.0", "1.0", "(11.0", "GB", "@", "180.0",
                            "MB/s,", "parallel)", "1.0", "27.0", "27.0", "ok"]


def test_the_burn_in_follows_the_checks_the_pool_runs() -> None:
    values = prod("1h")
    values["ml-cluster:nodes"]["coldStart"].pop("burnInMinutes")
    found, _ = budgets(values)
    # DCGM level 2 (300 s) + the GPU check (60 s) + EFA (30 s, the p5 pool only)
    assert {b.pool: b.burn_in_s for b in found} == {"gpu-h100": 390, "gpu-a100": 360}
    values["ml-cluster:gpu"]["health"] = {**values["ml-cluster:gpu"]["health"], "enabled": False}
    found, _ = budgets(values)
    assert {b.burn_in_s for b in found} == {0} and {b.dcgm_bytes for b in found} == {0}


def test_every_al2023_and_bottlerocket_gpu_pool_pulls_in_parallel() -> None:
    import email
    import tomllib

    from infra.nodes.nodepools import user_data
    from tests.nodepools.helpers import eks_config, gpu_pool

    plans = {plan.name: plan for plan in plan_node_pools(eks_config([
        {"name": "system", "instanceTypes": ["m6i.large"]},
        gpu_pool("al2023", ["g5.xlarge"]),
        gpu_pool("rocket", ["g5.xlarge"], amiFamily="bottlerocket"),
        gpu_pool("efa", ["p5.48xlarge"], efa=True, availabilityZones=["us-west-2a"]),
    ]), fixture_lookup)}
    for name in ("al2023", "efa"):
        parts = email.message_from_string(user_data(plans[name], parallel_pull=True) or "").get_payload()
        nodeconfigs = [yaml.safe_load(part.get_payload()) for part in parts
                       if part.get_content_type() == "application/node.eks.aws"]
        # nodeadm's documented gate (amazon-eks-ami v20260724 nodeadm/doc/examples.md: featureGates.FastImagePull)
        assert {"apiVersion": "node.eks.aws/v1alpha1", "kind": "NodeConfig",
                "spec": {"featureGates": {"FastImagePull": True}}} in nodeconfigs, name
    settings = tomllib.loads(user_data(plans["rocket"], parallel_pull=True) or "")["settings"]
    assert settings["container-runtime"] == {"snapshotter": "soci"}
    soci = settings["container-runtime-plugins"]["soci-snapshotter"]
    assert soci["pull-mode"] == "parallel-pull-unpack"
    assert soci["parallel-pull-unpack"]["max-concurrent-downloads-per-image"] == 20
    assert "ephemeral-storage" in str(settings["bootstrap-commands"])  # the NVMe RAID0 stays
    assert user_data(plans["system"], parallel_pull=True) is None  # CPU pools: the AMI's defaults
    assert "FastImagePull" not in (user_data(plans["al2023"]) or "")  # off: as before
