"""`ml-cluster:registry`: the stack's own image repository (ECR), which Jobs name by `imageTag`."""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from infra.config.base import StrictModel

# ECR repository names: lower-case path components separated by '.', '_' or '-' (and '/' between components).
_ECR_NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


class RegistryConfig(StrictModel):
    enabled: bool = True
    """platform eks only: onprem clusters pull from a registry they already have"""
    repository: str = "train"
    """repository name after the `mlc-<stack>-` prefix"""
    keep_tagged_images: int = Field(default=50, ge=1, le=10000)
    """newest tagged images kept"""
    untagged_expiry_days: int = Field(default=7, ge=1, le=3650)
    """untagged layers deleted after"""

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if not _ECR_NAME.match(value) or len(value) > 200:
            raise ValueError(f"{value!r} is not an ECR repository name (lower-case letters, digits, '.', '_', "
                             "'-' and '/' between parts)")
        return value
