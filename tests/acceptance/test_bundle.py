"""The evidence bundle's format: the committed JSON Schema is the model's, a good bundle passes both the schema (any
validator: jsonschema here) and the kit's own check, and a bad one fails with the field named."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from infra.acceptance.bundle import SCHEMA_PATH, SUMMARY, BundleError, check_bundle, schema_text

GOOD: dict[str, Any] = {
    "schema": "ml-cluster/acceptance-summary/v1", "stack": "dev",
    "git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False,
    "started": "2026-11-27T01:00:00Z", "ended": "2026-11-27T03:10:00Z", "result": "failed",
    "failed_step": "allreduce", "keep": False,
    "steps": [
        {"name": "up", "commands": ["pulumi up --stack dev --yes --non-interactive"], "status": "passed",
         "started": "2026-11-27T01:00:00Z", "ended": "2026-11-27T01:24:10Z", "exit_status": 0, "deadline_s": 7200,
         "log": "01-up.log", "figures": {"up_seconds": 1450.2}, "note": None},
        {"name": "allreduce", "commands": ["python -m workloads.submit --stack dev logs acceptance-allreduce-1"],
         "status": "failed", "started": "2026-11-27T01:30:00Z", "ended": "2026-11-27T01:40:00Z", "exit_status": 1,
         "deadline_s": 3600, "log": "02-allreduce.log",
         "figures": {"allreduce_busbw_gbps": 11.8, "allreduce_floor_gbps": 20.0, "allreduce_passed": False},
         "note": "python -m workloads.submit --stack dev watch acceptance-allreduce-1 exited 1"},
        {"name": "chaos", "commands": ["probe chaos job=acceptance-allreduce-1"], "status": "not-run",
         "deadline_s": 5400},
    ],
}


def _bundle(folder: Path, summary: dict[str, Any]) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / SUMMARY).write_text(json.dumps(summary))
    for step in summary["steps"]:
        if step.get("log"):
            (folder / step["log"]).write_text("# log\n")
    return folder


def test_the_committed_schema_is_the_models() -> None:
    assert SCHEMA_PATH.read_text() == schema_text(), "regenerate: scripts/acceptance.py --print-schema"


def test_a_good_bundle_passes_the_schema_and_the_check(tmp_path: Path) -> None:
    jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(GOOD)
    summary = check_bundle(_bundle(tmp_path / "b", GOOD))
    assert summary.failed_step == "allreduce" and summary.steps[1].figures["allreduce_busbw_gbps"] == 11.8


def _broken(path: str, value: Any) -> dict[str, Any]:
    summary = copy.deepcopy(GOOD)
    target: Any = summary
    *parents, last = path.split(".")
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is KeyError:
        del target[last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return summary


@pytest.mark.parametrize(("path", "value", "says"), [
    ("git_commit", "HEAD", "git_commit"),
    ("steps.0.status", "ok", "steps.0.status"),
    ("steps.0.started", "2026-11-27 01:00", "steps.0.started"),
    ("steps.1.figures", {"nested": {"a": 1}}, "steps.1.figures.nested"),
    ("result", KeyError, "result"),
    ("extra", 1, "extra"),
])
def test_a_bad_summary_fails_the_schema_and_the_check_naming_the_field(tmp_path: Path, path: str, value: Any,
                                                                      says: str) -> None:
    bad = _broken(path, value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text())).validate(bad)
    with pytest.raises(BundleError) as caught:
        check_bundle(_bundle(tmp_path / "b", bad))
    assert caught.value.where.endswith(f"{SUMMARY}: {says}"), caught.value


@pytest.mark.parametrize(("path", "value", "says"), [
    ("failed_step", "up", "the first failed step is 'allreduce'"),
    ("result", "passed", "result: passed, but a step failed"),
    ("steps.0.exit_status", 3, "passed with exit status 3"),
    ("ended", None, "ended: null exactly while the result is running"),
])
def test_the_check_refuses_what_the_schema_cannot_see(tmp_path: Path, path: str, value: Any, says: str) -> None:
    with pytest.raises(BundleError) as caught:
        check_bundle(_bundle(tmp_path / "b", _broken(path, value)))
    assert says in caught.value.why


def test_a_bundle_without_its_logs_or_its_summary_is_refused(tmp_path: Path) -> None:
    folder = _bundle(tmp_path / "b", GOOD)
    (folder / "02-allreduce.log").unlink()
    with pytest.raises(BundleError, match=r"steps.allreduce.log: 02-allreduce.log is not in the bundle"):
        check_bundle(folder)
    (folder / SUMMARY).write_text("{not json")
    with pytest.raises(BundleError, match=r"summary.json: not JSON \(line 1"):
        check_bundle(folder)
    with pytest.raises(BundleError, match="not a folder"):
        check_bundle(tmp_path / "none")
