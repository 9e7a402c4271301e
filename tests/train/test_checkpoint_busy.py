"""A periodic save while the previous one is still in flight: skipped (save_if_idle, the trainer's default) or
waited for (save, --checkpoint-if-busy wait), never queued. One process, no process group: the remote tier is a
directory whose copy is held until the test lets it go, so "in flight" is a state the test controls, not a race."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.train.heldtier import HeldTier
from workloads.train.sharded import ShardedCheckpointer, TrainingState
from workloads.train.tiers import MANIFEST, DirectoryTier, step_dir_name

pytestmark = pytest.mark.skipif(dist.is_available() and dist.is_initialized(),
                                reason="needs a process without a process group")


def _state() -> TrainingState:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    return TrainingState(model, optimizer)


@pytest.fixture
def held(tmp_path: Path) -> tuple[ShardedCheckpointer, HeldTier]:
    tier = HeldTier(tmp_path / "remote")
    return ShardedCheckpointer(tmp_path / "local", tier, keep=5, log=lambda line: None), tier


def test_a_periodic_save_while_one_is_in_flight_is_skipped_not_queued(
        held: tuple[ShardedCheckpointer, HeldTier]) -> None:
    ckpt, tier = held
    state = _state()
    first = ckpt.save(state, 2, meta={"epoch": 0})
    assert tier.copying.wait(60)  # step 2's background part is in the (held) remote copy
    assert ckpt.busy() and ckpt.in_flight == 2
    assert ckpt.save_if_idle(state, 4, meta={"epoch": 0}) is None  # returned at once, nothing staged
    assert ckpt.skipped == 1 and not (ckpt.local / step_dir_name(4)).exists()
    assert ckpt.in_flight == 2 and not first.complete
    tier.release.set()
    assert ckpt.wait() is first and first.complete and not ckpt.busy()
    again = ckpt.save_if_idle(state, 6, meta={"epoch": 0})  # the next interval: idle, so it saves
    assert again is not None and again.step == 6
    assert ckpt.wait() is again and again.complete and ckpt.skipped == 1
    assert sorted(p.name for p in ckpt.local.iterdir() if (p / MANIFEST).exists()) == [
        step_dir_name(2), step_dir_name(6)]


def test_a_stop_or_final_save_waits_for_the_one_in_flight(held: tuple[ShardedCheckpointer, HeldTier]) -> None:
    ckpt, tier = held
    state = _state()
    first = ckpt.save(state, 2, meta={})
    assert tier.copying.wait(60)
    threading.Timer(0.3, tier.release.set).start()
    second = ckpt.save(state, 3, meta={})  # save(): blocks until step 2 is complete, then stages step 3
    assert first.complete and second.step == 3
    assert ckpt.wait() is second and second.complete and ckpt.skipped == 0


@pytest.mark.slow  # two tiny training runs (about 14 s at load 13); the two cases above keep the rule in make test
def test_the_trainer_skips_periodic_saves_while_one_is_in_flight_and_waits_when_told(
        tiny_data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled trainer, --checkpoint-every 1 with a remote copy slower than a step: skip (the default) emits
    checkpoint_skipped events and saves fewer steps; wait saves every step. Both end with the final step saved."""
    import io

    from workloads.train.__main__ import parse_args
    from workloads.train.checkpointer import latest_checkpoint
    from workloads.train.loop import Reporter, train

    original = DirectoryTier.put

    def slow_put(self: DirectoryTier, local: Path, step: int, name: str) -> None:
        time.sleep(0.15)  # a save's two files take 0.3 s to copy: longer than a step of the tiny run
        original(self, local, step, name)

    monkeypatch.setattr(DirectoryTier, "put", slow_put)
    runs = {}
    for mode in ("skip", "wait"):
        args = parse_args(["--data", str(tiny_data["decoded"]), "--model", "resnet18", "--width", "8",
                           "--batch-size", "8", "--crop-size", "32", "--epochs", "1", "--workers", "0",
                           "--checkpoint-dir", str(tmp_path / mode / "local"),
                           "--checkpoint-uri", str(tmp_path / mode / "remote"), "--checkpoint-every", "1",
                           "--checkpoint-if-busy", mode])
        stream, threads = io.StringIO(), torch.get_num_threads()
        torch.set_num_threads(1)  # as the CLI runs (OMP_NUM_THREADS=1 in the Job)
        try:
            train(args, Reporter(0, stream))
        finally:
            torch.set_num_threads(threads)
        events = [json.loads(line) for line in stream.getvalue().splitlines()]
        runs[mode] = events
        saved = latest_checkpoint(tmp_path / mode / "local")
        assert saved is not None and saved["step"] == 6  # 42 samples in batches of 8: the epoch's end, saved
    skipped = [event for event in runs["skip"] if event["event"] == "checkpoint_skipped"]
    assert skipped and all(event["in_flight"] < event["step"] for event in skipped)
    written = {event["step"] for event in runs["skip"] if event["event"] == "checkpoint"}
    assert written.isdisjoint(event["step"] for event in skipped) and 6 in written
    assert not [event for event in runs["wait"] if event["event"] == "checkpoint_skipped"]
    assert {event["step"] for event in runs["wait"] if event["event"] == "checkpoint"} == {1, 2, 3, 4, 5, 6}
