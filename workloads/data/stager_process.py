"""The stager as a process of the training script: `python -m workloads.data stage` started by local rank 0 of
PackedData or MixedData (remote data), its last line of output, and its end (waited for, then SIGTERM, then
SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass
class StagerProcess:
    process: subprocess.Popen[bytes]
    log: Path


def start_stager(remote: str | Sequence[str], dest: Path, endpoint_url: str | None, budget_bytes: int | None,
                 workers: int) -> StagerProcess:
    """`python -m workloads.data stage` of one remote (or a mixture's remotes, into DEST/0, DEST/1, ...)."""
    remotes = [remote] if isinstance(remote, str) else list(remote)
    for text in remotes:
        if not text.startswith("s3://"):
            raise ValueError(f"remote: expected an s3://bucket/prefix URI, got {text!r}")
    dest.mkdir(parents=True, exist_ok=True)
    # --reader-pid: the stager ends with this process, however it ends (an orphan stager once ran for hours).
    command = [sys.executable, "-m", "workloads.data", "stage", *remotes, str(dest), "--no-progress",
               "--workers", str(workers), "--reader-pid", str(os.getpid())]
    if budget_bytes is not None:
        command += ["--budget", f"{budget_bytes}B"]  # a bare number would be GiB
    if endpoint_url is not None:
        command += ["--endpoint-url", endpoint_url]
    # The stager imports this package, wherever the script that opened the data runs from.
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    with tempfile.NamedTemporaryFile(prefix="stager-", suffix=".log", delete=False) as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    return StagerProcess(process, Path(out.name))


def stager_exit(stager: StagerProcess) -> str | None:
    """None while the stager this process started runs; once it has exited, its exit status and last line."""
    code = stager.process.poll()
    return None if code is None else f"the stager exited with {code}{stager_tail(stager)}"


def stager_tail(stager: StagerProcess | None) -> str:
    if stager is None:
        return ""
    with contextlib.suppress(OSError):
        lines = [line for line in stager.log.read_text(errors="replace").splitlines() if line.strip()]
        if lines:
            return f" (stager: {lines[-1]})"
    return ""


@contextlib.contextmanager
def stopped_on_error(stager: StagerProcess | None) -> Iterator[None]:
    """Opening the data this stager serves: when it fails, stop the stager at once (nothing runs on behind the
    error) and raise."""
    try:
        yield
    except BaseException:
        if stager is not None:
            stop_stager(stager, timeout_s=0)
        raise


def stop_stager(stager: StagerProcess, timeout_s: float) -> str | None:
    """Wait for the stager (stop it after `timeout_s`); its last line of output."""
    try:
        stager.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stager.process.terminate()  # SIGTERM unwinds the stager like Ctrl-C: no partial file keeps a final name
        try:
            stager.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            stager.process.kill()
            stager.process.wait()
    summary = stager_tail(stager)
    if stager.process.returncode == 0:
        stager.log.unlink(missing_ok=True)
    return summary.removeprefix(" (stager: ").removesuffix(")") or None
