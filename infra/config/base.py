"""Shared building blocks of the stack-config schema: strict models with camelCase keys, and field types."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from workloads.quantity import parse_quantity

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# An IAM role or user, as EKS access entries take it: not an STS assumed-role session
# (arn:aws:sts::<account>:assumed-role/<role>/<session>: use arn:aws:iam::<account>:role/<role>).
PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"


class StrictModel(BaseModel):
    """Unknown keys are errors (typos must not pass silently); YAML keys are camelCase."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS1123_LABEL.match(value):
        raise ValueError(f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)")
    return value


def _quantity(value: str) -> str:
    parse_quantity(value)
    return str(value)


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
Quantity = Annotated[str, AfterValidator(_quantity)]
