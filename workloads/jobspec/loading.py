"""Parsing specs from dicts and job files, with one-line errors that name the field."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    ValidationError,
)

from workloads.jobspec.fields import JobSpecError
from workloads.jobspec.spec import TrainingJobSpec
from workloads.safeio import StateFileError, read_text_file

JOB_FILE_MAX_BYTES = 16 << 20  # a job file is a few KiB; anything near this is not one


def _loc_to_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for an invalid mapping key: the key is already in the path
            continue
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + str(part)
    return path


def _first_error(exc: ValidationError, prefix: str = "") -> JobSpecError:
    error = exc.errors()[0]
    loc = list(error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    original = (error.get("ctx") or {}).get("error")
    if isinstance(original, JobSpecError):  # raised by a model validator: it knows the field inside the model
        loc.append(original.path)
        message = original.reason
    path = _loc_to_path(loc)
    if prefix:
        path = f"{prefix}.{path}" if path and not path.startswith("[") else f"{prefix}{path}"
    return JobSpecError(path, message)


def parse_spec(data: Any, where: str = "") -> TrainingJobSpec:
    """Validate one spec mapping; errors are JobSpecError with the field path (prefixed by `where`)."""
    try:
        return TrainingJobSpec.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc, where) from None


def load_job_file(path: str | Path) -> list[TrainingJobSpec]:
    """Specs from a YAML file: one spec mapping, a list of specs, or a mapping with a `jobs:` list.

    Errors name the file and the field: `<file>: jobs[1].dataset.uri: ...`.
    """
    file = Path(path)
    try:
        # never blocks on a FIFO or /dev/zero
        document = yaml.safe_load(read_text_file(file, JOB_FILE_MAX_BYTES))
    except StateFileError as exc:
        raise JobSpecError(str(file), exc.why) from None
    except yaml.YAMLError as exc:
        raise JobSpecError(str(file), f"not valid YAML: {exc}".splitlines()[0]) from None
    if isinstance(document, dict) and set(document) == {"jobs"}:
        document = document["jobs"]
    items = document if isinstance(document, list) else [document]
    if not items or not all(isinstance(item, dict) for item in items):
        raise JobSpecError(str(file), "expected a job spec mapping, a list of them, or {jobs: [...]}")
    specs = []
    for index, item in enumerate(items):
        where = f"jobs[{index}]" if isinstance(document, list) else ""
        try:
            specs.append(parse_spec(item, where))
        except JobSpecError as exc:
            raise JobSpecError(f"{file}: {exc.path}" if exc.path else str(file), exc.reason) from None
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise JobSpecError(f"{file}: name", f"duplicate job names {', '.join(duplicates)}")
    return specs
