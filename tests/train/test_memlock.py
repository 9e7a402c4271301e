"""The locked-memory rule of EFA gangs: the launcher says what `ulimit -l` the container got and refuses, as a
config error, to start NCCL over EFA under a finite one."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.train.memlock import efa_memlock_error, memlock_line

ROOT = Path(__file__).resolve().parents[2]


def test_only_an_efa_gang_under_a_finite_limit_is_refused() -> None:
    assert efa_memlock_error({"FI_PROVIDER": "efa"}, None) is None
    assert efa_memlock_error({}, 65536) is None  # TCP gangs pin nothing through libfabric
    said = efa_memlock_error({"FI_PROVIDER": "efa"}, 8 * 2**20)
    assert said is not None and said.startswith("ulimit -l: 8192 KiB, but NCCL over EFA")
    assert memlock_line(None) == "locked memory (ulimit -l): unlimited"
    assert memlock_line(65536) == "locked memory (ulimit -l): 64 KiB"


def _launch(env: dict[str, str], limit: int) -> subprocess.CompletedProcess[str]:
    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit, limit))

    return subprocess.run([sys.executable, "-m", "workloads.train.launch", "--standalone", "--nproc-per-node", "1",
                           "-m", "workloads.train.allreduce", "--report-only", "--min-bytes", "4", "--max-bytes", "4",
                           "--iters", "1", "--warmup", "0"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, preexec_fn=lower_limit)


def test_the_launcher_prints_the_limit_and_refuses_an_efa_gang_under_a_finite_one() -> None:
    import os

    base = {key: value for key, value in os.environ.items() if key != "FI_PROVIDER"}
    refused = _launch({**base, "FI_PROVIDER": "efa", "CONFIG_ERROR_EXIT_CODE": "42"}, 65536)
    assert refused.returncode == 42, refused.stderr
    lines = refused.stderr.splitlines()
    assert lines[0] == "launch: locked memory (ulimit -l): 64 KiB"
    assert lines[1].startswith("error: ulimit -l: 64 KiB, but NCCL over EFA (FI_PROVIDER=efa) needs unlimited")


@pytest.mark.slow  # a real one-rank gang; the refusal above keeps the launcher's limit check in make test
def test_the_same_finite_limit_without_efa_starts_the_gang() -> None:
    import os

    base = {key: value for key, value in os.environ.items() if key != "FI_PROVIDER"}
    started = _launch(base, 65536)
    assert started.returncode == 0, started.stderr
    assert started.stderr.splitlines()[0] == "launch: locked memory (ulimit -l): 64 KiB"
    assert "# REPORT: 1 ranks" in started.stdout
