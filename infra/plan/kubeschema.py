"""kubernetes-validate's check of one Kubernetes object, with each kind's schema read and compiled once per process.

`kubernetes_validate.validate` (kubernetes-validate 1.37.0, kubernetes_validate/utils.py) opens and parses the
version's `_definitions.json` (1.5 MB) and the kind's schema file, then builds a new registry and validator, on
every call: a plan of a few hundred objects spent most of its validation time parsing the same JSON again. This is
the same check (the same schema folder for the desired version, the same schemas, the same Draft 2020-12
validator, the same exceptions) with the validator kept per kind, API version, Kubernetes version and strictness.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate import utils
from referencing import Registry, Resource

SCHEMAS = Path(utils.__file__).resolve().parent / "kubernetes-json-schema"


@functools.cache
def _versions() -> tuple[str, ...]:
    return tuple(utils.all_versions())


@functools.cache
def _schema(path: Path) -> Any:
    with path.open() as handle:
        try:
            return json.load(handle)
        except json.JSONDecodeError:
            raise utils.InvalidSchemaError(f"Couldn't parse schema {path}") from None


@functools.cache
def _validator(kind: str, api_version: str, desired_version: str, strict: bool) -> tuple[str, Any]:
    """(the schemas' Kubernetes minor, the validator) for one kind, as kubernetes_validate.validate chooses them."""
    desired = desired_version[1:] if desired_version.startswith("v") else desired_version
    if utils.major_minor(desired) > utils.latest_version():
        raise utils.VersionNotSupportedError(version=utils.major_minor(desired))
    version = [v for v in _versions() if utils.major_minor(v) <= utils.major_minor(desired)][-1]
    folder = SCHEMAS / (f"v{version}-local" + ("-strict" if strict else ""))
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = _schema(folder / f"{kind.lower()}-{group_version}.json")
    except FileNotFoundError:
        if not folder.is_dir():
            raise utils.VersionNotSupportedError(version=desired) from None
        raise utils.SchemaNotFoundError(version=utils.major_minor(desired), kind=kind,
                                        api_version=api_version) from None
    registry: Registry = Resource.from_contents(schema) @ Registry()
    registry = Resource.from_contents(_schema(folder / "_definitions.json")) @ registry
    return utils.major_minor(version), jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate(manifest: dict[str, Any], kubernetes_version: str, strict: bool = True) -> str:
    """kubernetes_validate.validate(manifest, kubernetes_version, strict): the schemas' minor on success; raises its
    ValidationError (with .path and .message), SchemaNotFoundError or VersionNotSupportedError."""
    version, validator = _validator(str(manifest["kind"]), str(manifest["apiVersion"]), kubernetes_version, strict)
    try:
        validator.validate(manifest)
    except jsonschema.ValidationError as exc:
        raise kubernetes_validate.ValidationError(exc, version=version) from None
    return version
