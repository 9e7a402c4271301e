"""How a stack config's problems are reported: `ConfigError` (every `path: why` found, in one path style) and
`ConfigExit` (exit status 2, nothing registered)."""

from __future__ import annotations

import re
from collections.abc import Iterable

from infra.config.base import NAMESPACE

MAX_REPORTED_PROBLEMS = 200


class ConfigError(ValueError):
    """A stack config (or a Job spec in it) that cannot be deployed; one `path: why` per problem."""

    def __init__(self, problems: Iterable[tuple[str, str]]):
        self.problems = list(problems)  # as raised (components may use the short `nodePools.0.name` form)
        super().__init__("\n".join(f"{path}: {why}" for path, why in self.shown()))

    def shown(self) -> list[tuple[str, str]]:
        """The problems as reported: one path style (`ml-cluster:jobs[0].memory`), each problem once."""
        return list(dict.fromkeys((config_path(path), why) for path, why in self.problems))

    def lines(self, limit: int = MAX_REPORTED_PROBLEMS) -> list[str]:
        """One `error:` line per problem; past `limit`, one line that counts the rest (a file of 40,000 unknown
        keys needs its first lines read, not all of them)."""
        shown = self.shown()
        lines = [f"error: {path}: {why}" for path, why in shown[:limit]]
        if len(shown) > limit:
            lines.append(f"error: config: {len(shown) - limit} more problems not shown (fix the ones above first)")
        return lines


def config_path(path: str) -> str:
    """A problem's path in the one style used everywhere: the stack-file key, then the field path with list
    indices in brackets: `jobs.0.memory` -> `ml-cluster:jobs[0].memory`, `region` -> `aws:region`. Paths that
    are not config fields (a file, `stack`, `config`, `arguments`, `aws`, a `--flag`) are left as they are."""
    first = re.split(r"[.\[]", path, maxsplit=1)[0]
    if first in ("", "config", "stack", "arguments", "aws") or "/" in first or path.startswith(("{", "[", '"', "-")):
        return path
    match = re.match(r"^((?:[A-Za-z0-9_-]+:)?[A-Za-z0-9_-]+)(.*)$", path, re.DOTALL)
    if match is None:
        return path
    head, rest = match.groups()
    if ":" not in head:
        head = "aws:region" if head == "region" else f"{NAMESPACE}{head}"
    rest = re.sub(r"\.(\d+)(?=$|[.\[])", r"[\1]", rest)
    return head + rest


class ConfigExit(SystemExit):
    """Exit status 2 for a program stopped by a ConfigError (the error travels with it, for the offline engine)."""

    def __init__(self, error: ConfigError):
        super().__init__(2)
        self.error = error
