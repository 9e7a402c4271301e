"""SIGTERM and SIGINT mid-epoch: the step in flight finishes, a last checkpoint with the loader position is written
(rank 0; the others wait), every rank exits with the disruption code, and a resumed run ends with exactly the
weights of an uninterrupted one. Also the launcher's exit codes, which the Jobs' podFailurePolicy acts on."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.train.test_train import REPO, TINY_RUN, _env, _free_port, _train_here
from workloads.jobspec.fields import CONFIG_ERROR_EXIT_CODE, DISRUPTION_EXIT_CODE
from workloads.train import __main__ as cli
from workloads.train.checkpointer import latest_checkpoint
from workloads.train.launch import exit_code_for

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


def _common(data: Path) -> list[str]:
    # no --checkpoint-every: before this change a stop lost everything since the epoch's start
    return ["--data", str(data), "--epochs", "2", "--workers", "0", "--deterministic"]


def _run_until_step(command: list[str], step: int, sig: int, env: dict[str, str]) -> tuple[int, list[dict], int]:
    """Start `command`, send `sig` once rank 0 has reported `step`; (exit code, JSON lines, last step seen)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=REPO, start_new_session=True)
    lines: list[dict] = []
    seen = 0
    assert process.stdout is not None
    try:
        for raw in process.stdout:
            if not raw.startswith("{"):
                continue
            lines.append(json.loads(raw))
            if lines[-1]["event"] == "batch" and not seen and lines[-1]["step"] >= step:
                seen = lines[-1]["step"]
                process.send_signal(sig)  # to the trainer, or to torchrun's agent: the kubelet's PID 1
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.stderr is not None
    err = process.stderr.read()
    assert seen, f"never reached step {step}: {err[-2000:]}"
    return process.returncode, lines, seen


def _same_weights(expected: dict, actual: dict) -> None:
    assert actual["step"] == expected["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, actual["model"][name]), name


@pytest.fixture(scope="module")
def straight(tiny_data: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict:
    where = tmp_path_factory.mktemp("straight")
    _train_here([*_common(tiny_data["decoded"]), "--checkpoint-dir", str(where)])
    state = latest_checkpoint(where)
    assert state is not None
    return state


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_stop_signal_on_one_rank_loses_no_step_and_resumes_exactly(
    tiny_data: dict[str, Path], tmp_path: Path, straight: dict, sig: int
) -> None:
    common = _common(tiny_data["decoded"])
    code, lines, seen = _run_until_step(
        [sys.executable, "-m", "workloads.train", *TINY_RUN, *common, "--checkpoint-dir", str(tmp_path)], 2, sig,
        _env(DISRUPTION_EXIT_CODE=str(DISRUPTION_EXIT_CODE)))
    assert code == DISRUPTION_EXIT_CODE
    (stopped,) = [line for line in lines if line["event"] == "stopped"]
    assert stopped["reason"] == signal.Signals(sig).name and stopped["checkpointed"]
    saved = latest_checkpoint(tmp_path)
    assert saved is not None and saved["step"] == stopped["step"] >= seen  # no step reported before the stop lost
    assert saved["loader"] is not None or saved["batch"] == 0
    again = _train_here([*common, "--checkpoint-dir", str(tmp_path), "--resume"])
    assert [line["step"] for line in again if line["event"] == "resumed"] == [saved["step"]]
    final = latest_checkpoint(tmp_path)
    assert final is not None
    _same_weights(straight, final)


@pytest.mark.slow  # a two-rank torchrun; test_stop_helper keeps SIGTERM on two ranks with the checkpoint in make test
@pytest.mark.skipif(TORCHRUN is None, reason="no torchrun")
def test_sigterm_to_torchrun_stops_two_ranks_with_one_checkpoint_and_the_disruption_code(
    tiny_data: dict[str, Path], tmp_path: Path, straight: dict
) -> None:
    """SIGTERM reaches torchrun's agent (the container's PID 1); it forwards SIGTERM to both ranks, which agree on
    the stop in the step's all-reduce; rank 0 writes, both exit 43, and the launcher exits 43 (torchrun: 1)."""
    common = _common(tiny_data["decoded"])
    launch = [sys.executable, "-m", "workloads.train.launch", "--nproc-per-node", "2", "--master-addr",
              "127.0.0.1", "--master-port", str(_free_port()), "-m", "workloads.train", *TINY_RUN, *common,
              "--checkpoint-dir", str(tmp_path)]
    code, lines, seen = _run_until_step(launch, 1, signal.SIGTERM, _env())
    assert code == DISRUPTION_EXIT_CODE
    (stopped,) = [line for line in lines if line["event"] == "stopped"]
    saved = latest_checkpoint(tmp_path)
    assert saved is not None and saved["world_size"] == 2 and saved["step"] == stopped["step"] >= seen
    # resumed on one rank: the sampler continues with exactly the samples not yet seen; the weights differ from
    # the one-rank run only through the batch split, so check the exact position, not the weights
    again = _train_here([*common, "--checkpoint-dir", str(tmp_path), "--resume"])
    assert [line["step"] for line in again if line["event"] == "resumed"] == [saved["step"]]


def test_launcher_maps_worker_outcomes_to_the_codes_the_job_acts_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", str(CONFIG_ERROR_EXIT_CODE))
    monkeypatch.setenv("DISRUPTION_EXIT_CODE", str(DISRUPTION_EXIT_CODE))
    assert exit_code_for([CONFIG_ERROR_EXIT_CODE, -signal.SIGTERM]) == CONFIG_ERROR_EXIT_CODE
    assert exit_code_for([DISRUPTION_EXIT_CODE, DISRUPTION_EXIT_CODE]) == DISRUPTION_EXIT_CODE
    assert exit_code_for([DISRUPTION_EXIT_CODE, -signal.SIGTERM]) == DISRUPTION_EXIT_CODE
    assert exit_code_for([-signal.SIGTERM]) == DISRUPTION_EXIT_CODE  # the agent stopped them all
    assert exit_code_for([1, DISRUPTION_EXIT_CODE]) == 1  # a crash is a crash, whatever its peers saw
    assert exit_code_for([-signal.SIGKILL]) == 1  # the OOM killer is not a disruption
    assert exit_code_for([DISRUPTION_EXIT_CODE, CONFIG_ERROR_EXIT_CODE]) == CONFIG_ERROR_EXIT_CODE


def test_disruption_code_is_never_the_config_code_or_a_runtime_code(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.DISRUPTION_EXIT_CODE == DISRUPTION_EXIT_CODE  # the trainer's default is what the Jobs render
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", "43")
    monkeypatch.setenv("DISRUPTION_EXIT_CODE", "43")
    assert cli.disruption_exit_code() == 44
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", "42")
    for bad in ("1", "0", "200", "x", "42"):
        monkeypatch.setenv("DISRUPTION_EXIT_CODE", bad)
        assert cli.disruption_exit_code() == DISRUPTION_EXIT_CODE


def test_a_lost_peer_is_recognised_by_type_or_by_the_transports_words() -> None:
    from torch.distributed import DistNetworkError

    assert cli.peer_lost(DistNetworkError("Failed to recv, got 0 bytes"))
    gloo = RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:20888. This is typically caused by a remote worker crashing.")
    assert cli.peer_lost(gloo)
    try:
        try:
            raise gloo
        except RuntimeError as inner:
            raise ValueError("wrapped") from inner
    except ValueError as outer:
        assert cli.peer_lost(outer)
    assert not cli.peer_lost(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not cli.peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


@pytest.mark.parametrize(("raised", "code"), [
    ("SignalException", DISRUPTION_EXIT_CODE),  # the kubelet's SIGTERM reached the agent
    ("RendezvousConnectionError", DISRUPTION_EXIT_CODE),  # the node hosting the store is gone
    ("RendezvousClosedError", 1),  # the rest of the gang closed it: a replacement could never join, so count it
])
def test_launcher_maps_agent_outcomes(monkeypatch: pytest.MonkeyPatch, raised: str, code: int) -> None:
    import signal as signals

    import torch.distributed.run
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous import api

    from workloads.train import launch

    errors = {"SignalException": SignalException("stop", signals.SIGTERM),
              "RendezvousConnectionError": api.RendezvousConnectionError("store gone"),
              "RendezvousClosedError": api.RendezvousClosedError()}

    def torchrun(argv: list[str] | None) -> None:
        raise errors[raised]

    monkeypatch.setattr(torch.distributed.run, "main", torchrun)
    monkeypatch.delenv("DISRUPTION_EXIT_CODE", raising=False)
    monkeypatch.delenv("CONFIG_ERROR_EXIT_CODE", raising=False)
    assert launch.main([]) == code
