"""The errors of `submit`: a UsageError (exit 2) is about the input, a RuntimeFailure (exit 1) is not."""

from __future__ import annotations


class UsageError(Exception):
    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")


class RuntimeFailure(Exception):
    """A failure that says nothing about the input (an API server that does not answer in time, a run still going
    at the watch's deadline): exit 1, not the usage code 2."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"{where}: {why}")
