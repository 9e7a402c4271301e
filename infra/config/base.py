"""Shared building blocks of the stack-config schema: strict models with camelCase keys, and field types."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

from workloads.k8snames import DnsLabel as DnsLabel  # the sections' field type, written once there
from workloads.quantity import parse_quantity
from workloads.scalars import strict_scalar

PROJECT = "ml-cluster"
NAMESPACE = f"{PROJECT}:"  # this project's config keys: ml-cluster:<key>
JOBS_NAMESPACE = "training"  # the Jobs' namespace (ClusterFacts.namespace), which no tenant team may take

# An IAM role or user, as EKS access entries take it: not an STS assumed-role session
# (arn:aws:sts::<account>:assumed-role/<role>/<session>: use arn:aws:iam::<account>:role/<role>).
PRINCIPAL_ARN = r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/[\w+=,.@/-]+$"


class StrictModel(BaseModel):
    """Unknown keys are errors (typos must not pass silently); YAML keys are camelCase. Booleans and numbers must
    be written as such ('yes', 'true' or '15' in quotes are errors, as they are in the state files)."""

    # use_attribute_docstrings: a field's description is the string written under it (docs/reference/ is
    # generated from these descriptions).
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True,
                              use_attribute_docstrings=True)
    pulumi_text_scalars: ClassVar[bool] = False  # the stack's top level: values arrive as text from the Pulumi CLI

    @field_validator("*", mode="before")
    @classmethod
    def _written_as_its_type(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        return strict_scalar(field.annotation, value, pulumi_text=cls.pulumi_text_scalars)


def listed_twice(names: Iterable[str]) -> list[str]:
    """The names that occur more than once, sorted: what a "must be unique" check reports."""
    return sorted(name for name, count in Counter(names).items() if count > 1)


def _quantity(value: str) -> str:
    parse_quantity(value)
    return str(value)


Quantity = Annotated[str, AfterValidator(_quantity)]
