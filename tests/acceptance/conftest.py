"""The acceptance CLI loaded once per module, with git answered as a clean tree at a fixed commit; a stand-in
`pulumi` on PATH (fake_pulumi.py) with its state in a JSON file."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("acceptance_cli", ROOT / "scripts" / "acceptance.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the script's lazy imports and the clients the dry run must not call, imported once here (seconds under load)
    import boto3  # noqa: F401
    import kubernetes.config  # noqa: F401

    import infra.nodes.instances  # noqa: F401
    import infra.plan.engine  # noqa: F401
    return module


@pytest.fixture
def clean_git(cli: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {"rev-parse": COMMIT, "status": "", "describe": "v0.2.0"}
    monkeypatch.setattr(cli, "_git", lambda *args: answers[args[0]])


def run_cli(cli: ModuleType, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.entry(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


HERE = Path(__file__).resolve().parent


@pytest.fixture
def pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Writes the fake's state; returns a reader of it (calls, lock, pending)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    shim = folder / "pulumi"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'fake_pulumi.py'} \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    state = tmp_path / "pulumi-state.json"
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_PULUMI_STATE", str(state))

    def setup(**fields: object) -> None:
        state.write_text(json.dumps({"backend": "diy", "lock": None, "pending": [], **fields}))

    def read() -> dict:  # type: ignore[type-arg]
        return json.loads(state.read_text())

    def update(**fields: object) -> None:
        state.write_text(json.dumps({**read(), **fields}))

    setup.read, setup.update = read, update  # type: ignore[attr-defined]
    return setup
