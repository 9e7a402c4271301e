"""One rule for a team Job's bucket prefixes: `submit render` against the published facts of prod with two tenant
teams refuses what the stack file refuses, with the same words, and renders what it allows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from infra.plan.engine import STACKS_DIR, plan_stack
from tests.tenancy.teams import prod_with_teams, team_job
from workloads.cluster_facts import facts_from_dict
from workloads.submit.cli import main

# (the Job, the field, the reason): the stack check's and submit's words alike
REFUSED = [
    (team_job("vision", "language/pile/", "vision/run1/"), "dataset.prefix",
     "datasets/language/pile/ is team language's data, not team vision's"),
    (team_job("vision", "vision/imagenet/", "language/run1/"), "checkpoint.prefix",
     "checkpoints/language/run1/ is team language's data, not team vision's"),
    (team_job("vision", "shared/x/", "vision/run1/"), "dataset.prefix",
     "team vision may read only under its own prefixes (datasets/vision/, checkpoints/vision/), not "
     "datasets/shared/x/"),
    ({k: v for k, v in team_job("vision", "vision/a/", "vision/b/").items() if k != "team"}, "dataset.prefix",
     "datasets/vision/a/ is team vision's data"),
]


def _plan(tmp_path: Path, jobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    document = yaml.safe_load((STACKS_DIR / "Pulumi.prod.yaml").read_text())
    document["config"].update(prod_with_teams(jobs=jobs))
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(document))
    return plan_stack("prod", path)


@pytest.fixture(scope="module")
def facts_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """prod with the two tenant teams and no Jobs: its jobFacts output, as `submit render --facts` reads it."""
    tmp = tmp_path_factory.mktemp("teams")
    facts = _plan(tmp, [])["outputs"]["jobFacts"]
    path = tmp / "facts.json"
    path.write_text(json.dumps(facts))
    return path


def test_the_published_facts_carry_each_teams_prefixes(facts_file: Path) -> None:
    teams = facts_from_dict(json.loads(facts_file.read_text())).teams or {}
    assert [(name, team.datasets, team.checkpoints) for name, team in sorted(teams.items())] == [
        ("language", ("datasets/language/",), ("checkpoints/language/",)),
        ("vision", ("datasets/vision/",), ("checkpoints/vision/",))]


def _spec_file(tmp_path: Path, job: dict[str, Any]) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize(("job", "field", "why"), REFUSED)
def test_submit_render_refuses_a_job_outside_its_teams_prefixes(facts_file: Path, tmp_path: Path, job: dict[str, Any],
                                                                field: str, why: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec_file(tmp_path, job)
    assert main(["render", str(spec), "--facts", str(facts_file)]) == 2
    assert capsys.readouterr().err == f"error: {spec}: {field}: {why}\n"
    assert main(["submit", str(spec), "--facts", str(facts_file)]) == 2  # refused before any API call
    assert capsys.readouterr().err == f"error: {spec}: {field}: {why}\n"


def test_the_stack_file_gives_the_same_error(tmp_path: Path) -> None:
    job, field, why = REFUSED[0]
    with pytest.raises(ConfigError) as error:
        _plan(tmp_path, [job])
    assert (f"ml-cluster:jobs[0].{field}", why) in error.value.problems, error.value.problems


def test_a_job_under_its_teams_prefixes_renders(facts_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec_file(tmp_path, team_job("vision", "vision/imagenet/", "vision/run1/"))
    assert main(["render", str(spec), "--facts", str(facts_file)]) == 0
    job = next(m for m in yaml.safe_load_all(capsys.readouterr().out) if m["kind"] == "Job")
    assert job["metadata"]["namespace"] == "team-vision"
