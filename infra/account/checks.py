"""What every preflight check returns, and how an AWS error reads in one."""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
# What an AWS call may raise besides a programming error: an error answer, a transport failure, and an answer that
# is not the service's protocol at all (an HTML 500 page from a proxy or a stand-in: botocore's parser raises
# ResponseParserError, which is not a BotoCoreError).
AWS_ERRORS = (BotoCoreError, ClientError, ResponseParserError)


@dataclass(frozen=True)
class Check:
    status: str
    name: str
    detail: str
    fix: str = ""


def aws_error(exc: Exception) -> tuple[str, str]:
    if isinstance(exc, ClientError):
        error = exc.response.get("Error") or {}
        return str(error.get("Code") or "error"), str(error.get("Message") or exc)
    if isinstance(exc, ResponseParserError):
        return "ResponseParserError", "the answer is not the service's protocol (an error page from a proxy?)"
    return type(exc).__name__, str(exc)
