"""`make help` lists every target with one line; the targets that need the Pulumi CLI say how to get it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")
pytestmark = pytest.mark.skipif(MAKE is None, reason="make is not installed")
NO_PULUMI_PATH = "/usr/bin:/bin"


def _phony() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith(".PHONY:")]
    return line.split(":", 1)[1].split()


def test_make_help_lists_every_target_once_with_one_line() -> None:
    done = subprocess.run([str(MAKE), "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True)
    listed = [line.split()[0] for line in done.stdout.splitlines()]
    assert sorted(listed) == sorted(_phony())
    assert all(re.match(r"^  [a-z-]+ +\S", line) for line in done.stdout.splitlines())
    # Plain `make` helps rather than building a virtualenv.
    assert subprocess.run([str(MAKE), "-s"], cwd=ROOT, capture_output=True, text=True).stdout == done.stdout


@pytest.mark.parametrize("target", ["preview", "up", "destroy", "kubeconfig"])
def test_cloud_targets_without_the_pulumi_cli_print_the_install_hint(target: str) -> None:
    if shutil.which("pulumi", path=NO_PULUMI_PATH):
        pytest.skip("the Pulumi CLI is installed in /usr/bin")
    done = subprocess.run([str(MAKE), "-s", "-o", "setup-plan", target, "STACK=dev"], cwd=ROOT,
                          capture_output=True, text=True, env={"PATH": NO_PULUMI_PATH, "HOME": "/nonexistent"})
    assert done.returncode == 2
    assert "error: pulumi: not installed (https://www.pulumi.com/docs/install/)" in done.stdout


@pytest.mark.parametrize(("fake_docker", "says"), [
    ('[ "$1" = buildx ] && exit 1; exit 0', "error: docker buildx: not installed (the buildx plugin: "),
    ('[ "$1" = info ] && exit 1; exit 0', "error: docker: no engine answers (start Docker, or set DOCKER_HOST)"),
])
def test_make_image_says_what_is_missing_in_one_line(tmp_path: Path, fake_docker: str, says: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!/bin/sh\n{fake_docker}\n")
    docker.chmod(0o755)
    done = subprocess.run([str(MAKE), "-s", "image"], cwd=ROOT, capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 2 and done.stdout.startswith(says), done.stdout + done.stderr
