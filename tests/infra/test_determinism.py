"""Issue 12: the same stack plans to the same bytes in separate processes (JSON and manifest files), manifests keep
the conventional key order, and --manifests refuses a path that is a file."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import PlanRun

REPO = Path(__file__).resolve().parents[2]


def _plan(*args: str, seed: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "plan.py"), *args], capture_output=True,
                          cwd=REPO, env=env, timeout=120)


def _tree(directory: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(directory.iterdir())}


def test_two_processes_write_the_same_bytes(tmp_path: Path, dev_plan_process: PlanRun) -> None:
    # the first process (PYTHONHASHSEED=1) is the session's shared run of the same command
    first = dev_plan_process.result
    second = _plan("--stack", "dev", "--json", "--manifests", str(tmp_path / "b"), "--facts", str(tmp_path / "f.json"),
                   seed="2")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == second.stdout
    assert _tree(dev_plan_process.manifests) == _tree(tmp_path / "b")
    assert dev_plan_process.facts.read_bytes() == (tmp_path / "f.json").read_bytes()
    for path in dev_plan_process.manifests.glob("*.yaml"):
        keys = list(yaml.safe_load(path.read_text()))
        assert keys[:3] == ["apiVersion", "kind", "metadata"], (path.name, keys)
        assert path.read_text().startswith("apiVersion: ")


def test_manifests_pointed_at_a_file_is_an_error(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("keep me")
    result = _plan("--stack", "onprem", "--manifests", str(target), seed="0")
    assert result.returncode == 2, result.stderr
    assert result.stderr.decode().startswith(f"error: {target}: ") and b"Traceback" not in result.stderr
    assert target.read_text() == "keep me"
