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
