"""The stop helper for your own loop (workloads.data.api.StopSignal): a stop signal on one rank stops every rank after
the same step, the checkpoint callback runs, and the process (and the launcher around it) exits with the disruption
code; a SIGTERM to the whole process group (DataLoader workers included) ends the same way, never with a traceback;
a lost peer inside the `with` block exits with the disruption code too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch

from tests.train.test_train import REPO, _env, _free_port
from workloads.data.api import LoaderSettings, PackedData, Placement
from workloads.jobspec.fields import DISRUPTION_EXIT_CODE

# Two ranks step in lockstep; every step ends with stop.check(callback). The callback records the step per rank.
LOOP = textwrap.dedent("""
    import json, os, sys, time
    import torch.distributed as dist
    from workloads.data.api import StopSignal

    stop = StopSignal()
    dist.init_process_group("gloo")
    rank, out = dist.get_rank(), sys.argv[1]
    print(json.dumps({"rank": rank, "pid": os.getpid()}), flush=True)
    with stop:
        for step in range(1, 100_000):
            time.sleep(0.02)
            if rank == 0 and os.environ.get("LOSE_PEER_AT") == str(step):
                os._exit(9)  # a lost node: the other rank's next collective fails
            dist.barrier()  # the step's collective (DDP's all-reduce)
            print(json.dumps({"rank": rank, "step": step}), flush=True)
            stop.check(lambda: open(os.path.join(out, f"rank{rank}"), "w").write(str(step)))
""")


def _launch(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    command = [sys.executable, "-m", "workloads.train.launch", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "--monitor-interval", "0.2", str(script), str(tmp_path)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)


def _finish(process: subprocess.Popen[str], timeout: float = 120) -> str:
    try:
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return err


def _json_objects(lines: Iterable[str]) -> Iterator[dict]:
    """The JSON objects the two ranks print to one pipe: two writes can land on one line ({...}{...}), so each
    line is read object by object; what is not JSON is skipped."""
    decoder = json.JSONDecoder()
    for raw in lines:
        text, at = raw.strip(), 0
        while (start := text.find("{", at)) != -1:
            try:
                found, at = decoder.raw_decode(text, start)
            except json.JSONDecodeError:
                break
            if isinstance(found, dict):
                yield found


def test_sigterm_on_one_rank_stops_both_after_the_same_step_with_the_checkpoint(tmp_path: Path) -> None:
    process = _launch(tmp_path, _env(DISRUPTION_EXIT_CODE=str(DISRUPTION_EXIT_CODE)))
    assert process.stdout is not None
    pids: dict[int, int] = {}
    signalled_at = None
    for line in _json_objects(process.stdout):
        if "pid" in line:
            pids[line["rank"]] = line["pid"]
        elif line.get("rank") == 1 and line["step"] == 5 and signalled_at is None:
            os.kill(pids[1], signal.SIGTERM)  # only rank 1: rank 0 learns it from the all-reduce
            signalled_at = line["step"]
    err = _finish(process)
    assert process.returncode == DISRUPTION_EXIT_CODE, err[-2000:]
    steps = {rank: int((tmp_path / f"rank{rank}").read_text()) for rank in (0, 1)}
    assert steps[0] == steps[1] >= 5, steps  # the same agreed step on both ranks, after the signal
    assert "Traceback" not in err and "stopped: SIGTERM" in err


def test_a_lost_peer_inside_the_block_exits_with_the_disruption_code(tmp_path: Path) -> None:
    process = _launch(tmp_path, _env(LOSE_PEER_AT="4", TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5"))
    err = _finish(process)
    # rank 0 died (9: a crash, which its pod would count); rank 1 left with 43 and one line, no traceback
    assert "error: peer lost" in err and "Traceback" not in err, err[-3000:]
    assert process.returncode == 1  # the launcher: one worker crashed (9), the other was a disruption (43)


def test_a_signal_before_the_first_step_exits_at_once(tmp_path: Path) -> None:
    script = tmp_path / "slow_setup.py"
    script.write_text("import time\nfrom workloads.data.api import StopSignal\nstop = StopSignal()\nprint('ready', "
                      "flush=True)\ntime.sleep(60)\n")
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=_env(), cwd=REPO)
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    err = _finish(process, timeout=20)
    # the disruption code: the handler ended it, not the 60 s sleep (which exits 0)
    assert process.returncode == DISRUPTION_EXIT_CODE
    assert "before the first step" in err


def test_sigterm_to_the_process_group_stops_the_plain_example_with_a_checkpoint(
        tmp_path: Path, tiny_data: dict[str, Path]) -> None:
    """`timeout` or systemd signal the whole group, DataLoader workers included: before, the workers died of it and
    the loop raised 'DataLoader worker ... is killed by signal: Terminated' (exit 1)."""
    checkpoints = tmp_path / "ckpt"
    command = [sys.executable, str(REPO / "examples" / "train_plain.py"), "--data", str(tiny_data["decoded"]),
               "--epochs", "50", "--batch-size", "8", "--workers", "2", "--checkpoint-dir", str(checkpoints),
               "--checkpoint-every", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                               cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (checkpoints / "checkpoint.pt").exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGTERM)  # the launcher's group: the script and its DataLoader workers
    err = _finish(process)
    assert process.returncode == DISRUPTION_EXIT_CODE, err[-3000:]
    assert "Traceback" not in err and "stopped: SIGTERM (checkpoint written)" in err
    saved = torch.load(checkpoints / "checkpoint.pt", weights_only=True)
    assert saved["step"] >= 1


def test_state_dict_counts_the_batches_trained_when_a_framework_fetches_ahead(tiny_data: dict[str, Path]) -> None:
    packed_small = tiny_data["decoded"]
    with PackedData.open(packed_small, batch_size=8, placement=Placement()) as data:
        data.loader(LoaderSettings(workers=0))
        batches = data.batches(0)
        seen = [next(batches)[1].tolist() for _ in range(3)]  # three handed out, two trained
        state = data.state_dict(batches=2)
        with pytest.raises(ValueError, match="batches: must be an integer in \\[0, 3\\]"):
            data.state_dict(batches=4)
    with PackedData.open(packed_small, batch_size=8, placement=Placement()) as data:
        data.loader(LoaderSettings(workers=0))
        data.load_state_dict(state)
        assert next(data.batches(0))[1].tolist() == seen[2]  # the third batch again: it was never trained
