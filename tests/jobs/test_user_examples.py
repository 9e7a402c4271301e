"""The user-facing examples/ Job spec: it renders on the stack it targets, runs the user's command under the launcher
(torchrun in-process: the exit codes the Job acts on), and gives the script the data and checkpoint paths it reads
from the environment."""

from __future__ import annotations

from pathlib import Path

from tests.jobs.facts import ALL_FACTS
from tests.jobs.jobrules import check_companion, check_job
from workloads.jobspec import load_job_file, render_job

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_plain_pytorch_job_renders_the_users_command_on_dev() -> None:
    (spec,) = load_job_file(EXAMPLES / "plain-pytorch-job.yaml")
    facts = ALL_FACTS["dev"]
    job, *companions = render_job(spec, facts)
    check_job(job)
    for companion in companions:
        check_companion(companion, job)
    pod = job["spec"]["template"]["spec"]
    train = next(c for c in pod["containers"] if c["name"] == "train")
    assert train["image"] == f"{facts.image_repository}:plain-0.1.0"
    assert train["command"] == ["python", "-m", "workloads.train.launch", "--no-python", "python",
                                "/app/train_plain.py"]
    assert train["args"] == list(spec.args)  # nothing implied: no --data, no --resume
    env = {e["name"]: e.get("value") for e in train["env"]}
    assert env["DATA_DIR"] == "/data/my-set" and env["DATA_STAGING"] == "cache"
    assert env["CHECKPOINT_DIR"] == spec.checkpoint.mount_path  # type: ignore[union-attr]
    stagers = [c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    assert stagers, "staging: cache runs the stager as a native sidecar"


def test_example_script_reads_what_the_job_sets() -> None:
    script = (EXAMPLES / "train_plain.py").read_text()
    assert 'os.environ.get("DATA_DIR")' in script and 'os.environ.get("CHECKPOINT_DIR")' in script
    dockerfile = (EXAMPLES / "Dockerfile").read_text()
    assert "/app/train_plain.py" in dockerfile
