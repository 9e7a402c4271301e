"""The checkpointer's cached staging for a state on the GPU (workloads/train/pinned.py), on a machine without one:
a test double makes torch's cache of plain CPU tensors instead of pinned ones (pinning needs CUDA) and says the
state is on the GPU; everything else is the real DCP path. One process, no process group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.staging as staging
from torch import nn

import workloads.train.sharded as sharded
from workloads.train.pinned import CachedStagingWriter, holds_cuda, layout_change
from workloads.train.sharded import ShardedCheckpointer, TrainingState, load_whole
from workloads.train.tiers import MANIFEST, step_dir_name

pytestmark = pytest.mark.skipif(dist.is_available() and dist.is_initialized(),
                                reason="needs a process without a process group")


@pytest.fixture
def pinned_double(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every creation of torch's staged cache, with the pin_memory it was asked for (made unpinned here)."""
    real = staging._create_cpu_state_dict
    made: list[bool] = []

    def unpinned(state_dict: dict[str, Any], pin_memory: bool = False, share_memory: bool = False) -> dict[str, Any]:
        made.append(pin_memory)
        return real(state_dict, pin_memory=False, share_memory=share_memory)

    monkeypatch.setattr(staging, "_create_cpu_state_dict", unpinned)
    monkeypatch.setattr(sharded, "wants_cached_staging", lambda state: True)
    return made


def _state() -> TrainingState:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer)
    return TrainingState(model, optimizer)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.ones(1, 4)).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def _buffers(value: Any, path: str = "") -> dict[str, int]:
    """The data pointer of every tensor in a nested state dict, by path."""
    if isinstance(value, torch.Tensor):
        return {path: value.data_ptr()}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    out: dict[str, int] = {}
    for key, item in items:
        out.update(_buffers(item, f"{path}.{key}"))
    return out


def _saved(ckpt: ShardedCheckpointer, step: int) -> dict[str, Any]:
    assert (ckpt.local / step_dir_name(step) / MANIFEST).exists()
    return load_whole(ckpt.local / step_dir_name(step))


def test_a_state_on_the_gpu_keeps_one_writer_and_its_staged_copy_across_saves(tmp_path: Path,
                                                                                pinned_double: list[bool]) -> None:
    state, lines = _state(), []
    ckpt = ShardedCheckpointer(tmp_path / "local", None, keep=5, log=lines.append)
    weight_1 = state.model.weight.detach().clone()
    assert ckpt.save(state, 1).error is None and ckpt.wait().complete
    writer = ckpt._writer
    assert isinstance(writer, CachedStagingWriter) and writer.state_dict_cache is not None
    first = _buffers(writer.state_dict_cache)
    assert len(first) >= 5  # weight, bias, their momenta, the rng state
    _train(state.model, state.optimizer)
    assert ckpt.save(state, 2).error is None and ckpt.wait().complete
    assert ckpt._writer is writer and _buffers(writer.state_dict_cache) == first  # the same host buffers
    assert pinned_double == [True] and writer.restaged == 0 and lines == []  # made once, asked pinned
    # each save went to its own folder (reset(checkpoint_id)), with that step's weights
    assert torch.equal(_saved(ckpt, 1)["model"]["weight"], weight_1)
    second = _saved(ckpt, 2)
    assert not torch.equal(weight_1, state.model.weight)
    assert torch.equal(second["model"]["weight"], state.model.weight.detach())
    momentum = state.optimizer.state[state.model.weight]["momentum_buffer"]
    assert torch.equal(second["optim"]["state"]["weight"]["momentum_buffer"], momentum)
    ckpt.close()
    assert ckpt._writer is None


def test_a_param_group_added_between_saves_restages_once_and_saves(tmp_path: Path, pinned_double: list[bool]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model[1].parameters(), lr=0.1, momentum=0.9)  # the first layer frozen at first
    state, lines = TrainingState(model, optimizer), []
    _train(model, optimizer)
    ckpt = ShardedCheckpointer(tmp_path / "local", None, keep=5, log=lines.append)
    assert ckpt.save(state, 1).error is None and ckpt.wait().complete
    optimizer.add_param_group({"params": list(model[0].parameters())})  # unfrozen: more optimizer state, groups
    _train(model, optimizer)
    assert ckpt.save(state, 2).error is None and ckpt.wait().complete  # torch's CompanionMismatch, caught
    writer = ckpt._writer
    assert writer is not None and writer.restaged == 1 and pinned_double == [True, True]
    assert len(lines) == 1 and "layout changed" in lines[0] and "allocated afresh" in lines[0]
    saved = _saved(ckpt, 2)
    assert len(saved["optim"]["param_groups"]) == 2
    assert torch.equal(saved["optim"]["state"]["0.weight"]["momentum_buffer"],
                       optimizer.state[model[0].weight]["momentum_buffer"])
    assert "0.weight" not in _saved(ckpt, 1)["optim"]["state"]
    after = _buffers(writer.state_dict_cache)
    _train(model, optimizer)
    assert ckpt.save(state, 3).error is None and ckpt.wait().complete  # the same layout again: reused
    assert writer.restaged == 1 and _buffers(writer.state_dict_cache) == after and len(lines) == 1
    assert torch.equal(_saved(ckpt, 3)["model"]["0.weight"], model[0].weight.detach())


def test_a_tensor_of_another_shape_or_a_list_of_another_length_is_staged_afresh(
        tmp_path: Path, pinned_double: list[bool]) -> None:
    lines: list[str] = []
    ckpt = ShardedCheckpointer(tmp_path / "local", None, keep=5, log=lines.append)
    ckpt.save({"buf": torch.arange(4.0), "order": [3, 1, 2]}, 1)
    ckpt.wait()
    # [7.] into the cached [4] would broadcast silently ([7, 7, 7, 7] saved): the shape is checked first
    assert ckpt.save({"buf": torch.tensor([7.0]), "order": [3, 1, 2]}, 2).error is None and ckpt.wait().complete
    assert "state.buf: float32[4] -> float32[1]" in lines[-1]
    assert torch.equal(_saved(ckpt, 2)["buf"], torch.tensor([7.0]))
    assert ckpt.save({"buf": torch.tensor([8.0]), "order": [2, 1]}, 3).error is None and ckpt.wait().complete
    assert len(lines) == 2 and ckpt._writer is not None and ckpt._writer.restaged == 2
    saved = _saved(ckpt, 3)
    assert torch.equal(saved["buf"], torch.tensor([8.0])) and list(saved["order"]) == [2, 1]


def test_layout_change_names_what_torch_would_not_catch() -> None:
    assert layout_change({"a": torch.zeros(2)}, {"a": torch.zeros(2)}) is None
    assert layout_change({"a": torch.zeros(2)}, {"a": None}) == "state.a: a tensor where the cached copy holds NoneType"
    assert layout_change({"a": [torch.zeros(2, dtype=torch.int64)]}, {"a": [torch.zeros(2)]}) == (
        "state.a[0]: float32[2] -> int64[2]")
    assert layout_change({"a": 1, "b": torch.zeros(1)}, {"b": torch.zeros(1)}) is None  # keys: torch's to check


def test_a_state_on_the_cpu_gets_a_writer_of_its_own_per_save_as_before(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    real = dcp.FileSystemWriter

    def spy(*args: Any, **kwargs: Any) -> dcp.FileSystemWriter:
        made.append({"args": args, **kwargs})
        return real(*args, **kwargs)

    monkeypatch.setattr(sharded.dcp, "FileSystemWriter", spy)
    state = _state()
    assert not holds_cuda(state) and not holds_cuda(state.model.state_dict())
    ckpt = ShardedCheckpointer(tmp_path / "local", None, keep=5, log=lambda line: None)
    for step in (1, 2):
        assert ckpt.save(state, step).error is None and ckpt.wait().complete
    assert ckpt._writer is None
    assert made == [{"args": (ckpt.local / step_dir_name(step),), "sync_files": True} for step in (1, 2)]
