"""Node scaling's config section (`ml-cluster:nodes`): the autoscaler and sizing settings of every pool, and the old
spellings under `ml-cluster:gpu`, still read with a note."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from infra.config import ConfigError, parse_stack_config
from infra.config.nodes import renamed_key_notes
from infra.nodes.poolplan import plan_node_pools
from tests.conftest import stack_values
from tests.nodepools.helpers import eks_config, fixture_lookup, gpu_pool

AUTOSCALER = {"chartVersion": "9.59.0", "expander": "most-pods", "scaleDownUnneededTime": "20m"}
SIZING = {"systemReservedCpu": "1500m", "systemReservedMemory": "3Gi"}


def _raw(**sections: dict[str, Any]) -> dict[str, Any]:
    values = stack_values("dev")
    values.pop("ml-cluster:nodes", None)
    gpu = {key: value for key, value in values["ml-cluster:gpu"].items() if key not in ("autoscaler", "sizing")}
    values["ml-cluster:gpu"] = {**gpu, **sections.get("gpu", {})}
    if "nodes" in sections:
        values["ml-cluster:nodes"] = sections["nodes"]
    return values


def test_the_old_spellings_read_as_the_new_section() -> None:
    new = parse_stack_config(_raw(nodes={"autoscaler": AUTOSCALER, "sizing": SIZING}))
    old = parse_stack_config(_raw(gpu={"autoscaler": AUTOSCALER, "sizing": SIZING}))
    assert new.nodes == old.nodes
    assert (new.nodes.autoscaler.expander, new.nodes.sizing.system_reserved_cpu) == ("most-pods", "1500m")
    assert "autoscaler" not in type(old.gpu).model_fields and "sizing" not in type(old.gpu).model_fields


def test_sizing_under_either_spelling_sizes_every_pool_alike() -> None:
    pools = [gpu_pool(), {"name": "system", "instanceTypes": ["m6i.large"]}]
    old = plan_node_pools(eks_config(pools, {"sizing": SIZING}), fixture_lookup)
    new_config = parse_stack_config({**_raw(nodes={"sizing": SIZING}), "ml-cluster:nodePools": pools})
    new = plan_node_pools(new_config, fixture_lookup)
    assert [(p.cpu_per_gpu_millicores, p.memory_per_gpu_bytes) for p in old] == \
        [(p.cpu_per_gpu_millicores, p.memory_per_gpu_bytes) for p in new]


def test_one_setting_under_both_spellings_is_an_error_naming_both() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(_raw(gpu={"autoscaler": AUTOSCALER}, nodes={"autoscaler": {"enabled": False}}))
    text = str(caught.value)
    assert "gpu.autoscaler and nodes.autoscaler are one setting" in text and "remove gpu.autoscaler" in text


def test_a_bad_value_is_refused_under_the_spelling_the_file_used() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(_raw(gpu={"autoscaler": {"expander": "cheapest"}}))
    assert [path for path, _ in caught.value.shown()] == ["ml-cluster:gpu.autoscaler.expander"]
    with pytest.raises(ConfigError) as caught:
        parse_stack_config(_raw(nodes={"autoscaler": {"expander": "cheapest"}}))
    assert [path for path, _ in caught.value.shown()] == ["ml-cluster:nodes.autoscaler.expander"]


def test_notes_name_each_old_spelling_and_its_new_key() -> None:
    assert renamed_key_notes(_raw(nodes={"autoscaler": AUTOSCALER, "sizing": SIZING})) == []
    notes = renamed_key_notes(_raw(gpu={"autoscaler": AUTOSCALER, "sizing": SIZING}))
    assert notes == [
        "ml-cluster:gpu.autoscaler is now ml-cluster:nodes.autoscaler (it applies to every node pool); the old key "
        "still works: move it to the new one",
        "ml-cluster:gpu.sizing is now ml-cluster:nodes.sizing (it applies to every node pool); the old key still "
        "works: move it to the new one",
    ]


def test_a_stack_file_with_the_old_spelling_plans_the_same_and_says_so(
        plan_config: Callable[..., dict[str, Any]], stack_plan: Callable[[str], dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    values = stack_values("dev")
    old_gpu = {**values["ml-cluster:gpu"], **values["ml-cluster:nodes"]}
    plan = plan_config("dev", {"ml-cluster:nodes": None, "ml-cluster:gpu": old_gpu})
    assert "note: ml-cluster:gpu.autoscaler is now ml-cluster:nodes.autoscaler" in capsys.readouterr().err
    assert plan == stack_plan("dev")
