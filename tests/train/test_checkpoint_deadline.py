"""Every wait of the checkpointer has a deadline: wait() on a save that never finishes raises CheckpointTimeout (one
line naming the step) after the checkpointer's timeout_s or the caller's, its process groups carry the same timeout
(busy()'s all-reduce and the background gather), the trainer gives them --collective-timeout, a stop waits no
longer than what is left of its grace period, and a save that never finished exits with the disruption code."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.train.heldtier import HeldTier
from workloads.train.sharded import ShardedCheckpointer, TrainingState
from workloads.train.tiers import CheckpointTimeout

pytestmark = pytest.mark.skipif(dist.is_available() and dist.is_initialized(),
                                reason="needs a process without a process group")


def _state() -> TrainingState:
    model = nn.Linear(4, 2)
    return TrainingState(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_save_that_never_finishes_ends_the_wait_at_its_deadline(tmp_path: Path) -> None:
    tier = HeldTier(tmp_path / "remote")
    ckpt = ShardedCheckpointer(tmp_path / "local", tier, log=lambda line: None, timeout_s=0.3)
    try:
        report = ckpt.save(_state(), 5, meta={})
        with pytest.raises(CheckpointTimeout, match=r"^checkpoint: step 5 still not written after 0\.3 s .*the "
                                                    r"previous complete checkpoint stands$"):
            ckpt.wait()  # the checkpointer's own deadline
        with pytest.raises(CheckpointTimeout, match="after 0.05 s"):
            ckpt.wait(timeout_s=0.05)  # a stop's shorter one
        assert ckpt.in_flight == 5 and not report.complete  # each deadline named above ended its wait
    finally:
        tier.release.set()
    assert ckpt.wait() is report and report.complete  # still in flight, not abandoned: a later wait sees it end


def test_the_checkpointer_groups_carry_its_timeout(tmp_path: Path) -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ckpt = ShardedCheckpointer(tmp_path / "local", log=lambda line: None, timeout_s=7)
        for group in (ckpt.group, ckpt.control):
            assert group is not None
            assert group._get_backend(torch.device("cpu")).options._timeout == timedelta(seconds=7)
        assert not ckpt.busy()
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="^timeout_s: must be above 0"):
        ShardedCheckpointer(tmp_path / "other", timeout_s=0)


def test_a_stop_waits_for_its_save_no_longer_than_its_grace_period_allows(monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads.train.checkpointer import STOP_EXIT_MARGIN_S, stop_wait_s
    from workloads.train.config import TrainConfig

    config = TrainConfig(data="d", collective_timeout_s=600.0)
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    assert stop_wait_s(config, 100.0, now=130.0) == 600.0  # no launcher: --collective-timeout
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "85")  # the rendered Job: grace 90 s less 5
    assert stop_wait_s(config, 100.0, now=130.0) == 85 - 30 - STOP_EXIT_MARGIN_S
    assert stop_wait_s(config, 100.0, now=200.0) == 0.0  # nothing left: give the save up at once
    assert stop_wait_s(TrainConfig(data="d", collective_timeout_s=20.0), 100.0, now=101.0) == 20.0


def test_a_save_that_never_finished_exits_with_the_disruption_code(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import workloads.train.__main__ as cli

    def stuck(*args: object, **kwargs: object) -> None:
        raise CheckpointTimeout("checkpoint: step 9 still not written after 600 s (a hung disk, store or peer); "
                                "the previous complete checkpoint stands")

    monkeypatch.setattr(cli, "train", stuck)
    monkeypatch.delenv("DISRUPTION_EXIT_CODE", raising=False)
    monkeypatch.delenv("CONFIG_ERROR_EXIT_CODE", raising=False)
    assert cli.main(["--data", "unused", "--metrics-port", "0"]) == cli.DISRUPTION_EXIT_CODE
    assert "checkpoint: step 9 still not written" in capsys.readouterr().err
