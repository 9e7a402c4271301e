"""Views of a plan document: the readable summary, the diff against an earlier plan, and manifest files."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from infra.offline import canonical, kubernetes_objects

Key = tuple[str, str]


def summary(plan: dict[str, Any]) -> str:
    resources = plan["resources"]
    lines = [f"{plan['project']} / {plan['stack']}: {len(resources)} resources", "", "  count  type"]
    for token, count in sorted(Counter(r["type"] for r in resources).items()):
        lines.append(f"  {count:5d}  {token}")
    lines += ["", "resources:"]
    for resource in resources:
        options = resource["options"]
        flags = [flag for flag, on in (("protect", options["protect"]), ("retain", options["retainOnDelete"]),
                                       ("delete-before-replace", options["deleteBeforeReplace"])) if on]
        parent = f"  (in {resource['parent']})" if resource["parent"] else ""
        marks = f"  [{', '.join(flags)}]" if flags else ""
        lines.append(f"  {resource['type']}  {resource['name']}{parent}{marks}")
    if plan.get("outputs"):
        lines += ["", "outputs:"]
        lines += [f"  {key}: {value}" for key, value in plan["outputs"].items()]
    return "\n".join(lines) + "\n"


def _changed_paths(old: Any, new: Any, path: str) -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        paths: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            child = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                paths.append(child)
            else:
                paths.extend(_changed_paths(old[key], new[key], child))
        return paths
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new, strict=True)) for p in _changed_paths(a, b, f"{path}[{i}]")]
    return [] if old == new else [path]


def diff(old_plan: dict[str, Any], new_plan: dict[str, Any]) -> dict[str, Any]:
    """Resources added, removed and changed (with the changed input/option paths), keyed by (type, name)."""
    old = {(r["type"], r["name"]): r for r in old_plan["resources"]}
    new = {(r["type"], r["name"]): r for r in new_plan["resources"]}
    changed = []
    for key in sorted(old.keys() & new.keys()):
        paths = (_changed_paths(old[key]["inputs"], new[key]["inputs"], "inputs")
                 + _changed_paths(old[key]["options"], new[key]["options"], "options")
                 + _changed_paths(old[key]["parent"], new[key]["parent"], "parent")
                 + _changed_paths(old[key]["provider"], new[key]["provider"], "provider"))
        if paths:
            changed.append({"type": key[0], "name": key[1], "paths": paths})
    return {
        "stack": new_plan["stack"],
        "added": [{"type": t, "name": n} for t, n in sorted(new.keys() - old.keys())],
        "removed": [{"type": t, "name": n} for t, n in sorted(old.keys() - new.keys())],
        "changed": changed,
    }


def format_diff(changes: dict[str, Any]) -> str:
    added, removed, changed = changes["added"], changes["removed"], changes["changed"]
    lines = [f"stack {changes['stack']}: {len(added)} to add, {len(removed)} to remove, {len(changed)} to change"]
    lines += [f"+ {item['type']}  {item['name']}" for item in added]
    lines += [f"- {item['type']}  {item['name']}" for item in removed]
    for item in changed:
        lines.append(f"~ {item['type']}  {item['name']}")
        lines += [f"    {path}" for path in item["paths"]]
    return "\n".join(lines) + "\n"


def _file_name(index: int, manifest: dict[str, Any]) -> str:
    metadata = manifest.get("metadata") or {}
    parts = [manifest.get("kind", "object"), metadata.get("namespace") or "", metadata.get("name") or "unnamed"]
    slug = "-".join(part for part in parts if part).lower()
    return f"{index:03d}-{re.sub(r'[^a-z0-9.-]+', '-', slug)}.yaml"


def _object_key(manifest: dict[str, Any]) -> tuple[str, str, str, str]:
    metadata = manifest.get("metadata") or {}
    return (str(manifest.get("kind", "")), str(metadata.get("namespace") or ""), str(metadata.get("name") or ""),
            str(manifest.get("apiVersion", "")))


def write_manifests(plan: dict[str, Any], directory: Path) -> list[Path]:
    """Every Kubernetes object as its own YAML file (ready for `kubectl diff -f DIR`).

    Files are numbered in (kind, namespace, name) order and keys are in the conventional order (apiVersion, kind,
    metadata, spec, ...), so the same plan writes the same bytes on every run. Raises NotADirectoryError if
    `directory` exists and is not a directory. Each file is written to a temporary name, then renamed.
    """
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    manifests = sorted((canonical(resource["inputs"]) for resource in kubernetes_objects(plan)), key=_object_key)
    for index, manifest in enumerate(manifests):
        target = directory / _file_name(index, manifest)
        partial = target.with_name(f".{target.name}.partial")
        with open(partial, "w", encoding="utf-8") as handle:
            handle.write(yaml.safe_dump(manifest, sort_keys=False))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, target)
        written.append(target)
    return written
