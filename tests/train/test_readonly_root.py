"""The trainer under a read-only root: it writes only where the rendered pod gives it a writable mount."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.jobs.facts import dev_facts
from workloads.jobspec import TMP_DIR, parse_spec, render_job

REPO = Path(__file__).resolve().parents[2]
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/ml-cluster-train:0.1.0"


# Installed in the trainer's process before it starts: every write the interpreter makes (open for writing,
# mkdir, rename, remove...) is checked against the paths the rendered pod can write, read from $WRITABLE.
_GUARD = r"""
import os, runpy, sys
writable = [os.path.realpath(p) for p in os.environ["WRITABLE"].split(os.pathsep)]
def allowed(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fsdecode(path))
    return any(real == root or real.startswith(root + os.sep) for root in writable) or real.startswith("/dev/")
def hook(event, args):
    if event == "open" and args[0] is not None:
        mode, flags = args[1] or "", args[2] or 0
        if any(c in mode for c in "wax+") or flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            if not allowed(args[0]):
                os.write(2, f"WRITE OUTSIDE MOUNTS: {event} {args[0]}\n".encode()); os._exit(99)
    elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.replace", "shutil.rmtree",
                   "os.truncate", "os.symlink", "os.link", "os.chmod"):
        targets = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
        if event in ("os.chmod", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate", "os.mkdir"):
            targets = targets[:1]
        for target in targets:
            if not allowed(target):
                os.write(2, f"WRITE OUTSIDE MOUNTS: {event} {target}\n".encode()); os._exit(99)
sys.addaudithook(hook)
sys.argv = ["workloads.train", *sys.argv[1:]]
runpy.run_module("workloads.train", run_name="__main__", alter_sys=True)
"""


@pytest.mark.slow
def test_the_trainer_writes_only_where_the_pod_is_writable(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    """The rendered pod's writable places, as stand-ins: /tmp (HOME, TMPDIR), /dev/shm, the checkpoint dir."""
    spec = parse_spec({"name": "resnet", "image": IMAGE, "gpus": 1, "checkpoint": {"claimName": "checkpoints-efs"},
                       "dataset": {"claimName": "datasets-efs", "staging": "none"}})
    pod = render_job(spec, dev_facts())[0]["spec"]["template"]["spec"]
    mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if not m.get("readOnly")}
    assert {TMP_DIR, "/dev/shm"} <= mounts
    # A short scratch dir, like the pod's /tmp: pytest's own paths can be too long for the workers' sockets.
    scratch = Path(tempfile.mkdtemp(prefix="ro-"))
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HOME": str(scratch),
           "TMPDIR": str(scratch), "WRITABLE": os.pathsep.join([str(scratch), str(checkpoints), "/dev/shm"]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    args = ["--data", str(tiny_data["decoded"]), "--epochs", "1", "--model", "resnet18", "--width", "8",
            "--batch-size", "8", "--crop-size", "32", "--workers", "2", "--checkpoint-dir", str(checkpoints),
            "--checkpoint-every", "2"]
    try:
        result = subprocess.run([sys.executable, "-c", _GUARD, *args], capture_output=True, text=True, env=env,
                                cwd=REPO, timeout=240)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WRITE OUTSIDE MOUNTS" not in result.stderr
    assert any(checkpoints.iterdir()), "the trainer wrote no checkpoint: the guard saw nothing"
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert events, result.stdout[-2000:]


def test_the_guard_stops_a_write_outside_the_mounts(tmp_path: Path) -> None:
    escaping = _GUARD.replace("sys.addaudithook(hook)", f"sys.addaudithook(hook); open({str(tmp_path / 'x')!r}, 'w')")
    env = {**os.environ, "PYTHONPATH": str(REPO), "WRITABLE": str(tmp_path / "elsewhere")}
    result = subprocess.run([sys.executable, "-c", escaping], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 99 and "WRITE OUTSIDE MOUNTS" in result.stderr
