"""scripts/check_destroy.py (destroy.yml's guard) and scripts/policy_config.py (the pack config per stack)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"script_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_destroy = script("check_destroy")
policy_config = script("policy_config")


def stacks_dir(tmp_path: Path, **protected_values: str) -> Path:
    """Stack files whose `ml-cluster:protected` line holds the given YAML text (None: no such line)."""
    for stack, value in protected_values.items():
        line = f"  ml-cluster:protected: {value}\n" if value is not None else ""
        (tmp_path / f"Pulumi.{stack}.yaml").write_text(f"config:\n  aws:region: us-west-2\n{line}")
    return tmp_path


def run_guard(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = check_destroy.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.err.splitlines(), captured.out


def test_confirmed_unprotected_stack_may_be_destroyed(capsys: pytest.CaptureFixture[str]) -> None:
    code, errors, out = run_guard(capsys, "--stack", "dev", "--confirm", "dev")
    assert (code, errors) == (0, []) and "dev" in out


def test_confirmation_must_equal_the_stack(capsys: pytest.CaptureFixture[str]) -> None:
    code, errors, _ = run_guard(capsys, "--stack", "dev", "--confirm", "Dev")
    assert code == 2
    assert errors == ["error: confirm: 'Dev' does not equal the stack name 'dev'; type the stack name"]


def test_prod_is_refused_because_its_stack_file_marks_it_protected(capsys: pytest.CaptureFixture[str]) -> None:
    code, errors, _ = run_guard(capsys, "--stack", "prod", "--confirm", "prod")
    assert code == 2 and len(errors) == 1
    assert errors[0].startswith("error: ") and "Pulumi.prod.yaml: ml-cluster:protected is true" in errors[0]
    assert "'prod' is protected" in errors[0]


def test_every_problem_is_reported(capsys: pytest.CaptureFixture[str]) -> None:
    code, errors, _ = run_guard(capsys, "--stack", "prod", "--confirm", "dev")
    assert code == 2
    assert [e.split(":")[1].strip() for e in errors][0] == "confirm" and "protected" in errors[1]


@pytest.mark.parametrize("value", ["true", '"true"', "'True'"])
def test_protected_as_boolean_or_as_the_string_pulumi_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    directory = stacks_dir(tmp_path, lab=value)
    code, errors, _ = run_guard(capsys, "--stack", "lab", "--confirm", "lab", "--stacks-dir", str(directory))
    assert code == 2 and "protected is true" in errors[0]


@pytest.mark.parametrize("value", ["false", '"false"', None])
def test_unprotected_or_unset_is_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    directory = stacks_dir(tmp_path, lab=value)
    code, errors, _ = run_guard(capsys, "--stack", "lab", "--confirm", "lab", "--stacks-dir", str(directory))
    assert (code, errors) == (0, [])


def test_a_flag_that_is_not_a_boolean_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = stacks_dir(tmp_path, lab="yes please")
    code, errors, _ = run_guard(capsys, "--stack", "lab", "--confirm", "lab", "--stacks-dir", str(directory))
    assert code == 2
    assert errors == [
        f"error: {directory / 'Pulumi.lab.yaml'}: config.ml-cluster:protected: expected true or false, got 'yes please'"
    ]


def test_unknown_stack_and_odd_names_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, errors, _ = run_guard(capsys, "--stack", "qa", "--confirm", "qa", "--stacks-dir", str(tmp_path))
    assert code == 2 and errors == [f"error: stack: no stack file {tmp_path / 'Pulumi.qa.yaml'}"]
    code, errors, _ = run_guard(capsys, "--stack", "../prod", "--confirm", "../prod")
    assert code == 2 and errors[0].startswith("error: stack: '../prod' is not a stack name")


def test_cli_exits_2_with_one_line_and_no_traceback() -> None:
    command = [sys.executable, str(ROOT / "scripts/check_destroy.py"), "--stack", "prod", "--confirm", "prod"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr
    missing = subprocess.run(command[:2], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and missing.stderr.startswith("error: arguments: ")


def test_policy_config_carries_the_protected_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "policy-config.json"
    assert policy_config.main(["--stack", "prod", "--out", str(out)]) == 0
    config = json.loads(out.read_text())
    assert config == {
        "prod-training-pools-spot": {"protected": True},
        "protected-stateful-resources": {"protected": True},
    }
    assert list(out.parent.iterdir()) == [out]  # no temp file left behind
    assert policy_config.main(["--stack", "dev"]) == 0
    assert all(v == {"protected": False} for v in json.loads(capsys.readouterr().out).values())


def test_policy_config_for_a_missing_stack_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert policy_config.main(["--stack", "qa", "--stacks-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: stack: no stack file ")
