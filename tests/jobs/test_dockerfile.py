"""The training image's Dockerfile keeps the rules the Jobs rely on (no Docker here: the text is checked)."""

from __future__ import annotations

import re
from pathlib import Path

from workloads.jobspec import RUN_AS_UID

DOCKERFILE = Path(__file__).resolve().parents[2] / "workloads" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_base_is_a_cuda_pytorch_image_pinned_by_tag_and_digest() -> None:
    image = next(value for key, value in instructions() if key == "FROM")
    image, _, digest = image.partition("@")
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), "pin the base by digest (docs/versions.md says how)"
    repository, _, tag = image.rpartition(":")
    assert repository.endswith("pytorch/pytorch") and "cuda" in tag and tag != "latest"
    assert tag.startswith("2.13.0-"), "the base's torch must match the project's torch==2.13.0 pin"


def test_runs_as_the_jobs_non_root_user_with_the_training_entrypoint() -> None:
    steps = instructions()
    users = [value for key, value in steps if key == "USER"]
    assert users and users[-1] == f"{RUN_AS_UID}:{RUN_AS_UID}"
    assert steps[-1] == ("ENTRYPOINT", '["python", "-m", "workloads.train"]')
    assert ("COPY", "workloads/ /app/workloads/") in steps


def test_the_image_carries_libfabric_and_aws_ofi_nccl_from_a_pinned_efa_installer() -> None:
    steps = instructions()
    [install] = [value for key, value in steps if key == "RUN" and "efa_installer.sh" in value]
    assert "aws-efa-installer-1.47.0.tar.gz" in install and "latest" not in install
    assert "--skip-kmod" in install and " -g " in install  # user space only; GPUDirect RDMA plugin build
    [library_path] = [value for key, value in steps if key == "ENV" and value.startswith("LD_LIBRARY_PATH=")]
    assert "/opt/amazon/efa/lib" in library_path and "/opt/amazon/ofi-nccl/lib" in library_path
