"""Shared building blocks of the stack-config schema: strict models with camelCase keys, and field types."""

from __future__ import annotations

import re
import types
import typing
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from workloads.k8snames import DnsLabel as DnsLabel  # the sections' field type, written once there
from workloads.quantity import parse_quantity

PROJECT = "ml-cluster"
NAMESPACE = f"{PROJECT}:"  # this project's config keys: ml-cluster:<key>
JOBS_NAMESPACE = "training"  # the Jobs' namespace (ClusterFacts.namespace), which no tenant team may take

# An IAM role or user, as EKS access entries take it: not an STS assumed-role session
# (arn:aws:sts::<account>:assumed-role/<role>/<session>: use arn:aws:iam::<account>:role/<role>).
PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"


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


class StrictModel(BaseModel):
    """Unknown keys are errors (typos must not pass silently); YAML keys are camelCase. Booleans and numbers must
    be written as such ('yes', 'true' or '15' in quotes are errors, as they are in the state files)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)
    pulumi_text_scalars: ClassVar[bool] = False  # the stack's top level: values arrive as text from the Pulumi CLI

    @field_validator("*", mode="before")
    @classmethod
    def _written_as_its_type(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        return strict_scalar(field.annotation, value, pulumi_text=cls.pulumi_text_scalars)


def _quantity(value: str) -> str:
    parse_quantity(value)
    return str(value)


Quantity = Annotated[str, AfterValidator(_quantity)]
