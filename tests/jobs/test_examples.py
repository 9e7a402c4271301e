"""The example specs under workloads/jobs/: each renders, on the stack it targets, a Job that keeps every rule."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.jobs.facts import ALL_FACTS
from tests.jobs.jobrules import check_companion, check_job
from workloads.jobspec import JobSpecError, load_job_file, render_job

JOBS_DIR = Path(__file__).resolve().parents[2] / "workloads" / "jobs"
TARGET_STACK = {
    "resnet50-s3-copy.yaml": "dev",
    "efs-pvc.yaml": "dev",
    "laion-cache.yaml": "prod",
    "multi-node-ddp.yaml": "prod",
    "nccl-allreduce.yaml": "prod",
}


def test_every_example_has_a_target_stack() -> None:
    assert sorted(path.name for path in JOBS_DIR.glob("*.yaml")) == sorted(TARGET_STACK)


@pytest.mark.parametrize("file_name", sorted(TARGET_STACK))
def test_example_renders_a_valid_job(file_name: str) -> None:
    for spec in load_job_file(JOBS_DIR / file_name):
        job, *companions = render_job(spec, ALL_FACTS[TARGET_STACK[file_name]])
        check_job(job)
        for companion in companions:
            check_companion(companion, job)


def test_examples_cover_the_four_kinds() -> None:
    specs = [spec for name in TARGET_STACK for spec in load_job_file(JOBS_DIR / name)]
    assert any(s.gpus == 1 and s.dataset and s.dataset.bucket and s.dataset.staging == "copy" for s in specs)
    assert any(s.dataset and s.dataset.claim_name and s.dataset.staging == "none" for s in specs)
    assert any(s.dataset and s.dataset.staging == "cache" and "--epochs" in s.args
               and int(s.args[s.args.index("--epochs") + 1]) > 1 for s in specs)
    assert any(s.nodes > 1 and s.dataset and s.dataset.staging == "cache" for s in specs)
    # A shipped example uses no mode kept only for older Jobs.
    assert not any(s.dataset and s.dataset.staging == "rolling" for s in specs)


def test_examples_name_no_account_region_or_physical_bucket() -> None:
    """Each example runs on any stack that has its pools: image by tag, data by the stack's logical bucket."""
    for path in JOBS_DIR.glob("*.yaml"):
        text = path.read_text()
        assert "dkr.ecr" not in text and "s3://" not in text and not re.search(r"\d{12}", text), path.name
        for spec in load_job_file(path):
            assert spec.image is None and spec.image_tag, path.name


def test_job_file_errors_name_the_file_and_the_field(tmp_path: Path) -> None:
    from workloads.jobspec import JobSpecError

    listed = tmp_path / "two.yaml"
    listed.write_text("jobs:\n  - {name: a, image: 'x:1'}\n  - {name: b, image: 'x:1', gpus: -1}\n")
    with pytest.raises(JobSpecError, match=r"two\.yaml: jobs\[1\]\.gpus: "):
        load_job_file(listed)
    twins = tmp_path / "twins.yaml"
    twins.write_text("- {name: a, image: 'x:1'}\n- {name: a, image: 'x:1'}\n")
    with pytest.raises(JobSpecError, match="duplicate job names a"):
        load_job_file(twins)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(JobSpecError, match=r"broken\.yaml: not valid YAML"):
        load_job_file(broken)


@pytest.mark.parametrize("kind", ["fifo", "directory", "missing", "binary"])
def test_a_job_file_that_is_not_one_is_one_error_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "job.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # reading it plainly would wait for a writer forever
    elif kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(b"name: \xff\xfe\x00")
    with pytest.raises(JobSpecError) as error:
        load_job_file(path)
    assert str(error.value).startswith(f"{path}: ") and "\n" not in str(error.value)
