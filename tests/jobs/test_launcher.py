"""Every run of a spec's own `command:` goes under the launcher (workloads/train/launch.py: torchrun in-process, exit
codes the Job acts on), as the bundled trainer's gangs do; `launcher: none` opts out, and the plan and `submit
render` say what that costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs.facts import ALL_FACTS
from tests.jobs.test_examples import TARGET_STACK
from workloads.jobspec import JobSpecError, load_job_file, parse_spec, render_job
from workloads.jobspec.launcher import LAUNCH, OPT_OUT_NOTE, launched_command, launcher_notes

ROOT = Path(__file__).resolve().parents[2]
# every spec file under workloads/jobs/ and examples/ (the user-facing ones target dev; the FSDP example a
# multi-node H100 pool, which prod has)
EXAMPLE_TARGETS = {"train-fsdp-job.yaml": "prod"}
EXAMPLE_SPECS = [(f"workloads/jobs/{name}", stack) for name, stack in sorted(TARGET_STACK.items())] + [
    (str(path.relative_to(ROOT)), EXAMPLE_TARGETS.get(path.name, "dev"))
    for path in sorted((ROOT / "examples").glob("*.yaml"))]


def _train(manifests: list[dict]) -> dict:
    (run,) = [m for m in manifests if m["kind"] in ("Job", "JobSet", "TrainJob")]
    template = run["spec"]["template"]["spec"] if run["kind"] == "Job" else None
    assert template is not None, run["kind"]
    return next(c for c in template["containers"] if c["name"] == "train")


@pytest.mark.parametrize(("path", "stack"), EXAMPLE_SPECS, ids=[p for p, _ in EXAMPLE_SPECS])
def test_every_example_spec_with_a_command_runs_it_under_the_launcher(path: str, stack: str) -> None:
    for spec in load_job_file(ROOT / path):
        if spec.command is None or spec.kind != "Job":
            continue
        train = _train(render_job(spec, ALL_FACTS[stack]))
        assert train["command"][:3] == LAUNCH, (path, train["command"])
        assert train["command"] == launched_command(list(spec.command))
        env = {item["name"]: item.get("value") for item in train["env"]}
        assert env["DISRUPTION_EXIT_CODE"] == "43" and env["CONFIG_ERROR_EXIT_CODE"] == "42"
        assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) == spec.grace_seconds() - 5
        assert "PET_NNODES" in env or env.get("PET_STANDALONE") == "1"


def test_the_rendered_command_before_and_after() -> None:
    assert launched_command(["python", "/app/train_plain.py"]) == [
        "python", "-m", "workloads.train.launch", "--no-python", "python", "/app/train_plain.py"]
    # a torchrun command keeps its options; one that already names the launcher is left alone
    assert launched_command(["torchrun", "--nproc-per-node", "8", "/app/t.py"]) == [
        *LAUNCH, "--nproc-per-node", "8", "/app/t.py"]
    assert launched_command(["python3", "-m", "torch.distributed.run", "-m", "pkg"]) == [*LAUNCH, "-m", "pkg"]
    assert launched_command([*LAUNCH, "/app/t.py"]) == [*LAUNCH, "/app/t.py"]
    assert launched_command(["/app/run.sh", "--fast"]) == [*LAUNCH, "--no-python", "/app/run.sh", "--fast"]


def _spec(**extra: object) -> dict:
    return {"name": "own", "imageTag": "1.0", "gpus": 1, "gpuType": "a10g", "command": ["python", "/app/t.py"],
            **extra}


def test_a_spec_that_opts_out_runs_its_command_as_written_with_a_note() -> None:
    facts = ALL_FACTS["dev"]
    manifests = render_job(parse_spec(_spec(launcher="none", nodes=2)), facts)
    train = _train(manifests)
    assert train["command"] == ["python", "/app/t.py"]
    (note,) = launcher_notes(manifests, facts.label_prefix)
    assert note.startswith("job training/own-") and note.endswith(OPT_OUT_NOTE)
    assert launcher_notes(render_job(parse_spec(_spec(nodes=2)), facts), facts.label_prefix) == []


def test_only_a_command_can_opt_out() -> None:
    spec = _spec(launcher="none")
    del spec["command"]
    with pytest.raises(JobSpecError, match="launcher: none runs your own command as written"):
        parse_spec(spec)


def test_the_plan_notes_a_run_that_opts_out() -> None:
    from infra.plan.view import plan_job_notes

    facts = ALL_FACTS["dev"]
    job = next(m for m in render_job(parse_spec(_spec(launcher="none", nodes=2)), facts) if m["kind"] == "Job")
    plan = {"resources": [{"type": "kubernetes:batch/v1:Job", "name": "mlc-dev-jobs-own", "inputs": job}],
            "outputs": {"jobFacts": {"label_prefix": facts.label_prefix}}}
    assert plan_job_notes(plan) == [f"job training/{job['metadata']['name']} {OPT_OUT_NOTE}"]
