"""docs/reference/ is generated from the models (stale = a failing test), and its JSON Schemas accept every committed
stack file and Job file and refuse what the models refuse."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from infra.config.reference import JOB_SCHEMA, ROOT, SCHEMA_DIR, STACK_SCHEMA, job_files, outputs, stack_files


def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((ROOT / SCHEMA_DIR / name).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def test_the_committed_reference_is_what_the_models_generate() -> None:
    stale = [str(relative) for relative, text in outputs().items()
             if not (ROOT / relative).exists() or (ROOT / relative).read_text() != text]
    assert not stale, f"stale: {stale}; run: python scripts/gen_reference.py"


def test_every_config_key_and_job_field_is_in_the_reference() -> None:
    from infra.config.schema import StackConfig
    from workloads.jobspec import TrainingJobSpec

    stack = (ROOT / "docs" / "reference" / "stack-config.md").read_text()
    job = (ROOT / "docs" / "reference" / "job-spec.md").read_text()
    for name, field in StackConfig.model_fields.items():
        alias = field.alias or name
        assert f"`ml-cluster:{alias}`" in stack or (alias == "region" and "`aws:region`" in stack), alias
    for name, field in TrainingJobSpec.model_fields.items():
        assert f"| `{field.alias or name}` |" in job, name
    assert "| `dataset.stagedSize` |" in job and "| `nodePools[].efa` |" in stack


def test_every_key_and_field_says_what_it_does() -> None:
    """A row with an empty description column is a key a reader has to look up in the code: every field carries a
    `description=` (or a comment the generator reads)."""
    from infra.config.reference import sections
    from infra.config.schema import StackConfig
    from workloads.jobspec import TrainingJobSpec

    silent = [f"{section.model.__name__}: {row.key}"
              for model, stop in ((StackConfig, {TrainingJobSpec: "the Job spec reference"}), (TrainingJobSpec, {}))
              for section in sections(model, "", {}, stop=stop) for row in section.rows if not row.description.strip()]
    assert not silent, f"fields without a description (add description=...): {silent}"


@pytest.mark.parametrize("path", stack_files(), ids=lambda path: path.name)
def test_stack_schema_accepts_each_committed_stack_file(path: Path) -> None:
    _validator(STACK_SCHEMA).validate(yaml.safe_load(path.read_text()))


@pytest.mark.parametrize("path", job_files(), ids=lambda path: path.name)
def test_job_schema_accepts_each_committed_job_file(path: Path) -> None:
    _validator(JOB_SCHEMA).validate(yaml.safe_load(path.read_text()))


def test_schemas_refuse_unknown_keys_and_bad_values() -> None:
    stack = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    validator = _validator(STACK_SCHEMA)
    typo = json.loads(json.dumps(stack))
    typo["config"]["ml-cluster:nodePool"] = []  # not nodePools
    assert not validator.is_valid(typo)
    plaintext = json.loads(json.dumps(stack))
    plaintext["config"]["ml-cluster:kubeconfig"] = "apiVersion: v1"  # a secret in plaintext
    assert not validator.is_valid(plaintext)
    other_provider = json.loads(json.dumps(stack))
    other_provider["config"]["kubernetes:context"] = "anything"  # not ours to check
    assert validator.is_valid(other_provider)
    job = _validator(JOB_SCHEMA)
    assert not job.is_valid({"name": "x", "imageTag": "1", "gpus": -1})
    assert not job.is_valid({"name": "x", "imageTag": "1", "gpuz": 1})
    assert job.is_valid({"jobs": [{"name": "x", "imageTag": "1"}]})


def test_example_job_file_carries_the_schema_modeline() -> None:
    first = (ROOT / "examples" / "plain-pytorch-job.yaml").read_text().splitlines()[0]
    assert first == f"# yaml-language-server: $schema=../docs/reference/schemas/{JOB_SCHEMA}"
