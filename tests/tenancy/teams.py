"""Two tenant teams on the prod stack file, shared by the tenancy tests."""

from __future__ import annotations

from typing import Any

from tests.conftest import stack_values

VISION_ENGINEERS = "arn:aws:iam::123456789012:role/vision-engineers"
LANGUAGE_ENGINEERS = "arn:aws:iam::123456789012:role/language-engineers"
AUDITOR = "arn:aws:iam::123456789012:user/auditor"  # views both teams: one access entry, two namespaces

TEAMS: list[dict[str, Any]] = [
    {"name": "vision", "namespace": "team-vision", "quotas": [{"flavor": "h100", "gpus": 16, "borrowingLimit": 8}],
     "datasets": [{"bucket": "datasets", "prefix": "vision/"}],
     "checkpoints": [{"bucket": "checkpoints", "prefix": "vision/"}],
     "members": [{"principalArn": VISION_ENGINEERS, "access": "edit"},
                 {"principalArn": AUDITOR, "access": "view"},
                 {"group": "vision-oncall", "access": "view"}],
     "volume": {"uid": 20001, "gid": 20001}},
    {"name": "language", "namespace": "team-language", "quotas": [{"flavor": "a100", "gpus": 8}],
     "datasets": [{"bucket": "datasets", "prefix": "language/"}],
     "checkpoints": [{"bucket": "checkpoints", "prefix": "language/"}],
     "members": [{"principalArn": LANGUAGE_ENGINEERS}, {"principalArn": AUDITOR, "access": "view"}],
     "volume": {"uid": 20002, "gid": 20002, "claim": "shared", "size": "2Ti"}},
]


def prod_with_teams(jobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Overrides for plan_config("prod", ...): Kueue with the two teams, and optionally other Jobs."""
    kueue = {**stack_values("prod")["ml-cluster:kueue"], "teams": TEAMS}
    overrides: dict[str, Any] = {"ml-cluster:kueue": kueue}
    if jobs is not None:
        overrides["ml-cluster:jobs"] = jobs
    return overrides


def team_job(team: str, dataset_prefix: str, checkpoint_prefix: str, gpu_type: str = "h100") -> dict[str, Any]:
    return {"name": f"{team}-train", "imageTag": "0.1.0", "team": team, "gpus": 8, "gpuType": gpu_type,
            "dataset": {"bucket": "datasets", "prefix": dataset_prefix, "mountPath": "/data", "staging": "copy",
                        "stagedSize": "100Gi"},
            "checkpoint": {"bucket": "checkpoints", "prefix": checkpoint_prefix}}
