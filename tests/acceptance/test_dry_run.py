"""`scripts/acceptance.py --dry-run` prints each step and its exact command and calls nothing; the Job specs it
writes render against the stack's pools; the steps' figures come from the project's own outputs."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from infra.acceptance.plan import ActionResult, allreduce_figures, bench_figures, verify_figures
from tests.acceptance.conftest import run_cli as _run
from tests.jobs.facts import dev_facts
from workloads.submit.inputs import render_spec_file

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _bundle(out: str) -> str:
    [line] = [line for line in out.splitlines() if line.startswith("evidence bundle: ")]
    return line.removeprefix("evidence bundle: ").split("/ ")[0]




def test_the_dry_run_of_dev_prints_every_step_and_its_command(cli: ModuleType, clean_git: None,
                                                             capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    import kubernetes.config

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the dry run called out")

    monkeypatch.setattr(boto3.session, "Session", never)
    monkeypatch.setattr(kubernetes.config, "load_kube_config", never)
    code, out, err = _run(cli, capsys, "--stack", "dev", "--dry-run", "--allreduce-floor", "20",
                          "--gang-spec", "workloads/jobs/resnet50-s3-copy.yaml")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    bundle = _bundle(out)
    assert bundle.startswith("evidence/dev-") and not (ROOT / bundle).exists()
    steps = [line.split(" (")[0].split(". ")[1] for line in lines if line[:2].strip().isdigit()]
    assert steps == ["preflight", "stack-state", "up", "kubeconfig", "image", "verify", "burn-in", "allreduce",
                     "bench-gpu", "chaos", "destroy"]
    submit = ".venv/bin/python -m workloads.submit --stack dev -n training"
    for expected in [
        "    $ .venv/bin/python scripts/preflight.py --stack dev",
        "    $ probe stack_state stack=dev ours=''",
        f"    $ .venv/bin/python scripts/policy_config.py --stack dev --out {bundle}/policy-config.json",
        "    $ pulumi up --stack dev --yes --non-interactive --policy-pack infra/policy/pack --policy-pack-config "
        f"{bundle}/policy-config.json",
        "    $ make -s kubeconfig STACK=dev",
        "    $ pulumi stack output --json --stack dev",
        "    $ make -s push STACK=dev IMAGE_TAG=0.2.0",
        "    $ .venv/bin/python scripts/verify_stack.py --stack dev --json",
        "    skipped: ml-cluster:gpu.health: the burn-in is off in stack dev: no label to check (the all-reduce Job "
        "scales the pool up itself)",
        f"    $ {submit} submit {bundle}/allreduce-job.yaml",
        f"    $ {submit} watch '{{allreduce_job}}' --timeout 3600",
        f"    $ {submit} logs '{{allreduce_job}}'",
        f"    $ {submit} submit workloads/jobs/resnet50-s3-copy.yaml",
        "    $ probe chaos job='{gang_job}' namespace=training",
        f"    $ {submit} delete '{{gang_job}}'",
        "11. destroy (deadline 5400 s) (runs whenever up began, unless KEEP=1)",
        "    $ .venv/bin/python scripts/check_destroy.py --stack dev --confirm dev",
        "    $ probe stack_state stack=dev ours='{interrupted?}'",
        "    $ pulumi destroy --stack dev --yes --non-interactive",
        "    $ probe leftovers stack=dev cluster=ml-dev",
    ]:
        assert expected in lines, expected
    allreduce = yaml.safe_load(out.split(f"--- {bundle}/allreduce-job.yaml\n")[1].split("---")[0])
    assert allreduce["args"] == ["--max-bytes", "2Gi", "--floor", "20"]
    assert (allreduce["nodes"], allreduce["gpus"], allreduce["gpuType"]) == (2, 1, "a10g")


def test_the_dry_run_says_what_a_real_run_would_refuse(cli: ModuleType, clean_git: None,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(cli, capsys, "--stack", "dev", "--dry-run")
    assert code == 0
    warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert [line.split(":")[1].strip() for line in warnings] == ["--allreduce-floor", "--gang-dataset"]
    assert "no published nccl-tests floor for g5.xlarge" in warnings[0]
    assert "pass GANG_DATASET=s3://bucket/prefix" in warnings[1]
    code, out, err = _run(cli, capsys, "--stack", "dev")
    assert (code, out) == (2, "") and err.startswith("error: --allreduce-floor: no published nccl-tests floor")


@pytest.mark.parametrize(("argv", "says"), [
    (["--stack", "prod", "--dry-run"], "error: stacks/Pulumi.prod.yaml: ml-cluster:protected is true"),
    (["--stack", "onprem", "--dry-run"], "error: stacks/Pulumi.onprem.yaml: ml-cluster:platform is onprem"),
    (["--stack", "dev", "--allreduce-floor", "-1"], "error: --allreduce-floor: -1 is not a bandwidth"),
    (["--dry-run"], "error: --stack: required"),
    (["--check-bundle", "/nonexistent"], "error: /nonexistent: not a folder"),
])
def test_bad_input_is_one_error_line_and_exit_2(cli: ModuleType, clean_git: None, capsys: pytest.CaptureFixture[str],
                                                argv: list[str], says: str) -> None:
    code, out, err = _run(cli, capsys, *argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and err.startswith(says), err


def test_prod_with_keep_plans_the_burn_in_and_the_published_floor(cli: ModuleType, clean_git: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(cli, capsys, "--stack", "prod", "--dry-run", "--keep", "--gang-dataset", "s3://data/imagenet")
    assert code == 0 and "warning" not in out
    assert ("    $ probe burn_in_labels pool=gpu-h100 nodes=2 label=ml-cluster.io/gpu-health "
            "pool_label=ml-cluster.io/pool") in out
    assert "--instance-type\n- p5.48xlarge" in out
    assert out.split("11. destroy")[1].splitlines()[1] == "    skipped: KEEP=1: the stack stays up"


def test_the_specs_it_writes_render_for_the_dev_pool(cli: ModuleType, clean_git: None, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(cli, capsys, "--stack", "dev", "--dry-run", "--allreduce-floor", "20", "--gang-dataset",
                     "s3://my-data/imagenet-hdf5")
    bundle = _bundle(out)
    for name in ("allreduce-job.yaml", "bench-gpu-job.yaml", "gang-job.yaml"):
        (tmp_path / name).write_text(out.split(f"--- {bundle}/{name}\n")[1].split("\n---")[0])
        [job, *_] = render_spec_file(str(tmp_path / name), dev_facts())
        pod = job["spec"]["template"]["spec"]
        assert pod["containers"][0]["image"].endswith(":0.2.0")
    capsys.readouterr()


def _result(output: str, seconds: float = 1.0) -> ActionResult:
    return ActionResult(0, output, seconds)


def test_figures_come_from_the_projects_outputs() -> None:
    published = (ROOT / "tests/jobs/data/nccl-tests-2x-p5.48xlarge.txt").read_text()
    figures = allreduce_figures(355.0, "")([_result(""), _result(published)])
    assert figures["allreduce_busbw_gbps"] == 443.72 and figures["allreduce_passed"] is True
    assert figures["allreduce_verdict"] == "bus bandwidth 443.72 GB/s at 2147483648 B against a floor of 355 GB/s"
    assert allreduce_figures(None, "no floor")([_result("")])["allreduce_passed"] is False
    report = {"device": "NVIDIA A10G", "results": [{"model": "resnet50", "gpu_busy_share": 0.9712345}]}
    assert bench_figures([_result("log line\n" + json.dumps(report, indent=2) + "\n")]) == {
        "gpu_device": "NVIDIA A10G", "gpu_busy_share_resnet50": 0.9712}
    assert bench_figures([_result("no json")]) == {}
    checks = [{"name": "a", "status": "PASS"}, {"name": "b", "status": "FAIL"}, {"name": "c", "status": "SKIP"}]
    assert verify_figures([_result(json.dumps(checks))]) == {"checks": 3, "checks_failed": 1, "checks_skipped": 1}



@pytest.mark.slow  # a fresh interpreter imports the config schema and pulumi: seconds (the in-process tests above)
def test_make_acceptance_dry_run_prints_the_steps() -> None:
    import shutil
    import subprocess

    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run([make, "-s", "-o", "setup-plan", "-o", "infra/policy/pack/venv/.deps", "acceptance",
                           "STACK=dev", "DRY_RUN=1", "ALLREDUCE_FLOOR=20",
                           "GANG_SPEC=workloads/jobs/resnet50-s3-copy.yaml"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert " 3. up (deadline 7200 s)" in done.stdout.splitlines()
    assert "    $ probe leftovers stack=dev cluster=ml-dev" in done.stdout.splitlines()


def test_every_planned_command_is_one_the_project_accepts(cli: ModuleType, clean_git: None) -> None:
    """The flags the plan passes exist where it passes them: submit's own parser, each script's options, make's
    targets and variables (a renamed flag fails here, not an hour into a real run)."""
    from infra.acceptance.plan import Command, Options, gpu_pool, plan_steps
    from workloads.submit.cli import build_parser

    cfg = cli._stack_config("prod")
    options = Options(stack="prod", python=".venv/bin/python", bundle="evidence/prod-x", image_tag="0.2.0",
                      gang_spec="workloads/jobs/multi-node-ddp.yaml")
    commands = [action.argv for step in plan_steps(options, cfg, gpu_pool(cfg, cli._shape))
                for action in step.actions if isinstance(action, Command)]
    makefile = (ROOT / "Makefile").read_text()
    for argv in commands:
        if argv[:3] == (".venv/bin/python", "-m", "workloads.submit"):
            build_parser().parse_args(list(argv[3:]))  # exits (SystemExit) on an unknown flag
        elif argv[0] == ".venv/bin/python":
            source = (ROOT / argv[1]).read_text()
            assert all(f'"{word}"' in source for word in argv[2:] if word.startswith("--")), argv
        elif argv[0] == "make":
            target, variables = argv[2], [word.split("=")[0] for word in argv[3:]]
            assert f"\n{target}:" in makefile and all(f"$({name})" in makefile for name in variables), argv
        else:
            assert argv[0] == "pulumi", argv
    assert len(commands) == 17
