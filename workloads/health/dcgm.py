"""`dcgmi diag -r N -j` output (DCGM 4) as findings the verdict can weigh.

The document, as dcgmi builds it (NVIDIA/DCGM v4.5.3 dcgmi/Diag.cpp `HelperJsonBuildOutput`, `HelperJsonAddResult`;
keys in nvvs/include/NvvsJsonStrings.h; schema testing/python3/dcgm_diag_schema.json):

    {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [
        {"name": "software", "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0,
                                          "status": "Pass" | "Fail" | "Warn" | "Skip",
                                          "warnings": [{"warning": "...", "error_id": 52, "error_category": 10,
                                                        "error_severity": 2}],
                                          "info": ["..."]}],
         "test_summary": {"status": "Pass"}}]}],
                         "runtime_error": "..."},      # only when the diagnostic could not run
     "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1, "entities": [{"entity_id": 0, ...}]}],
     "metadata": {"version": "4.5.3", "Driver Version Detected": "580.95.05"}}

A result's status is `Fail` for DCGM_DIAG_RESULT_FAIL and for WARN (Diag.cpp `HelperDisplayDiagResult` shows a
warning as Fail unless asked not to); `Skip` is a test that does not apply (no NVLink on the GPU, ...). The error
severities are dcgmlib/dcgm_errors.h `dcgmErrorSeverity_t`: 1 MONITOR, 2 ISOLATE, 3 UNKNOWN, 4 TRIAGE, 5 CONFIG,
6 RESET.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

DIAG_KEY = "DCGM Diagnostic"
MAX_DIAG_BYTES = 8 * 1024 * 1024  # a level-2 report on 8 GPUs is tens of KiB
SEVERITY_NAMES = {0: "none", 1: "monitor", 2: "isolate", 3: "unknown", 4: "triage", 5: "config", 6: "reset"}
FAILED = {"fail"}
ACCEPTED = {"pass", "skip"}


@dataclass(frozen=True)
class DiagFinding:
    """One test result that is not a pass: where, which test, what DCGM said."""

    test: str
    category: str
    entity: str  # "GPU 3", or "node" for a result not tied to one entity
    status: str
    messages: tuple[str, ...]
    error_ids: tuple[int, ...] = ()
    severity: str = "unknown"

    def line(self) -> str:
        said = "; ".join(self.messages) or "no message"
        ids = f" (DCGM error {', '.join(map(str, self.error_ids))}, {self.severity})" if self.error_ids else ""
        return f"dcgm {self.category}/{self.test} {self.entity}: {self.status}: {said}{ids}"


@dataclass(frozen=True)
class DiagReport:
    """What one diagnostic run said: the tests that ran, the GPUs it saw, every non-passing result."""

    version: str | None
    tests: tuple[str, ...]
    gpus: tuple[int, ...]
    findings: tuple[DiagFinding, ...]
    error: str | None = None  # the diagnostic did not run or its output could not be read

    @property
    def passed(self) -> bool:
        return self.error is None and bool(self.tests) and not self.findings


def parse_diag(text: str) -> DiagReport:
    """The report of one `dcgmi diag -j` run. Never raises on bad input: unreadable output is a report with
    `error` set (a node whose diagnostic cannot even report is not a node to train on)."""
    if len(text.encode("utf-8", "replace")) > MAX_DIAG_BYTES:
        return DiagReport(None, (), (), (), error=f"dcgmi output larger than {MAX_DIAG_BYTES} bytes")
    start = text.find("{")
    if start < 0:
        return DiagReport(None, (), (), (), error=f"dcgmi printed no JSON: {_excerpt(text)}")
    try:
        document, _end = json.JSONDecoder().raw_decode(text[start:])
    except (json.JSONDecodeError, RecursionError) as exc:
        return DiagReport(None, (), (), (), error=f"dcgmi output is not JSON ({exc}): {_excerpt(text)}")
    if not isinstance(document, dict) or not isinstance(document.get(DIAG_KEY), dict):
        return DiagReport(None, (), (), (), error=f"dcgmi output has no {DIAG_KEY!r} object")
    diag = document[DIAG_KEY]
    found = document.get("metadata")
    metadata: dict[str, object] = found if isinstance(found, dict) else {}
    version = _text(metadata.get("version")) or _text(diag.get("version"))
    runtime_error = _text(diag.get("runtime_error"))
    gpus: tuple[int, ...] = tuple(sorted({entity["entity_id"] for group in _list(document.get("entity_groups"))
                         if isinstance(group, dict) and group.get("entity_group") == "GPU"
                         for entity in _list(group.get("entities"))
                         if isinstance(entity, dict) and isinstance(entity.get("entity_id"), int)}))
    tests: list[str] = []
    findings: list[DiagFinding] = []
    for category in _list(diag.get("test_categories")):
        if not isinstance(category, dict):
            continue
        category_name = _text(category.get("category")) or "unknown"
        for test in _list(category.get("tests")):
            if not isinstance(test, dict):
                continue
            name = _text(test.get("name")) or "unknown"
            tests.append(name)
            results = [result for result in _list(test.get("results")) if isinstance(result, dict)]
            findings += [finding for result in results
                         if (finding := _finding(name, category_name, result)) is not None]
            summary = test.get("test_summary")
            if not results and isinstance(summary, dict):  # a test with no per-entity result: its summary counts
                finding = _finding(name, category_name, summary)
                if finding is not None:
                    findings.append(finding)
    if runtime_error:
        return DiagReport(version, tuple(tests), gpus, tuple(findings), error=f"dcgmi: {runtime_error}")
    if not tests:
        return DiagReport(version, (), gpus, (), error="dcgmi reported no test results")
    return DiagReport(version, tuple(tests), gpus, tuple(findings))


def _finding(test: str, category: str, result: dict[str, object]) -> DiagFinding | None:
    status = _text(result.get("status")) or "missing"
    if status.lower() in ACCEPTED:
        return None
    entity_id = result.get("entity_id")
    group = _text(result.get("entity_group")) or "GPU"
    entity = f"{group} {entity_id}" if isinstance(entity_id, int) else "node"
    warnings = [item for item in _list(result.get("warnings")) if isinstance(item, dict)]
    messages = tuple(" ".join(_text(item.get("warning")).split()) for item in warnings if _text(item.get("warning")))
    ids = tuple(item["error_id"] for item in warnings if isinstance(item.get("error_id"), int))
    severities = [item["error_severity"] for item in warnings if isinstance(item.get("error_severity"), int)]
    severity = SEVERITY_NAMES.get(max(severities), "unknown") if severities else "unknown"
    return DiagFinding(test, category, entity, status, messages, ids, severity)


def _list(value: object) -> list[object]:
    return value if isinstance(value, list) else []


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _excerpt(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat[:limit] + ("..." if len(flat) > limit else "") if flat else "(empty)"
