"""The acceptance CLI loaded once per module, with git answered as a clean tree at a fixed commit."""

from __future__ import annotations

import importlib.util
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
