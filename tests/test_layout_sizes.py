"""The house's size rule, checked: no function over 120 lines, no module over 600, in the code that ships or runs
(infra, workloads, scripts, benchmarks, examples)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("infra", "workloads", "scripts", "benchmarks", "examples")
MAX_FUNCTION_LINES = 120
MAX_FILE_LINES = 600


def _sources() -> list[Path]:
    return sorted(path for package in PACKAGES for path in (REPO / package).rglob("*.py")
                  if "venv" not in path.parts and "node_modules" not in path.parts)


def oversized(path: Path) -> list[str]:
    """`file:line name (N lines)` for each function over MAX_FUNCTION_LINES, and the file if over MAX_FILE_LINES."""
    text = path.read_text()
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    found = [f"{where} ({text.count(chr(10))} lines)"] if text.count("\n") > MAX_FILE_LINES else []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
            length = node.end_lineno - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_the_finder_finds_a_long_function_and_a_long_file(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "long.py"
    path.write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n" + "#\n" * MAX_FILE_LINES)
    assert oversized(path) == [f"{path} ({MAX_FUNCTION_LINES + 4 + MAX_FILE_LINES + 1} lines)",
                               f"{path}:1 long ({MAX_FUNCTION_LINES + 1} lines)"]


def test_no_function_or_module_over_the_limits() -> None:
    assert [problem for path in _sources() for problem in oversized(path)] == []
