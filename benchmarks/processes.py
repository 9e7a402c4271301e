"""Stopping a child process the benchmarks (and the tests' servers) started: by its handle, never by name."""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen, timeout_s: float) -> None:  # type: ignore[type-arg]
    """SIGTERM, up to `timeout_s` for it to exit, then SIGKILL; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
