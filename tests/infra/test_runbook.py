"""The runbook in docs/operations.md stays true to the code: the targets, scripts and subcommands it names exist,
and the error lines it quotes are the ones the checks print."""

from __future__ import annotations

import re
from pathlib import Path

from infra.config.cluster import ClusterConfig
from infra.config.deploy import DeployConfig, reachability_problems
from infra.config.errors import ConfigError
from infra.config.placeholders import placeholder_problems
from tests.conftest import stack_values
from workloads.submit.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
RUNBOOK = OPERATIONS[OPERATIONS.index("## From a fresh AWS account"):OPERATIONS.index("## The training image")]
# Steps another part of the project provides; checked once their script exists.
PROVIDED_ELSEWHERE = {"preflight": ROOT / "scripts" / "preflight.py"}


def test_every_make_target_and_script_the_runbook_names_exists() -> None:
    makefile = (ROOT / "Makefile").read_text()
    for target in sorted(set(re.findall(r"`make ([a-z-]+)", RUNBOOK))):
        if target in PROVIDED_ELSEWHERE and not PROVIDED_ELSEWHERE[target].exists():
            continue
        assert re.search(rf"^{target}:", makefile, re.M), f"make {target}"
    for script in sorted(set(re.findall(r"scripts/([a-z_]+\.py)", RUNBOOK))):
        if ROOT / "scripts" / script in PROVIDED_ELSEWHERE.values():
            continue
        assert (ROOT / "scripts" / script).is_file(), script


def test_every_submit_subcommand_the_runbook_uses_exists() -> None:
    (commands,) = [action for action in build_parser()._actions if action.dest == "command"]
    used = set(re.findall(r"workloads\.submit --stack \S+ ([a-z]+)", RUNBOOK))
    assert used and used <= set(commands.choices or {})


def test_the_quoted_errors_are_the_ones_printed() -> None:
    (path, why), *_ = placeholder_problems(stack_values("dev"), deploying=True)
    assert ConfigError([(path, why)]).lines()[0] in RUNBOOK
    prod = ClusterConfig.model_validate(stack_values("prod")["ml-cluster:cluster"])
    ((path, why),) = reachability_problems(prod, DeployConfig())
    assert ConfigError([(path, why)]).lines()[0] in RUNBOOK
