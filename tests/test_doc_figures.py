"""Say what ran where: every figure in README.md and docs/ has the command that produced it beside it (in its
section: a `make ...`, `scripts/...` or `.venv/bin/python ...` command, or a shell block), or says it is a model,
an inference, a setting or an upstream figure. A ratio (`21x`), a time (`5.9 s`, `20 ms`), a rate (`MB/s`,
`samples/s`) or a share (`92%`) counts as a figure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FIGURE = re.compile(r"(?<![\w.-])\d[\d,]*(\.\d+)?(x(?![\w-])| ?(ms|s|MB/s|GB/s|MiB/s|GiB/s|samples/s|images/s|%)"
                    r"(?![\w/]))")
COMMAND = re.compile(r"`[^`]*(make |scripts/|\.venv|python|bench|pytest|chaos|promtool)[^`]*`|^\$ |```|^    \S",
                     re.MULTILINE)
# A figure that was not measured here says what it is instead; settings (defaults, timeouts, budgets) are not
# measurements.
NOT_MEASURED = re.compile(r"model|upstream|study's|not reproduced|inference|published|AWS states|AWS recommends|"
                          r"estimate|default|timeout|deadline|limit|budget|interval", re.IGNORECASE)


def unsourced_figures(text: str) -> list[str]:
    """The paragraphs with a figure whose section has no command and that do not say what else the figure is."""
    found = []
    for section in re.split(r"\n(?=#{1,4} )", text):
        has_command = COMMAND.search(section) is not None
        for paragraph in re.split(r"\n\s*\n", section):
            if FIGURE.search(paragraph) and not has_command and not NOT_MEASURED.search(paragraph):
                found.append(paragraph.strip()[:160].replace("\n", " "))
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda path: path.name)
def test_every_figure_has_its_command_or_says_what_it_is(path: Path) -> None:
    assert unsourced_figures(path.read_text()) == []


def test_the_check_catches_a_bare_figure() -> None:
    assert unsourced_figures("## Speed\n\nThe loader reads 17,625 samples/s, 21x a folder.\n") != []
    assert unsourced_figures("## Speed\n\n    .venv/bin/python scripts/bench_loader.py\n\n17,625 samples/s.\n") == []
    assert unsourced_figures("## Cost\n\nA model: 5.9 s per restart.\n") == []
