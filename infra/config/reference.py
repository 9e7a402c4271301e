"""The reference of every stack config key and Job spec field, and the JSON Schemas editors validate files with,
generated from the pydantic models (scripts/gen_reference.py writes them; a test fails when they are stale).

Everything comes from the models themselves: descriptions from each field's `description` (the string written under the
field, which pydantic reads as its docstring; every field has one and a test says which lack it), rules from the field's
constraints (ge, le, min_length, pattern, literals) and the docstrings of its validators. Examples come from the
committed files: the first value each key has in stacks/Pulumi.*.yaml, workloads/jobs/*.yaml and examples/*.yaml.
"""

from __future__ import annotations

import inspect
import json
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import annotated_types
import yaml
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from infra.config.schema import NAMESPACE, SECRET_KEYS, StackConfig
from infra.stackyaml import read_stack_document
from workloads.jobspec import TrainingJobSpec

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_DIR = Path("docs") / "reference"
SCHEMA_DIR = REFERENCE_DIR / "schemas"
STACK_SCHEMA = "stack-file.schema.json"
JOB_SCHEMA = "job-spec.schema.json"
_EXAMPLE_WIDTH = 70


@dataclass(frozen=True)
class Row:
    key: str
    type: str
    default: str
    rules: str
    description: str
    example: str


@dataclass(frozen=True)
class Section:
    key: str  # the section's key path ("" for the top level)
    model: type[BaseModel]
    rows: tuple[Row, ...]


# -- reading the models ------------------------------------------------------------------------------------------
def _validator_docs(model: type[BaseModel]) -> tuple[dict[str, list[str]], list[str]]:
    """({field: [docstring of a field validator]}, [docstrings of model validators]), first lines only."""
    decorators = model.__pydantic_decorators__
    per_field: dict[str, list[str]] = {}
    for decorator in decorators.field_validators.values():
        doc = inspect.getdoc(decorator.func)
        if doc:
            for name in decorator.info.fields:
                per_field.setdefault(name, []).append(" ".join(doc.split("\n\n")[0].split()))
    model_docs = [" ".join(doc.split("\n\n")[0].split()) for decorator in decorators.model_validators.values()
                  if (doc := inspect.getdoc(decorator.func))]
    return per_field, model_docs


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True  # noqa: UP007
    return annotation, False


def _validator_words(metadata: Iterable[Any]) -> list[str]:
    words = []
    for item in metadata:
        func = getattr(item, "func", None)
        if func is not None:
            doc = inspect.getdoc(func)
            words.append(" ".join(doc.split("\n\n")[0].split()) if doc
                         else func.__name__.strip("_").replace("_", " "))
    return words


def type_name(annotation: Any, links: dict[type[BaseModel], str]) -> str:
    """A reader's name for a field's type: `string`, `list of NodePool`, `"a" | "b"`, ..."""
    annotation, optional = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        text = type_name(args[0], links)
    elif origin is typing.Literal:
        text = " \\| ".join(json.dumps(arg) for arg in args)
    elif origin in (list, tuple, set, frozenset):
        text = f"list of {type_name(args[0], links)}" if args else "list"
    elif origin is dict:
        text = f"map of {type_name(args[0], links)} to {type_name(args[1], links)}"
    elif origin in (typing.Union, types.UnionType):
        text = " or ".join(type_name(arg, links) for arg in args)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        text = f"[{annotation.__name__}](#{links.get(annotation, annotation.__name__.lower())})"
    elif annotation is SecretStr:
        text = "secret string"
    elif annotation is str:
        text = "string"
    elif annotation is bool:
        text = "boolean"
    elif annotation is int:
        text = "integer"
    elif annotation is float:
        text = "number"
    else:
        text = getattr(annotation, "__name__", str(annotation))
    return f"{text} or null" if optional else text


def _rules(field: FieldInfo) -> list[str]:
    words = []
    bounds = ((annotated_types.Ge, ">=", "ge"), (annotated_types.Gt, ">", "gt"), (annotated_types.Le, "<=", "le"),
              (annotated_types.Lt, "<", "lt"))
    for item in field.metadata:
        for kind, symbol, attribute in bounds:
            if isinstance(item, kind):
                words.append(f"{symbol} {getattr(item, attribute)}")
        if isinstance(item, annotated_types.MinLen):
            words.append(f"at least {item.min_length} long")
        if isinstance(item, annotated_types.MaxLen):
            words.append(f"at most {item.max_length} long")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            words.append(f"matches `{pattern}`")
    annotation, _ = _strip_optional(field.annotation)
    inner = [annotation]
    while inner:
        current = inner.pop()
        if typing.get_origin(current) is typing.Annotated:
            base, *metadata = typing.get_args(current)
            words += _validator_words(metadata)
            inner.append(base)
        elif typing.get_origin(current) in (list, dict, typing.Union, types.UnionType):
            inner += [arg for arg in typing.get_args(current) if arg is not type(None)]
    return words


def _inline(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    if isinstance(value, (dict, list)):
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= _EXAMPLE_WIDTH else text[: _EXAMPLE_WIDTH - 3] + "..."


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "(the section's defaults)"
        return f"`{_inline(value)}`"
    if field.default is PydanticUndefined:
        return "**required**"
    if isinstance(field.default, BaseModel):
        return "(the section's defaults)"
    return f"`{_inline(field.default)}`" if field.default is not None else "none"


def _models_in(annotation: Any) -> Iterator[tuple[type[BaseModel], str]]:
    """Models a field holds, each with the key suffix that reaches it ("", "[]" for list items, ".<name>" for map
    values)."""
    annotation, _ = _strip_optional(annotation)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        yield from _models_in(args[0])
    elif origin in (list, tuple, set, frozenset) and args:
        yield from ((model, "[]" + suffix) for model, suffix in _models_in(args[0]))
    elif origin is dict and args:
        yield from ((model, ".<name>" + suffix) for model, suffix in _models_in(args[1]))
    elif origin in (typing.Union, types.UnionType):
        for arg in args:
            yield from _models_in(arg)
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, ""


def _alias(name: str, field: FieldInfo) -> str:
    return field.alias or name


def sections(model: type[BaseModel], prefix: str, examples: dict[str, Any],
             stop: dict[type[BaseModel], str] | None = None) -> list[Section]:
    """The model and every model below it, depth first, each with its rows. `stop`: models documented elsewhere
    (a link is given instead of their fields)."""
    stop = stop or {}
    found: list[Section] = []
    seen: set[type[BaseModel]] = set()

    def visit(current: type[BaseModel], key: str) -> None:
        if current in seen or current in stop:
            return
        seen.add(current)
        field_docs, _ = _validator_docs(current)
        rows = []
        children: list[tuple[type[BaseModel], str]] = []
        for name, field in current.model_fields.items():
            alias = _alias(name, field)
            path = f"{key}.{alias}" if key else alias
            description = field.description or ""
            for model_type, suffix in _models_in(field.annotation):
                if model_type in stop:
                    description = (description + " " if description else "") + f"See {stop[model_type]}."
                else:
                    children.append((model_type, path + suffix))
            rules = "; ".join(dict.fromkeys(_rules(field) + field_docs.get(name, [])))
            example = examples.get(path)
            rows.append(Row(path, type_name(field.annotation, {}), _default(field), rules, description,
                            f"`{_inline(example)}`" if example is not None else ""))
        found.append(Section(key, current, tuple(rows)))
        for model_type, path in children:
            visit(model_type, path)

    visit(model, prefix)
    return found


# -- examples from the committed files ----------------------------------------------------------------------------
def _collect(value: Any, path: str, into: dict[str, Any]) -> None:
    if path:
        into.setdefault(path, value)
    if isinstance(value, dict):
        for key, child in value.items():
            _collect(child, f"{path}.{key}" if path else str(key), into)
    elif isinstance(value, list):
        for child in value:
            if isinstance(child, dict):
                _collect(child, f"{path}[]", into)


def stack_files(root: Path = ROOT) -> list[Path]:
    return sorted((root / "stacks").glob("Pulumi.*.yaml"))


def job_files(root: Path = ROOT) -> list[Path]:
    return sorted([*(root / "workloads" / "jobs").glob("*.yaml"), *(root / "examples").glob("*.yaml")])


def _job_items(document: Any) -> list[Any]:
    if isinstance(document, dict) and set(document) == {"jobs"}:
        document = document["jobs"]
    return document if isinstance(document, list) else [document]


def stack_examples(root: Path = ROOT) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path in stack_files(root):
        config = (read_stack_document(path) or {}).get("config", {})
        ours = {key[len(NAMESPACE):]: value for key, value in config.items() if key.startswith(NAMESPACE)}
        if "aws:region" in config:
            ours["region"] = config["aws:region"]
        for key in SECRET_KEYS:
            ours.pop(key, None)  # never print a secret, even an encrypted one
        _collect(ours, "", found)
    return found


def job_examples(root: Path = ROOT) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for path in job_files(root):
        for item in _job_items(read_stack_document(path)):  # the same bounded YAML reader as stack files
            _collect(item, "", found)
    for path in stack_files(root):
        config = (read_stack_document(path) or {}).get("config", {})
        for item in config.get(f"{NAMESPACE}jobs", []) or []:
            _collect(item, "", found)
    return found


# -- markdown -----------------------------------------------------------------------------------------------------
def _anchor(section: Section) -> str:
    return section.model.__name__.lower()


def _markdown(title: str, intro: str, found: list[Section], key_prefix: str = "") -> str:
    out = [f"# {title}", "", "<!-- Generated by scripts/gen_reference.py from the pydantic models: do not edit. -->",
           "", intro.strip(), "", "## Sections", ""]
    for section in found:
        out.append(f"- [`{key_prefix}{section.key or '(top level)'}`](#{_anchor(section)}) ({section.model.__name__})")
    for section in found:
        _, model_docs = _validator_docs(section.model)
        out += ["", f'<a id="{_anchor(section)}"></a>', "",
                f"## `{key_prefix}{section.key or '(top level)'}`: {section.model.__name__}", ""]
        doc = inspect.getdoc(section.model)
        if doc and section.model.__doc__ and not doc.startswith(("Unknown keys are errors", "Usage docs:")):
            out += [" ".join(doc.split("\n\n")[0].split()), ""]
        if model_docs:
            out += ["Checks: " + " ".join(model_docs), ""]
        out += ["| Key | Type | Default | Rules | Description | Example |", "|---|---|---|---|---|---|"]
        for row in section.rows:
            type_text = row.type
            for other in found:  # link nested sections
                type_text = type_text.replace(f"(#{other.model.__name__.lower()})", f"(#{_anchor(other)})")
            out.append(f"| `{key_prefix}{row.key}` | {type_text} | {row.default} | {_cell(row.rules)} | "
                       f"{_cell(row.description)} | {row.example} |")
    return "\n".join(out) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


STACK_INTRO = f"""
Every key of a stack file (`stacks/Pulumi.<stack>.yaml`), under `config:`. Keys of this project are
`{NAMESPACE}<key>` (camelCase, as below; unknown keys are errors); `aws:region` is the AWS provider's key, read
as `region`; other namespaces belong to their providers and are not checked here. `{NAMESPACE}kubeconfig` and the
COS HMAC keys must be Pulumi secrets (`pulumi config set --secret ...`). A nested key is written in YAML as nested
mappings: `{NAMESPACE}storage` / `efs` / `throughputMode`; `[]` marks the items of a list, `<name>` the values of a
map.

Validate a file in your editor with [the JSON Schema](schemas/{STACK_SCHEMA}) (see [schemas](#editor-validation)
below), and fully with `make plan STACK=<stack>` (the schema cannot express every cross-field rule: the model's
checks are listed per section).

## Editor validation

Put this modeline on a stack file's first line (VS Code with the YAML extension, Neovim/Helix with
yaml-language-server, JetBrains IDEs read it):

```yaml
# yaml-language-server: $schema=../docs/reference/schemas/{STACK_SCHEMA}
```

or associate the files once in your editor's settings, e.g. VS Code `settings.json`:

```json
"yaml.schemas": {{
  "docs/reference/schemas/{STACK_SCHEMA}": "stacks/Pulumi.*.yaml",
  "docs/reference/schemas/{JOB_SCHEMA}": ["workloads/jobs/*.yaml", "examples/*job*.yaml"]
}}
```
"""

JOB_INTRO = f"""
Every field of a training Job spec: a file under `workloads/jobs/` or your own (one spec, a list of specs, or
`jobs: [...]`), submitted with `python -m workloads.submit --stack <stack> submit <file>`, or an item of a stack's
`{NAMESPACE}jobs`. Keys are camelCase; unknown keys are errors. With `command`, the Job runs exactly that command and
args (see [your own training code](../own-training-code.md)); without it, the image's entrypoint (the bundled
trainer) gets `--data`, `--wait-for-data`, `--resume` and the checkpoint flags implied by `dataset` and
`checkpoint`.

Validate a file in your editor with [the JSON Schema](schemas/{JOB_SCHEMA}): put
`# yaml-language-server: $schema=<relative path>/docs/reference/schemas/{JOB_SCHEMA}` on its first line (as
`examples/plain-pytorch-job.yaml` does), or associate it in your editor's settings (see
[the stack reference](stack-config.md#editor-validation)). Render it against a stack's facts to check everything
else: `python -m workloads.submit --stack <stack> render <file>`.
"""


def stack_reference(root: Path = ROOT) -> str:
    found = sections(StackConfig, "", stack_examples(root),
                     stop={TrainingJobSpec: "[the Job spec reference](job-spec.md)"})
    text = _markdown("Stack config reference", STACK_INTRO, found)
    text = text.replace("(#trainingjobspec)", "(job-spec.md#trainingjobspec)")
    # The top level's keys are written with their namespace in a stack file.
    top = [row.key for row in found[0].rows]
    for key in sorted(top, key=len, reverse=True):
        name = "aws:region" if key == "region" else f"{NAMESPACE}{key}"
        text = text.replace(f"| `{key}` |", f"| `{name}` |")
    return text


def job_reference(root: Path = ROOT) -> str:
    return _markdown("Job spec reference", JOB_INTRO, sections(TrainingJobSpec, "", job_examples(root)))


# -- JSON Schemas -------------------------------------------------------------------------------------------------
_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def job_schema() -> dict[str, Any]:
    """A Job spec file: one spec, a list of specs, or {jobs: [...]}."""
    spec = TrainingJobSpec.model_json_schema(by_alias=True)
    defs = spec.pop("$defs", {})
    defs["TrainingJobSpec"] = spec
    one = {"$ref": "#/$defs/TrainingJobSpec"}
    return {"$schema": _SCHEMA_DIALECT, "title": "ml-cluster training Job spec file",
            "anyOf": [one, {"type": "array", "items": one, "minItems": 1},
                      {"type": "object", "properties": {"jobs": {"type": "array", "items": one, "minItems": 1}},
                       "required": ["jobs"], "additionalProperties": False}],
            "$defs": defs}


def stack_schema() -> dict[str, Any]:
    """A stack file (stacks/Pulumi.<stack>.yaml): `config:` with this project's keys under their namespace."""
    model = StackConfig.model_json_schema(by_alias=True)
    defs = model.pop("$defs", {})
    secure = {"type": "object", "properties": {"secure": {"type": "string"}}, "required": ["secure"],
              "additionalProperties": False, "description": "a Pulumi secret (pulumi config set --secret)"}
    properties: dict[str, Any] = {}
    for key, schema in model["properties"].items():
        if key == "region":
            properties["aws:region"] = schema
        elif key in SECRET_KEYS:
            properties[f"{NAMESPACE}{key}"] = secure
        else:
            properties[f"{NAMESPACE}{key}"] = schema
    required = [("aws:region" if key == "region" else f"{NAMESPACE}{key}") for key in model.get("required", [])]
    config = {"type": "object", "properties": properties, "required": required,
              # Other namespaces (aws:, kubernetes:, ...) belong to their providers; ours is closed.
              "patternProperties": {f"^(?!{NAMESPACE})[A-Za-z0-9_.-]+:": {}},
              "additionalProperties": False}
    return {"$schema": _SCHEMA_DIALECT, "title": "ml-cluster stack file", "type": "object",
            "properties": {"config": config, "encryptionsalt": {"type": "string"},
                           "secretsprovider": {"type": "string"}, "encryptedkey": {"type": "string"}},
            "$defs": defs}


def outputs(root: Path = ROOT) -> dict[Path, str]:
    """Every generated file, by path relative to the repository root, with its text."""
    return {
        REFERENCE_DIR / "stack-config.md": stack_reference(root),
        REFERENCE_DIR / "job-spec.md": job_reference(root),
        SCHEMA_DIR / STACK_SCHEMA: json.dumps(stack_schema(), indent=2, sort_keys=True) + "\n",
        SCHEMA_DIR / JOB_SCHEMA: json.dumps(job_schema(), indent=2, sort_keys=True) + "\n",
    }
