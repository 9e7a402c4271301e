"""The deploy workflow runs preflight before touching a stack; the PR comment carries the cost diff."""

from __future__ import annotations

from tests.workflows.test_workflows import load, runs, steps, uses


def test_deploy_runs_preflight_after_credentials_and_before_refresh_and_up() -> None:
    deploy_jobs = {stack: job for stack, job in load("deploy.yml")["jobs"].items() if uses(job, "pulumi/actions")}
    assert set(deploy_jobs) == {"dev", "staging", "prod"}
    for stack, job in deploy_jobs.items():
        names = [s.get("name") or s.get("uses", "").split("@")[0] for s in steps(job)]
        preflight = next(i for i, s in enumerate(steps(job)) if "scripts/preflight.py" in s.get("run", ""))
        assert f"scripts/preflight.py --stack {stack}" in steps(job)[preflight]["run"]
        assert names.index("aws-actions/configure-aws-credentials") < preflight < names.index("pulumi refresh")
        assert len(uses(job, "pulumi/actions")) == 2


def test_preview_comment_has_the_cost_diff_of_every_stack() -> None:
    job = load("preview.yml")["jobs"]["offline"]
    script = runs(job)
    assert 'scripts/plan.py --stack "$stack" --cost --diff "plans/base/$stack.json"' in script
    write = next(s for s in steps(job) if s.get("name") == "Write the plan diff")
    assert "--cost" in write["run"] and "> plan-diff.md" in write["run"]
