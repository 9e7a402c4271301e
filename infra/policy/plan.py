"""A stack's resources as the policies see them, built from the offline plan document or from CrossGuard.

Both sources reduce to the same record: type token, logical name, inputs (camelCase, unknown values as
None), resource options, the explicit provider's inputs, and which resources each input refers to. The last
one lets a stack-level rule join a bucket to its public-access block without knowing the bucket's id, which
is unknown during a real `pulumi preview` (CrossGuard passes property dependencies; the offline plan carries
the ids the mocks assigned).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

PROVIDER_TYPE_PREFIX = "pulumi:providers:"


@dataclass(frozen=True)
class ProviderInfo:
    type: str  # "pulumi:providers:aws"
    name: str
    inputs: Mapping[str, Any]


@dataclass(frozen=True)
class PlanResource:
    type: str  # Pulumi type token, e.g. "aws:s3/bucket:Bucket"
    name: str  # logical name, unique within the stack
    inputs: Mapping[str, Any]
    protect: bool = False
    retain_on_delete: bool | None = None  # None where the source does not say (CrossGuard does not pass it)
    provider: ProviderInfo | None = None  # the explicit provider, when one was given
    refs: Mapping[str, tuple[str, ...]] = field(
        default_factory=dict
    )  # input key -> keys of referenced resources

    @property
    def key(self) -> str:
        """Unique within a stack (a logical name is unique only per type): `<type>::<name>`."""
        return resource_key(self.type, self.name)


def resource_key(resource_type: str, name: str) -> str:
    return f"{resource_type}::{name}"


class PlannedStack:
    """The resources of one stack with the lookups the stack-level rules need."""

    def __init__(self, resources: Iterable[PlanResource]) -> None:
        self.resources: tuple[PlanResource, ...] = tuple(resources)

    def __iter__(self) -> Iterator[PlanResource]:
        return iter(self.resources)

    def of_type(self, *types: str) -> list[PlanResource]:
        return [r for r in self.resources if r.type in types]

    def referrers(self, target: PlanResource, types: Iterable[str], key: str) -> list[PlanResource]:
        """Resources of `types` whose input `key` refers to `target`."""
        wanted = set(types)
        return [r for r in self.resources if r.type in wanted and target.key in r.refs.get(key, ())]


def provider_endpoint(provider: ProviderInfo | None, service: str) -> str | None:
    """The custom endpoint an aws provider sets for `service` ("s3"), or None for the AWS default.

    Provider inputs may arrive JSON-encoded (the engine serialises structured provider config to strings).
    """
    if provider is None:
        return None
    endpoints = _maybe_json(provider.inputs.get("endpoints"))
    if isinstance(endpoints, Mapping):
        endpoints = [endpoints]
    for entry in endpoints or []:
        entry = _maybe_json(entry)
        if isinstance(entry, Mapping) and entry.get(service):
            return str(entry[service])
    return None


def plan_from_document(document: Mapping[str, Any]) -> PlannedStack:
    """The offline plan document (`infra.plan.engine.plan_stack`, `scripts/plan.py --json`) as a PlannedStack.

    References come from each resource's `propertyDependencies` (input key -> URNs or logical names) when
    the document has them, and from values: an input equal to another resource's `id`, `arn` or `urn` (or
    `outputs.id`/`outputs.arn`) refers to it.
    """
    raw_resources = list(document.get("resources", []))
    owner_of_value: dict[str, str] = {}
    for raw in raw_resources:
        for value in _identity_values(raw):
            owner_of_value.setdefault(value, resource_key(raw["type"], raw["name"]))
    providers = {
        raw["name"]: ProviderInfo(raw["type"], raw["name"], raw.get("inputs") or {})
        for raw in raw_resources
        if str(raw.get("type", "")).startswith(PROVIDER_TYPE_PREFIX)
    }
    keys_by_name: dict[str, list[str]] = {}
    for raw in raw_resources:
        keys_by_name.setdefault(raw["name"], []).append(resource_key(raw["type"], raw["name"]))
    resources = []
    for raw in raw_resources:
        options = raw.get("options") or {}
        inputs = raw.get("inputs") or {}
        refs = {
            key: names
            for key, value in inputs.items()
            if (names := _referenced(value, owner_of_value, exclude=resource_key(raw["type"], raw["name"])))
        }
        for key, references in (raw.get("propertyDependencies") or {}).items():
            resolved = [k for reference in references for k in _keys_for(reference, keys_by_name)]
            refs[key] = tuple(dict.fromkeys([*refs.get(key, ()), *resolved]))
        resources.append(
            PlanResource(
                type=raw["type"],
                name=raw["name"],
                inputs=inputs,
                protect=bool(options.get("protect")),
                retain_on_delete=bool(options.get("retainOnDelete")),
                provider=_provider_named(raw.get("provider"), providers),
                refs=refs,
            )
        )
    return PlannedStack(resources)


def _identity_values(raw: Mapping[str, Any]) -> list[str]:
    values = [raw.get("id"), raw.get("arn"), raw.get("urn")]
    outputs = raw.get("outputs")
    if isinstance(outputs, Mapping):
        values += [outputs.get("id"), outputs.get("arn")]
    return [v for v in values if isinstance(v, str) and v]


def _urn_key(urn: str) -> str | None:
    """`urn:pulumi:<stack>::<project>::<parent types$>type::name` -> the resource's key."""
    parts = urn.split("::")
    return resource_key(parts[2].split("$")[-1], "::".join(parts[3:])) if len(parts) >= 4 else None


def _keys_for(reference: str, keys_by_name: Mapping[str, list[str]]) -> list[str]:
    """A URN or a bare logical name (which may name resources of several types)."""
    if reference.startswith("urn:pulumi:"):
        key = _urn_key(reference)
        return [key] if key else []
    return list(keys_by_name.get(reference, []))


def _referenced(value: Any, owner_of_value: Mapping[str, str], exclude: str) -> tuple[str, ...]:
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            owner = owner_of_value.get(item) or (_urn_key(item) if item.startswith("urn:pulumi:") else None)
            if owner and owner != exclude and owner not in found:
                found.append(owner)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return tuple(found)


def _provider_named(reference: Any, providers: Mapping[str, ProviderInfo]) -> ProviderInfo | None:
    """Resolve a plan's provider reference: a logical name, a URN, or `<urn>::<id>`."""
    if not isinstance(reference, str) or not reference:
        return None
    if reference in providers:
        return providers[reference]
    urn = reference.split("::")
    for name, provider in providers.items():
        if name in urn:
            return provider
    return None


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value
