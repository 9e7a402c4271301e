"""docs/data-tools.md's "Try it on a laptop" runs as written: its shell block, parsed from the document, run line by
line from a scratch folder that sees the repository's .venv, scripts/ and examples/ (the port of the local S3
stand-in is swapped for a free one; `make setup` is what the suite already stands on). The whole block is slow (a
training epoch and an example on CPU); the fast sibling runs its first command."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.moto_server import free_port

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "data-tools.md"


def laptop_commands() -> list[str]:
    text = DOC.read_text()
    section = text.split("## Try it on a laptop", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the laptop section has no ```sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def run_lines(lines: list[str], folder: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    for name in (".venv", "scripts", "examples"):
        (folder / name).symlink_to(REPO / name)
    port = str(free_port())
    script = "set -euo pipefail\n" + "\n".join(line.replace("9000", port) for line in lines
                                               if not line.startswith("make setup"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    try:
        return subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=timeout)
    finally:  # the stand-in is stopped whatever happened (by the PID it recorded)
        subprocess.run([str(REPO / ".venv/bin/python"), "scripts/local_s3.py", "stop"], cwd=folder, env=env,
                       capture_output=True, timeout=30)


def test_the_section_is_the_path_the_issue_asks_for() -> None:
    lines = laptop_commands()
    assert lines[0] == "make setup"
    commands = "\n".join(lines)
    for step in ("scripts/local_s3.py start", "-m workloads.data pack ", "-m workloads.data upload",
                 "-m workloads.data stage", "-m workloads.train --data", "--preset cpu", "examples/train_plain.py",
                 "scripts/local_s3.py stop", "pack-captions", "examples/train_clip.py", "pack-tokens",
                 "examples/train_tiny_lm.py"):
        assert step in commands, step
    assert all(line.startswith((".venv/bin/python ", "make ", "export ")) for line in lines), lines


def test_the_first_command_runs_as_written(tmp_path: Path) -> None:
    result = run_lines(laptop_commands()[:2], tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len(list((tmp_path / "laptop/sample/images").glob("class*/*.jpg"))) == 200


@pytest.mark.slow
def test_the_whole_section_runs_as_written(tmp_path: Path) -> None:
    result = run_lines(laptop_commands(), tmp_path, timeout=1200)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert '"event": "done"' in result.stdout
    assert (tmp_path / "laptop/staged/manifest.json").is_file()
    assert not (tmp_path / ".local-s3/pid").exists()  # stopped by the section's stop line
    # Every example trained its epoch, and nothing but the tools' own `warning:`/`error:` lines reached stderr
    # (a torch UserWarning from float() of a loss that needs grad did, from both records examples).
    assert result.stdout.count('"epoch": 0') >= 3, result.stdout[-2000:]
    assert "UserWarning" not in result.stderr, result.stderr[-2000:]


def test_commands_a_reader_types_name_the_venv_python() -> None:
    """The system `python` lacks h5py and torch (a ModuleNotFoundError traceback): README.md and docs/data-tools.md
    say `.venv/bin/python`, except for the lines that run inside a pod (the training image's python)."""
    bare = re.compile(r"(^|[` ])python (-m |examples/|scripts/)")
    in_a_pod = ("--shard-count 16 --scratch /scratch", "--publish", "workloads.train.launch [torchrun",
                "pack s3://raw/imagenet/train s3://ml-datasets/imagenet-256\n")
    found = []
    for path in (REPO / "README.md", DOC):
        for number, line in enumerate(path.read_text().splitlines(keepends=True), 1):
            if bare.search(line) and not any(mark in line for mark in in_a_pod):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.slow  # torch's import alone: seconds
def test_the_plain_example_decodes_encoded_packs_at_a_chosen_size() -> None:
    """An encoded pack read at 224 px by default is many times slower on a CPU than one packed small: the example
    takes --image-size (PackedData.open's image_size) and caps its loader workers at the machine's CPUs (more
    makes torch warn on stderr, where the docs promise only warning:/error: lines)."""
    result = subprocess.run([str(REPO / ".venv/bin/python"), str(REPO / "examples/train_plain.py"), "--help"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    assert "--image-size" in result.stdout
    options = result.stdout.rsplit("--workers WORKERS", 1)[1][:200]
    assert f"(default {min(4, os.cpu_count() or 1)})" in options, options
