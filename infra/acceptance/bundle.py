"""The evidence bundle: `evidence/<stack>-<UTC timestamp>/`, one log per step (`NN-<step>.log`) and `summary.json`.

The summary's model is below; `summary.schema.json` beside this module is its JSON Schema (generated from the model:
`python scripts/acceptance.py --print-schema`; a test keeps the two equal), so a reviewer can check a bundle with
any JSON Schema validator as well as with `scripts/acceptance.py --check-bundle DIR`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from workloads.safeio import StateFileError, atomic_write_in, read_text_file

SCHEMA_ID = "ml-cluster/acceptance-summary/v1"
SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")
SUMMARY = "summary.json"
MAX_SUMMARY_BYTES = 4 * 1024 * 1024

UtcTime = Annotated[str, Field(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", description="UTC, second precision")]
Figure = str | int | float | bool | None
StepStatus = Literal["passed", "failed", "skipped", "not-run", "running"]


class BundleError(ValueError):
    """A bundle that is not one: `where` names the file or field."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


class BundleWriteError(Exception):
    """A file of the bundle could not be written (a full disk, a lost mount): `where` names it. The summary on disk
    is then the last one written whole."""

    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why

    @classmethod
    def of(cls, exc: OSError, fallback: Path) -> BundleWriteError:
        return cls(str(exc.filename or fallback), exc.strerror or str(exc))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepRecord(_Strict):
    """One step of the run."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]*$", description="the step: preflight, up, verify, ...")
    commands: list[str] = Field(description="the step's commands as typed in a shell, in order (a probe: its call)")
    status: StepStatus = Field(description="passed | failed | skipped (said why in note) | not-run (a step before "
                                           "it failed) | running (in a summary written while it ran: the step a "
                                           "run that died was in)")
    started: UtcTime | None = Field(default=None, description="when the step began (null: not run)")
    ended: UtcTime | None = Field(default=None, description="when the step ended (null: not run)")
    exit_status: int | None = Field(default=None, description="the failing (or last) command's exit status; 124 when "
                                                              "the step's deadline passed; null: not run")
    deadline_s: float = Field(gt=0, description="the step's deadline, all its commands together")
    log: str | None = Field(default=None, pattern=r"^\d\d-[a-z0-9-]+\.log$", description="the step's log in the bundle")
    figures: dict[str, Figure] = Field(default_factory=dict, description="the step's key figures: up_seconds, "
                                       "allreduce_busbw_gbps and allreduce_floor_gbps, gpu_busy_share, "
                                       "time_to_resume_s and incident, leftovers, ...")
    note: str | None = Field(default=None, description="why it failed or was skipped, in one line")

    @model_validator(mode="after")
    def _times(self) -> StepRecord:
        ran = self.status in ("passed", "failed")
        if ran and (self.started is None or self.ended is None or self.exit_status is None or self.log is None):
            raise ValueError(f"step {self.name} {self.status}: needs started, ended, exit_status and log")
        if not ran and self.status == "not-run" and self.started is not None:
            raise ValueError(f"step {self.name} not-run: has a start time")
        if self.status == "running" and (self.started is None or self.log is None or self.ended is not None):
            raise ValueError(f"step {self.name} running: needs started and log, and no end")
        if self.status == "passed" and self.exit_status != 0:
            raise ValueError(f"step {self.name} passed with exit status {self.exit_status}")
        if self.started and self.ended and self.ended < self.started:
            raise ValueError(f"step {self.name}: ended before it started")
        return self


class Summary(_Strict):
    """What a run did, step by step."""

    schema_id: Literal["ml-cluster/acceptance-summary/v1"] = Field(alias="schema", description="this format")
    stack: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the Pulumi stack")
    git_commit: str = Field(pattern=r"^[0-9a-f]{40}$", description="the commit the run ran from")
    git_dirty: bool = Field(description="the working tree had uncommitted changes")
    started: UtcTime = Field(description="when the run began")
    ended: UtcTime | None = Field(description="when the run ended (null: still running, or it died)")
    result: Literal["passed", "failed", "running"] = Field(description="passed: every step passed or was skipped "
                                                                       "with its reason")
    failed_step: str | None = Field(description="the first step that failed (null when none did)")
    keep: bool = Field(description="KEEP=1: the stack was left up (no destroy)")
    steps: list[StepRecord] = Field(min_length=1)
    previous_run: str | None = Field(default=None, description="an earlier run of this stack found dead when this "
                                     "one started (its runner killed): its bundle, the step it was in and what this "
                                     "run did about it")
    bundle_error: str | None = Field(default=None, description="the first file of the bundle that could not be "
                                     "written and why (a full disk): the run stopped there (destroy still ran once "
                                     "up began) and failed")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _consistent(self) -> Summary:
        names = [step.name for step in self.steps]
        if len(set(names)) != len(names):
            raise ValueError("steps: a step name appears twice")
        failed = [step.name for step in self.steps if step.status == "failed"]
        if (failed[0] if failed else None) != self.failed_step:
            raise ValueError(f"failed_step: {self.failed_step!r} but the first failed step is "
                             f"{failed[0] if failed else None!r}")
        if self.result == "passed" and (failed or self.bundle_error
                                        or any(step.status == "not-run" for step in self.steps)):
            raise ValueError("result: passed, but a step failed or did not run, or the bundle was not written")
        if self.result == "failed" and not failed and not self.bundle_error:
            raise ValueError("result: failed, but no step failed and the bundle was written")
        if (self.result == "running") != (self.ended is None):
            raise ValueError("ended: null exactly while the result is running")
        if self.result != "running" and any(step.status == "running" for step in self.steps):
            raise ValueError(f"result: {self.result}, but a step is still running")
        return self


def schema_text() -> str:
    """The JSON Schema of summary.json, as committed in summary.schema.json."""
    schema = Summary.model_json_schema(by_alias=True)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID, **schema}
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def dump_summary(summary: Summary) -> bytes:
    return (json.dumps(summary.model_dump(by_alias=True), indent=2) + "\n").encode()


def write_summary(folder: Path, summary: Summary) -> None:
    """summary.json whole or not at all (temp file, fsync, rename): a reader never sees half of it."""
    atomic_write_in(folder, SUMMARY, dump_summary(summary), create_dir=False)


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list[str]"}


def _problem(exc: ValidationError) -> tuple[str, str]:
    error = exc.errors()[0]
    # a union's member (`str`, `function-after[...]`) is pydantic's, not a field of the file
    parts = [str(part) for part in error["loc"] if part not in _TYPE_TAGS and "[" not in str(part)]
    where = ".".join(parts) or "summary"
    return where, re.sub(r"^Value error, ", "", error["msg"])


def load_summary(folder: Path) -> Summary:
    """The bundle's summary, checked against the model; BundleError naming the field or file."""
    path = folder / SUMMARY
    try:
        text = read_text_file(path, MAX_SUMMARY_BYTES)
    except StateFileError as exc:
        raise BundleError(str(path), exc.why) from None
    except OSError as exc:
        raise BundleError(str(path), exc.strerror or str(exc)) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleError(str(path), f"not JSON (line {exc.lineno}: {exc.msg})") from None
    try:
        summary = Summary.model_validate(raw)
    except ValidationError as exc:
        where, why = _problem(exc)
        raise BundleError(f"{path}: {where}", why) from None
    return summary


def check_bundle(folder: Path) -> Summary:
    """A bundle as a reviewer receives it: a valid summary, and every log it names present in the folder."""
    if not folder.is_dir():
        raise BundleError(str(folder), "not a folder")
    summary = load_summary(folder)
    for step in summary.steps:
        if step.log is not None and not (folder / step.log).is_file():
            raise BundleError(f"{folder / SUMMARY}: steps.{step.name}.log", f"{step.log} is not in the bundle")
    return summary
