"""README's layout listing names every script in scripts/ (a script added without it is a CLI nobody finds)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _listing(folder: str) -> str:
    """The text of README's layout entry for `folder` (its first line up to the next entry)."""
    text = (REPO / "README.md").read_text()
    match = re.search(rf"^{re.escape(folder)}\s+(.*?)(?=^\S)", text, re.MULTILINE | re.DOTALL)
    assert match is not None, f"README.md lists no {folder}"
    return match.group(1)


def test_the_scripts_listing_names_every_script() -> None:
    named = set(re.findall(r"[a-z][a-z0-9_]*", _listing("scripts/")))
    scripts = {path.stem for path in (REPO / "scripts").glob("*.py") if path.stem != "__init__"}
    assert scripts - named == set(), "README.md's scripts/ entry lacks these"
