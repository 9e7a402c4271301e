"""Booleans and numbers as YAML wrote them: the one rule the stack config (infra/config/base.StrictModel) and the
Job spec (workloads/jobspec/fields._Spec) both apply, so 'yes', 'true' or '15' in quotes is an error saying what to
write wherever it is written, as it is in the state files."""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any

TRUE_WORDS = frozenset({"true", "yes", "y", "on", "1"})
FALSE_WORDS = frozenset({"false", "no", "n", "off", "0"})


def _scalar_kinds(annotation: Any) -> set[Any]:
    """The plain types a field's annotation allows (Optional, unions and Annotated unwrapped)."""
    if typing.get_origin(annotation) is Annotated:
        return _scalar_kinds(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(_scalar_kinds(arg) for arg in typing.get_args(annotation)))
    return {annotation}


def strict_scalar(annotation: Any, value: Any, *, pulumi_text: bool = False) -> Any:
    """`value` for a boolean, whole-number or number field only if YAML wrote it as one: 'yes', 'true' or '15' in
    quotes (or a YAML 1.1 yes/on) is a ValueError saying what to write. `pulumi_text`: a top-level key, which the
    Pulumi CLI hands to the program as text, so "true"/"false" and digits are what YAML's true/false/15 became."""
    kinds = _scalar_kinds(annotation) - {type(None)}
    if value is None or not kinds or not kinds <= {bool, int, float}:
        return value
    if kinds == {bool}:
        if isinstance(value, bool):
            return value
        if pulumi_text and value in ("true", "false"):
            return value == "true"
        word = str(value).strip().lower()
        meant = "true" if word in TRUE_WORDS else "false" if word in FALSE_WORDS else None
        hint = f"write {meant} without quotes" if meant else "write true or false"
        raise ValueError(f"{value!r} is not a boolean: {hint}")
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean, not a number")
    if isinstance(value, int) or (float in kinds and isinstance(value, float)):
        return value
    if pulumi_text and isinstance(value, str) and re.fullmatch(r"-?\d+", value):
        return int(value)
    number = "a whole number" if float not in kinds else "a number"
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+(\.\d+)?\s*", value):
        raise ValueError(f"{value!r} is text, not {number}: write {value.strip()} without quotes")
    if isinstance(value, float) and float not in kinds:
        return value  # pydantic says whether a float is a whole number
    raise ValueError(f"{value!r} is not {number}")
