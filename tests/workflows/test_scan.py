"""scripts/scan.py's judgement: a finding passes only with a matching skip line; a stale skip fails the scan."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.scan import ScanError, findings_of, judge, load_skips

REPO = Path(__file__).resolve().parents[2]
REPORT = [
    {"check_type": "kubernetes", "summary": {"passed": 3, "failed": 2},
     "results": {"failed_checks": [
         {"check_id": "CKV_K8S_43", "check_name": "Image should use digest", "resource": "Job.training.a-1234",
          "file_path": "/dev/000-job.yaml"},
         {"check_id": "CKV_K8S_20", "check_name": "privilege escalation", "resource": "Job.training.a-1234",
          "file_path": "/dev/000-job.yaml"}]}},
    {"check_type": "dockerfile", "summary": {"passed": 1, "failed": 0}, "results": {"failed_checks": []}},
]


def _skips(tmp_path: Path, text: str) -> list:
    path = tmp_path / "skips.txt"
    path.write_text(text)
    return load_skips(path)


def test_only_the_listed_check_on_the_listed_objects_is_excused(tmp_path: Path) -> None:
    skips = _skips(tmp_path, "# why each\nCKV_K8S_43 Job.training.* tags until a registry exists\n")
    unexplained, explained, stale = judge(findings_of(REPORT), skips)
    assert [f.check_id for f in unexplained] == ["CKV_K8S_20"]
    assert [(f.check_id, s.why) for f, s in explained] == [("CKV_K8S_43", "tags until a registry exists")]
    assert stale == []


def test_a_skip_that_matches_nothing_is_reported(tmp_path: Path) -> None:
    skips = _skips(tmp_path, "CKV_K8S_43 Job.other.* no such object\n")
    unexplained, _, stale = judge(findings_of(REPORT), skips)
    assert len(unexplained) == 2 and [s.line for s in stale] == [1]


def test_a_skip_line_without_a_reason_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ScanError, match=r"skips.txt:2: expected"):
        _skips(tmp_path, "# header\nCKV_K8S_43 Job.training.*\n")


def test_the_projects_skip_file_parses_and_every_line_has_a_reason() -> None:
    skips = load_skips(REPO / "scripts" / "checkov-skips.txt")
    assert skips and all(len(skip.why.split()) >= 4 for skip in skips)


def _fake_checkov(tmp_path: Path) -> str:
    """A checkov stand-in printing REPORT for every framework (findings as checkov's JSON lists them)."""
    import json
    import sys

    report = tmp_path / "report.json"
    report.write_text(json.dumps(REPORT))
    script = tmp_path / "checkov"
    script.write_text(f"#!{sys.executable}\nprint(open({str(report)!r}).read())\nraise SystemExit(1)\n")
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize("stacks, code, level", [("dev,staging,prod,onprem", 2, "error"), ("mine", 0, "note")])
def test_a_skip_unused_by_ones_own_stack_is_a_note_not_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        stacks: str, code: int, level: str) -> None:
    """`make scan STACK=mine`: the skip file excuses the committed stacks' findings; a line that matches none of
    another stack's findings is said in a note, and only the committed stacks' scan fails on it."""
    import scripts.scan as scan

    monkeypatch.setattr(scan, "_render", lambda stacks, out: out.mkdir(parents=True))
    skips = tmp_path / "skips.txt"
    skips.write_text("CKV_K8S_43 Job.training.* tags\nCKV_K8S_20 Job.training.* why\nCKV_K8S_99 Job.other.* gone\n")
    assert scan.main(["--checkov", _fake_checkov(tmp_path), "--skips", str(skips), "--stacks", stacks]) == code
    err = capsys.readouterr().err
    assert f"{level}: {skips}:3: CKV_K8S_99 Job.other.* matches no finding" in err, err
