"""The data path's users stay on its public surface: the example scripts import only workloads.data.api (and
workloads.cli's argument helpers, and the sharded checkpointer), and the bundled trainer imports no
underscore-private name of workloads.data."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from workloads... import name` and `import workloads...` in the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("workloads"):
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.startswith("workloads")]
    return found


def test_examples_use_only_the_public_data_api() -> None:
    scripts = sorted((ROOT / "examples").glob("*.py"))
    assert len(scripts) >= 3
    for script in scripts:
        modules = {module for module, _ in _imports(script)}
        # the data API, the CLI helpers and the sharded checkpointer (examples/train_fsdp.py)
        assert modules <= {"workloads.data.api", "workloads.cli", "workloads.train.sharded"}, (script.name, modules)
        assert "workloads.data.api" in modules, script.name


def test_the_bundled_trainer_imports_no_private_name_of_the_data_path() -> None:
    private = [(path.name, module, name) for path in sorted((ROOT / "workloads" / "train").glob("*.py"))
               for module, name in _imports(path)
               if module.startswith("workloads.data") and (name.startswith("_") or "._" in module)]
    assert not private, private
    trainer = {module for path in (ROOT / "workloads" / "train").glob("*.py") for module, _ in _imports(path)}
    assert "workloads.data.api" in trainer  # reader, feeder and batches come from the public API
