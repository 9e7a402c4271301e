"""`--help` of every entry point shows each option's default (when it has one and its help does not already say).

Each CLI's own main() in this process (a new interpreter per case spent its time importing torch and pulumi)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

import pytest


def _main(module: str) -> Callable[[Sequence[str]], int]:
    return importlib.import_module(module).main


@pytest.mark.parametrize(("module", "argv", "expected"), [
    ("workloads.train.__main__", ["--help"], ["(default: resnet50)", "(default: 256)"]),
    ("workloads.data.__main__", ["stage", "--help"], ["tries per request before giving up (default: 6)"]),
    ("workloads.submit.cli", ["watch", "--help"], ["--interval SECONDS  (default: 10.0)"]),
    ("scripts.plan", ["--help"], ["(default: today)"]),
])
def test_help_shows_the_defaults(module: str, argv: list[str], expected: list[str],
                                 capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps at the terminal's width; a pipe's is 80
    with pytest.raises(SystemExit) as exited:
        _main(module)(argv)
    assert exited.value.code in (0, None)
    text = " ".join(capsys.readouterr().out.split())
    for part in expected:
        assert " ".join(part.split()) in text, part
    assert "(default: (default" not in text and "default: None" not in text
