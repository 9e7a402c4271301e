"""What the workflows promise, read from their YAML: pinned actions, least permissions, gates and order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW_DIR = ROOT / ".github/workflows"
# An exact release tag (v1.2.3) or a full commit SHA; never a moving ref such as v4 or main.
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@(v\d+\.\d+\.\d+|[0-9a-f]{40})$")


def load(name: str) -> dict[str, Any]:
    document = yaml.safe_load((WORKFLOW_DIR / name).read_text())
    document["on"] = document.pop(True, document.get("on"))  # YAML 1.1 reads the key `on` as True
    return document


def steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return job.get("steps", [])


def uses(job: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [s for s in steps(job) if s.get("uses", "").split("@")[0] == action]


def runs(job: dict[str, Any]) -> str:
    return "\n".join(s.get("run", "") for s in steps(job))


ALL = ["preview.yml", "deploy.yml", "destroy.yml", "scan.yml", "release.yml"]


@pytest.mark.parametrize("name", ALL)
def test_every_action_is_pinned_to_an_exact_version(name: str) -> None:
    for job_name, job in load(name)["jobs"].items():
        for step in steps(job):
            if "uses" in step:
                assert PINNED.match(step["uses"]), f"{name}: {job_name}: {step['uses']} is not pinned"


@pytest.mark.parametrize("name", ALL)
def test_least_privilege_permissions(name: str) -> None:
    workflow = load(name)
    assert workflow["permissions"] == {"contents": "read"}
    for job_name, job in workflow["jobs"].items():
        granted = job.get("permissions", {})
        assert set(granted.values()) <= {"read", "write"}
        assumes_role = bool(uses(job, "aws-actions/configure-aws-credentials"))
        assert (granted.get("id-token") == "write") == assumes_role, f"{name}: {job_name}: id-token"
        comments = bool(uses(job, "marocchino/sticky-pull-request-comment")) or any(
            s["with"].get("comment-on-pr") for s in uses(job, "pulumi/actions")
        )
        assert (granted.get("pull-requests") == "write") == comments, f"{name}: {job_name}: pull-requests"
        assert set(granted) <= {"contents", "id-token", "pull-requests"}


@pytest.mark.parametrize("name", ALL)
def test_aws_credentials_come_from_oidc_roles_only(name: str) -> None:
    text = (WORKFLOW_DIR / name).read_text()
    assert "aws-access-key-id" not in text and "AWS_SECRET_ACCESS_KEY" not in text
    for job in load(name)["jobs"].values():
        for step in uses(job, "aws-actions/configure-aws-credentials"):
            assert step["with"]["role-to-assume"].startswith("${{ vars.")


def test_preview_runs_per_pull_request_and_cancels_stale_runs() -> None:
    workflow = load("preview.yml")
    assert list(workflow["on"]) == ["pull_request"]
    assert "github.event.pull_request.number" in workflow["concurrency"]["group"]
    assert workflow["concurrency"]["cancel-in-progress"] is True


def test_preview_offline_job_tests_plans_head_and_base_and_comments() -> None:
    job = load("preview.yml")["jobs"]["offline"]
    script = runs(job)
    assert "make test" in script
    assert 'scripts/plan.py --stack "$stack" --json' in script
    assert "pull_request.base.sha" in str(job) and "git worktree add" in script
    assert '--diff "plans/base/$stack.json"' in script
    assert '--manifests "manifests/$stack"' in script
    (comment,) = uses(job, "marocchino/sticky-pull-request-comment")
    assert comment["with"] == {"header": "offline-plan", "path": "plan-diff.md"}
    assert comment["if"] == "github.event.pull_request.head.repo.full_name == github.repository"  # forks
    (upload,) = uses(job, "actions/upload-artifact")
    assert "manifests/" in upload["with"]["path"]
    assert "if" not in job  # runs everywhere, forks included: no credentials needed


def test_preview_cloud_job_is_gated_on_the_role_and_applies_the_policy_pack() -> None:
    job = load("preview.yml")["jobs"]["preview"]
    assert "vars.AWS_PREVIEW_ROLE_ARN != ''" in job["if"]
    assert "head.repo.full_name == github.repository" in job["if"]
    assert job["strategy"]["matrix"]["stack"] == ["dev", "staging", "prod"]
    (preview,) = uses(job, "pulumi/actions")
    options = preview["with"]
    assert options["command"] == "preview" and options["stack-name"] == "${{ matrix.stack }}"
    assert options["diff"] is True and options["comment-on-pr"] is True
    assert options["policyPacks"] == "infra/policy/pack"
    assert "policy-config.json" in options["policyPackConfigs"]
    assert 'scripts/policy_config.py --stack "$STACK"' in runs(job)


def test_deploy_goes_dev_then_staging_then_prod_each_refreshing_first() -> None:
    workflow = load("deploy.yml")
    assert workflow["on"] == {"push": {"branches": ["main"]}}
    jobs = dict(workflow["jobs"])
    runners = jobs.pop("runners")
    assert list(jobs) == ["dev", "staging", "prod"]
    assert jobs["dev"]["needs"] == "runners" and jobs["staging"]["needs"] == ["runners", "dev"]
    assert jobs["prod"]["needs"] == ["runners", "staging"]
    assert runners["if"] == "vars.DEPLOY_ENABLED == 'true'"  # the gate: every stage needs this job
    for stack, job in jobs.items():
        assert job["environment"] == stack  # reviewers and the environment's OIDC role
        assert job["concurrency"] == {"group": f"pulumi-{stack}", "cancel-in-progress": False}
        commands = [(s["with"]["command"], s["with"]["stack-name"]) for s in uses(job, "pulumi/actions")]
        assert commands == [("refresh", stack), ("up", stack)]
        (up,) = [s for s in uses(job, "pulumi/actions") if s["with"]["command"] == "up"]
        assert up["with"]["policyPacks"] == "infra/policy/pack"
        assert f"scripts/policy_config.py --stack {stack}" in runs(job)


def test_destroy_is_manual_confirmed_guarded_and_refreshes_first() -> None:
    workflow = load("destroy.yml")
    assert list(workflow["on"]) == ["workflow_dispatch"]
    inputs = workflow["on"]["workflow_dispatch"]["inputs"]
    assert inputs["stack"]["required"] is True and inputs["confirm"]["required"] is True
    guard, destroy = workflow["jobs"]["guard"], workflow["jobs"]["destroy"]
    guard_command = 'scripts/check_destroy.py --stack "$STACK" --confirm "$CONFIRM"'
    assert guard_command in runs(guard)
    assert destroy["needs"] == "guard" and guard_command in runs(destroy)
    assert destroy["environment"] == "${{ inputs.stack }}"
    # Inputs reach the shell through env, never spliced into the script (no injection).
    assert "${{ inputs." not in runs(guard) + runs(destroy)
    commands = [s["with"]["command"] for s in uses(destroy, "pulumi/actions")]
    assert commands == ["refresh", "destroy"]


@pytest.mark.parametrize(("name", "job", "stack"), [
    ("deploy.yml", "dev", ".dev"), ("deploy.yml", "staging", ".staging"), ("deploy.yml", "prod", ".prod"),
    ("preview.yml", "preview", "[matrix.stack]"), ("destroy.yml", "destroy", "[inputs.stack]")])
def test_each_stack_runs_on_the_runner_its_stack_file_names(name: str, job: str, stack: str) -> None:
    jobs = load(name)["jobs"]
    source = "guard" if name == "destroy.yml" else "runners"
    assert jobs[job]["runs-on"] == "${{ fromJSON(needs." + source + ".outputs.labels)" + stack + " }}"
    assert source in jobs[job]["needs"]
    runners = jobs[source]
    assert runners["outputs"] == {"labels": "${{ steps.labels.outputs.labels }}"}
    stacks = '"$STACK"' if name == "destroy.yml" else "dev staging prod"
    assert f'scripts/deploy_runner.py {stacks} --github-output "$GITHUB_OUTPUT"' in runs(runners)
    assert "permissions" not in runners  # no credentials: it only reads the stack files
