"""No tracked symlink points out of the repository: a worktree's links to shared environments (.venv, .tools, the
policy pack's venv, the workflow linter's node_modules) were committed twice, and checking such a commit out
replaced the real directories with links (a fresh clone gets dangling ones)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_tracked_symlink_stays_inside_the_repository() -> None:
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True)
    links = [line.split("\t", 1)[1] for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    for link in links:
        target = subprocess.run(["git", "cat-file", "-p", f":{link}"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout
        resolved = os.path.normpath(os.path.join(os.path.dirname(link), target))
        assert not os.path.isabs(target) and not resolved.startswith(".."), f"{link} -> {target}"
    environments = {".venv", ".tools", "infra/policy/pack/venv", ".github/lint/node_modules"}
    assert not environments & set(links)
