"""FSx for Lustre config rules: each bad value is one problem naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import ConfigError, parse_stack_config
from infra.config.fsx import FsxLustreConfig, capacity_problem
from infra.config.stackcheck import fsx_zone_problems
from tests.conftest import stack_values
from tests.storage.test_config import problems

FSX: dict[str, Any] = {"storageCapacity": 2400, "perUnitStorageThroughput": 250, "availabilityZone": "us-east-1a",
                       "nodePools": ["gpu-h100"],
                       "dataRepositoryAssociations": [{"bucket": "checkpoints", "fileSystemPath": "/checkpoints",
                                                       "autoExport": ["NEW", "CHANGED", "DELETED"]}]}


def prod_storage(**fsx: Any) -> dict[str, Any]:
    storage = dict(stack_values("prod")["ml-cluster:storage"])
    storage["fsxLustre"] = {**FSX, **fsx}
    return storage


def prod_config(storage: dict[str, Any], pools: list[dict[str, Any]] | None = None) -> Any:
    values = stack_values("prod")
    values["ml-cluster:storage"] = storage
    if pools is not None:
        values["ml-cluster:nodePools"] = pools
    secrets = [key for key, value in values.items() if isinstance(value, dict) and set(value) == {"secure"}]
    return parse_stack_config({k: ("placeholder" if k in secrets else v) for k, v in values.items()}, secrets)


@pytest.mark.parametrize("gib", [1200, 2400, 4800, 96000])
def test_persistent_2_capacities_aws_allows(gib: int) -> None:
    assert capacity_problem(gib) is None


@pytest.mark.parametrize("gib", [1201, 1800, 3600, 6000])
def test_capacity_not_an_increment_is_one_line(gib: int) -> None:
    found = problems("prod", prod_storage(storageCapacity=gib))
    assert len(found) == 1 and found[0][0] == "storage.fsxLustre.storageCapacity", found
    assert f"{gib} GiB is not a PERSISTENT_2 capacity" in found[0][1]


def test_throughput_tier_not_offered_is_one_line() -> None:
    found = problems("prod", prod_storage(perUnitStorageThroughput=200))
    assert found == [("storage.fsxLustre.perUnitStorageThroughput",
                      "200 MB/s/TiB is not a PERSISTENT_2 throughput tier (offered: 125, 250, 500, 1000)")]


def test_association_to_a_bucket_not_in_the_stack_is_one_line() -> None:
    found = problems("prod", prod_storage(dataRepositoryAssociations=[{"bucket": "models", "fileSystemPath": "/m"}]))
    assert len(found) == 1 and "dataRepositoryAssociations[0].bucket: 'models' is not a bucket" in found[0][1]


def test_overlapping_association_paths_are_refused() -> None:
    dras = [{"bucket": "datasets", "fileSystemPath": "/data"}, {"bucket": "checkpoints", "fileSystemPath": "/data/c"}]
    found = problems("prod", prod_storage(dataRepositoryAssociations=dras))
    assert len(found) == 1 and "overlaps /data" in found[0][1]


def test_fsx_on_onprem_is_one_line() -> None:
    storage = dict(stack_values("onprem")["ml-cluster:storage"])
    storage["fsxLustre"] = {**FSX, "dataRepositoryAssociations": []}
    found = problems("onprem", storage)
    assert len(found) == 1 and "storage.fsxLustre: needs platform eks (is onprem)" in found[0][1], found


def test_a_pool_in_another_zone_using_it_is_one_problem() -> None:
    pools = [dict(pool) for pool in stack_values("prod")["ml-cluster:nodePools"]]
    pools[1]["availabilityZones"] = ["us-east-1b"]
    cfg = prod_config(prod_storage(), pools)
    found = fsx_zone_problems(cfg, ["us-east-1a", "us-east-1b"])
    assert found == [("ml-cluster:storage.fsxLustre.nodePools[0]",
                      "node pool gpu-h100 starts nodes in us-east-1b, the file system is in us-east-1a: set the "
                      "pool's availabilityZones: [us-east-1a]")]


def test_a_multi_zone_pool_using_it_and_an_unknown_pool_are_refused() -> None:
    cfg = prod_config(prod_storage(nodePools=["gpu-a100", "gpu-b200"]))
    found = fsx_zone_problems(cfg, ["us-east-1a", "us-east-1b"])
    assert [where for where, _ in found] == ["ml-cluster:storage.fsxLustre.nodePools[0]",
                                             "ml-cluster:storage.fsxLustre.nodePools[1]"]
    assert "starts nodes in us-east-1b" in found[0][1] and "'gpu-b200' is not a node pool" in found[1][1]


def test_a_zone_without_a_private_subnet_is_refused() -> None:
    cfg = prod_config(prod_storage(availabilityZone="us-east-1c", nodePools=["gpu-h100"]))
    found = fsx_zone_problems(cfg, ["us-east-1a", "us-east-1b"])
    assert found[0] == ("ml-cluster:storage.fsxLustre.availabilityZone",
                        "us-east-1c: the network has no private subnet there (its private subnets are in us-east-1a, "
                        "us-east-1b)")


def test_the_efa_pool_in_the_first_zone_fits() -> None:
    cfg = prod_config(prod_storage())
    assert fsx_zone_problems(cfg, ["us-east-1b", "us-east-1a"]) == []


def test_throughput_follows_capacity() -> None:
    fsx = FsxLustreConfig.model_validate({**FSX, "storageCapacity": 4800, "perUnitStorageThroughput": 500})
    assert fsx.throughput_mbps == 500 * 4800 // 1024 == 2343


def test_config_error_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        prod_config(prod_storage(storageCapacity=1000))
