"""The data tools' rooms and the house's import rule, read from the source (every import that runs counts: at module
level or inside a function; an import under `if TYPE_CHECKING:` never runs and is not an arrow).

workloads/data/ holds four rooms (docs/architecture.md): format (what a dataset is on disk) at the bottom, moving
(bytes between disks and buckets) above it, writing and reading beside each other above both; the public surfaces
(api.py, mixed.py, __main__.py, tables_cli.py) above the rooms. No circle anywhere in the house.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("workloads", "infra", "benchmarks", "scripts")
ROOMS = {"format": set(), "moving": {"format"}, "writing": {"format", "moving"}, "reading": {"format", "moving"}}
# helpers below workloads/data
OUTSIDE = ("workloads.safeio", "workloads.awsenv", "workloads.metrics_http", "workloads.parentwatch")
# Known arrows up out of the rooms, each to be removed (not to be added to): none left.
KNOWN_UP: set[str] = set()


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "venv" in path.parts or "node_modules" in path.parts:
                continue
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        type_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
                     for statement in node.body for inner in ast.walk(statement)}
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target)
                # a package's own __init__ (the parent every submodule imports anyway) is not an arrow
                if found and found != name and not name.startswith(found + "."):
                    edges[name].add(found)
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_the_circle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(edges) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_the_house() -> None:
    assert _circles(_graph()) == []


def test_each_data_room_imports_only_the_rooms_below_it() -> None:
    wrong = []
    for name, targets in _graph().items():
        parts = name.split(".")
        if parts[:2] != ["workloads", "data"] or len(parts) < 4:
            continue
        room = parts[2]
        for target in targets:
            if not target.startswith("workloads."):
                continue
            tparts = target.split(".")
            if tparts[:2] != ["workloads", "data"]:
                if target not in OUTSIDE and f"{name} -> {target}" not in KNOWN_UP:
                    wrong.append(f"{name} -> {target}")
            elif len(tparts) < 3 or tparts[2] not in ROOMS:
                wrong.append(f"{name} -> {target} (a public surface above the rooms)")
            elif tparts[2] != room and tparts[2] not in ROOMS[room]:
                wrong.append(f"{name} -> {target}")
    assert wrong == []
