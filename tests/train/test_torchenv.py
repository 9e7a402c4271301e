"""The one torchrun-environment reader, and the two places that build on it."""

from __future__ import annotations

import pytest

from workloads.data.api import Placement
from workloads.torchenv import TorchrunEnv, is_distributed, torchrun_env
from workloads.train.runtime import Distributed


def test_a_plain_run_is_rank_0_of_1() -> None:
    assert torchrun_env({}) == TorchrunEnv(0, 1, 0, 1) and not is_distributed({})


def test_torchruns_variables_and_the_one_node_default() -> None:
    assert torchrun_env({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}) == (5, 8, 1, 4)
    assert torchrun_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3"}).local_world_size == 4
    assert is_distributed({"WORLD_SIZE": "2"})


def test_a_value_that_is_no_integer_names_the_variables() -> None:
    with pytest.raises(ValueError, match="RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE: not integers"):
        torchrun_env({"WORLD_SIZE": "two"})


def test_the_data_api_and_the_trainer_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    placement, distributed = Placement.from_env(), Distributed.from_env()
    assert (placement.rank, placement.world_size, placement.local_rank, placement.local_world_size) == (6, 8, 2, 4)
    assert (distributed.rank, distributed.world_size, distributed.local_rank, distributed.local_world_size) == (
        6, 8, 2, 4)
    assert placement.nodes == distributed.nodes == 2
