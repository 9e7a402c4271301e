"""Rough edges a new user hits in the CLIs: one clear line each instead of a silent surprise or a dead end."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import plan as plan_cli

REPO = Path(__file__).resolve().parents[2]


def test_config_of_another_stack_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: --stack dev --config Pulumi.prod.yaml planned prod's settings under dev's names, silently."""
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text((REPO / "stacks" / "Pulumi.prod.yaml").read_text())
    assert plan_cli.main(["--stack", "dev", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --config: {path} is stack prod's file, but --stack is dev: name the same stack in both "
                   "(or copy the file to Pulumi.dev.yaml)"]


def test_cost_outside_the_fixture_regions_points_at_aws_prices(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `no fixture response ...; add one to price this offline` and nothing about PRICES=aws."""
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text((REPO / "stacks" / "Pulumi.dev.yaml").read_text().replace("us-west-2", "eu-west-1"))
    assert plan_cli.main(["--stack", "dev", "--config", str(path), "--cost"]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "no fixture response for ec2:eu-west-1:" in line and "make cost PRICES=aws" in line
    assert len(line) < 250 and "{" not in line  # before: ~700 characters with the request's JSON in them


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "missing"])
def test_a_diff_against_something_that_is_not_a_plan_file_is_one_line(tmp_path: Path, kind: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a FIFO blocked forever, a link to /dev/zero ran out of memory (MemoryError traceback). The plan
    file is read like every other untrusted file: a regular file of bounded size, read before anything is planned."""
    import os

    path = tmp_path / "old.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    assert plan_cli.main(["--stack", "dev", "--diff", str(path)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {path}: "), line
    assert {"fifo": "FIFO", "dev-zero": "character device", "directory": "directory",
            "missing": "does not exist"}[kind] in line, line
