"""`--help` of every entry point shows each option's default (when it has one and its help does not already say)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("command", "expected"), [
    (["-m", "workloads.train", "--help"], ["(default: resnet50)", "(default: 256)"]),
    (["-m", "workloads.data", "stage", "--help"], ["tries per request before giving up (default: 6)"]),
    (["-m", "workloads.submit", "watch", "--help"], ["--interval SECONDS  (default: 10.0)"]),
    (["scripts/plan.py", "--help"], ["(default: today)"]),
])
def test_help_shows_the_defaults(command: list[str], expected: list[str]) -> None:
    done = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    for part in expected:
        assert " ".join(part.split()) in text, part
    assert "(default: (default" not in text and "default: None" not in text
