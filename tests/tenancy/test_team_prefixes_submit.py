"""One rule for a team Job's bucket prefixes: `submit render` against the published facts of the staging stack (two
tenant teams, vision and language) refuses what the stack file refuses, with the same words, and renders what it
allows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config.schema import ConfigError
from tests.tenancy.teams import team_job
from workloads.cluster_facts import facts_from_dict
from workloads.submit.cli import main


def _job(dataset: str, checkpoint: str, team: str | None = "vision") -> dict[str, Any]:
    """A Job that fits staging's l40s nodes (4 GPUs each)."""
    job = {**team_job("vision", dataset, checkpoint, gpu_type="l40s"), "gpus": 4, "team": team}
    return {k: v for k, v in job.items() if v is not None}


def _mixture(sources: list[dict[str, Any]], team: str | None = "vision") -> dict[str, Any]:
    """A team Job (your own command) reading a mixture of `sources`."""
    job = {**_job("vision/imagenet/", "vision/run1/", team), "command": ["python", "mix.py"]}
    job["dataset"] = {"mixture": sources, "mountPath": "/data", "staging": "copy", "stagedSize": "100Gi"}
    return job


OWN = {"bucket": "datasets", "prefix": "vision/imagenet/", "weight": 0.7}
DATASETS = "s3://mlc-staging-datasets-111122223333"  # staging's datasets bucket in the plan's account (jobFacts)
NO_TEAM = "a Job of no team names no team's prefix"


def _no_team_uri(uri: str) -> dict[str, Any]:
    """A Job of no team reading `uri` (the shared Jobs role reads the whole bucket it names), writing outside the
    teams' prefixes."""
    job = _job("vision/imagenet/", "shared/run1/", team=None)
    job["dataset"] = {"uri": uri, "mountPath": "/data", "staging": "copy", "stagedSize": "100Gi"}
    return job


# (the Job, the field, the reason): the stack check's and submit's words alike
REFUSED = [
    (_mixture([OWN, {"bucket": "datasets", "prefix": "language/pile/"}]), "dataset.mixture[1].prefix",
     "datasets/language/pile/ is team language's data, not team vision's"),
    (_mixture([OWN, {"uri": "s3://elsewhere/pile/"}]), "dataset.mixture[1].uri",
     "team vision's Jobs name their data by bucket and prefix (one of the team's own), not by uri"),
    (_mixture([OWN, {"bucket": "datasets", "prefix": "shared/x/"}]), "dataset.mixture[1].prefix",
     "team vision may read only under its own prefixes (datasets/vision/, checkpoints/vision/), not "
     "datasets/shared/x/"),
    (_mixture([{**OWN, "prefix": "vision/a/"}, {"bucket": "datasets", "prefix": "shared/"}], team=None),
     "dataset.mixture[0].prefix", "datasets/vision/a/ is team vision's data"),
    (_job("language/pile/", "vision/run1/"), "dataset.prefix",
     "datasets/language/pile/ is team language's data, not team vision's"),
    (_job("vision/imagenet/", "language/run1/"), "checkpoint.prefix",
     "checkpoints/language/run1/ is team language's data, not team vision's"),
    (_job("shared/x/", "vision/run1/"), "dataset.prefix",
     "team vision may read only under its own prefixes (datasets/vision/, checkpoints/vision/), not "
     "datasets/shared/x/"),
    (_job("vision/a/", "vision/b/", team=None), "dataset.prefix", "datasets/vision/a/ is team vision's data"),
    (_no_team_uri(f"{DATASETS}/vision/imagenet/"), "dataset.uri",
     f"{DATASETS}/vision/imagenet/ is team vision's data (bucket datasets): {NO_TEAM}"),
    (_no_team_uri(f"{DATASETS}/lang"), "dataset.uri",  # a prefix that holds team language's: listing it reads theirs
     f"{DATASETS}/lang is team language's data (bucket datasets): {NO_TEAM}"),
    (_mixture([{"uri": f"{DATASETS}/shared/a/", "weight": 0.5}, {"uri": f"{DATASETS}/vision/", "weight": 0.5}],
              team=None), "dataset.mixture[1].uri", f"{DATASETS}/vision/ is team vision's data (bucket datasets): "
                                                   f"{NO_TEAM}"),
]


@pytest.fixture
def facts_file(stack_plan: Callable[[str], dict[str, Any]], tmp_path: Path) -> Path:
    """The staging stack's jobFacts output (planned once per session), as `submit render --facts` reads it."""
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(stack_plan("staging")["outputs"]["jobFacts"]))
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


@pytest.mark.parametrize(("job", "field", "why"), REFUSED)
def test_the_stack_file_gives_the_same_error(plan_config: Callable[..., dict[str, Any]], job: dict[str, Any],
                                            field: str, why: str) -> None:
    with pytest.raises(ConfigError) as error:
        plan_config("staging", {"ml-cluster:jobs": [job]})
    assert (f"ml-cluster:jobs[0].{field}", why) in error.value.problems, error.value.problems


def test_a_job_under_its_teams_prefixes_renders(facts_file: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec_file(tmp_path, _job("vision/imagenet/", "vision/run1/"))
    assert main(["render", str(spec), "--facts", str(facts_file)]) == 0
    job = next(m for m in yaml.safe_load_all(capsys.readouterr().out) if m["kind"] == "Job")
    assert job["metadata"]["namespace"] == "team-vision"


def test_a_mixture_under_its_teams_prefixes_renders_with_the_buckets_resolved(
        facts_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = [OWN, {"bucket": "checkpoints", "prefix": "vision/distilled/", "weight": 0.3}]
    spec = _spec_file(tmp_path, _mixture(sources))
    assert main(["render", str(spec), "--facts", str(facts_file)]) == 0
    job = next(m for m in yaml.safe_load_all(capsys.readouterr().out) if m["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    buckets = facts_from_dict(json.loads(facts_file.read_text())).buckets or {}
    uris = [f"s3://{buckets['datasets']}/vision/imagenet/", f"s3://{buckets['checkpoints']}/vision/distilled/"]
    assert pod["initContainers"][0]["command"][4:6] == uris
    [mixture] = [e["value"] for e in pod["containers"][0]["env"] if e["name"] == "DATA_MIXTURE"]
    assert json.loads(mixture) == [{"uri": uris[0], "weight": 0.7}, {"uri": uris[1], "weight": 0.3}]


def test_a_job_of_no_team_may_name_by_uri_what_no_team_owns(facts_file: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Outside every team's prefix, or in a bucket that is not the stack's, a uri of a Job of no team renders."""
    for uri in (f"{DATASETS}/shared/x/", f"{DATASETS}/visionary", "s3://someone-elses/vision/imagenet/"):
        spec = _spec_file(tmp_path, _no_team_uri(uri))
        assert main(["render", str(spec), "--facts", str(facts_file)]) == 0, capsys.readouterr().err
        job = next(m for m in yaml.safe_load_all(capsys.readouterr().out) if m["kind"] == "Job")
        assert job["metadata"]["namespace"] == "training"
