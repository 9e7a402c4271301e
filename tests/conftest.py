"""Shared test harness: offline plans of the real program, cached per test session."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.plan.engine import STACKS_DIR, plan_stack

STACKS = sorted(path.name.removeprefix("Pulumi.").removesuffix(".yaml") for path in STACKS_DIR.glob("Pulumi.*.yaml"))
AWS_STACKS = [s for s in STACKS if yaml.safe_load((STACKS_DIR / f"Pulumi.{s}.yaml").read_text())["config"].get(
    "ml-cluster:platform") == "eks"]

_PLANS: dict[str, dict[str, Any]] = {}
# plan_config's plans: (stack, the stack file's YAML) -> (plan, what planning it wrote to stderr)
_CONFIG_PLANS: dict[tuple[str, str], tuple[dict[str, Any], str]] = {}

# Under `make test` (-n 2) the run ends when the worker with the last long case ends: the folders whose cases start
# gangs, servers, moto and charts (seconds each) are collected first, so the last cases handed out are the quick
# ones and the two workers finish together. A stable sort: the order inside each folder is kept.
LONG_FOLDERS_FIRST = ("train", "jobs", "data", "monitoring", "charts")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent

    def folder_rank(item: pytest.Item) -> int:
        try:
            folder = item.path.resolve().relative_to(tests).parts[0]
        except ValueError:
            return len(LONG_FOLDERS_FIRST)
        return LONG_FOLDERS_FIRST.index(folder) if folder in LONG_FOLDERS_FIRST else len(LONG_FOLDERS_FIRST)

    items.sort(key=folder_rank)


@pytest.fixture(scope="session")
def stack_plan() -> Callable[[str], dict[str, Any]]:
    """stack_plan("dev") -> the plan document of stacks/Pulumi.dev.yaml (planned once per session)."""

    def get(stack: str) -> dict[str, Any]:
        if stack not in _PLANS:
            _PLANS[stack] = plan_stack(stack)
        return _PLANS[stack]

    return get


@dataclass(frozen=True)
class PlanRun:
    """One `scripts/plan.py` process: its result (stdout as bytes), and the manifests folder and facts file it was
    asked to write."""

    result: subprocess.CompletedProcess[bytes]
    manifests: Path
    facts: Path


@pytest.fixture(scope="session")
def dev_plan_process(tmp_path_factory: pytest.TempPathFactory) -> PlanRun:
    """`scripts/plan.py --stack dev --json --manifests DIR --facts FILE` in its own interpreter (PYTHONHASHSEED=1),
    run once per session: the tests that only read what the CLI printed and wrote share it."""
    out = tmp_path_factory.mktemp("dev-plan-process")
    manifests, facts = out / "manifests", out / "facts.json"
    result = subprocess.run([sys.executable, str(STACKS_DIR.parent / "scripts" / "plan.py"), "--stack", "dev", "--json",
                             "--manifests", str(manifests), "--facts", str(facts)], capture_output=True,
                            cwd=STACKS_DIR.parent, env={**os.environ, "PYTHONHASHSEED": "1"}, timeout=120)
    return PlanRun(result, manifests, facts)


CLI = Callable[..., tuple[int, str, str]]


@pytest.fixture
def plan_cli(monkeypatch: pytest.MonkeyPatch, stack_plan: Any) -> CLI:
    """plan_cli(*argv) -> (exit code, stdout, stderr) of scripts/plan.py's main() in-process: the CLI's code path
    without a new interpreter, a committed stack's plan taken from the session's cache (a copy: main may not change
    it); --config plans that file. The CLI in its own process: dev_plan_process."""
    from scripts import plan as cli_module

    planned = cli_module.plan_stack
    monkeypatch.setattr(cli_module, "plan_stack", lambda stack, config=None: (
        copy.deepcopy(stack_plan(stack)) if config is None else planned(stack, config)))

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            code = cli_module.main(list(argv))
        return code, out.getvalue(), err.getvalue()

    return run


def stack_values(stack: str) -> dict[str, Any]:
    """The `config:` mapping of a committed stack file (a fresh copy to modify)."""
    return yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())["config"]


@pytest.fixture
def plan_config(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """plan_config("dev", {"ml-cluster:protected": True}) plans a modified copy of a stack file.

    Keys mapped to None are removed. Raises what plan_stack raises (ConfigError, FixtureError). A stack file the
    session has planned already (the same stack, the same YAML) is not planned again: the copy of its plan comes
    back with what the plan wrote to stderr. Errors are never cached: a bad file is planned every time.
    """

    def plan(stack: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        document = yaml.safe_load((STACKS_DIR / f"Pulumi.{stack}.yaml").read_text())
        for key, value in (overrides or {}).items():
            if value is None:
                document["config"].pop(key, None)
            else:
                document["config"][key] = value
        text = yaml.safe_dump(document)
        path = tmp_path / f"Pulumi.{stack}.yaml"
        path.write_text(text)
        if (stack, text) not in _CONFIG_PLANS:
            said = io.StringIO()
            try:
                with redirect_stderr(said):
                    planned = plan_stack(stack, path)
            finally:
                sys.stderr.write(said.getvalue())
            _CONFIG_PLANS[stack, text] = (planned, said.getvalue())
            return copy.deepcopy(planned)
        planned, said_then = _CONFIG_PLANS[stack, text]
        sys.stderr.write(said_then)
        return copy.deepcopy(planned)

    return plan


def resources_of(plan: dict[str, Any], type_token: str) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if r["type"] == type_token]
