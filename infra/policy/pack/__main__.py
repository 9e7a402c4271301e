"""CrossGuard policy pack `ml-cluster`: the pure rules of infra.policy.rules adapted to pulumi_policy.

The Pulumi CLI runs this file (runpy, as __main__) in the pack's own virtualenv. Constructing PolicyPack
starts the analyzer's gRPC server and blocks, so it happens only under `if __name__ == "__main__"`; tests
import `build_policies` and drive the policies with pulumi_policy argument objects.

Policies that read `protected` (is the stack marked protected in its stack file) get it from the pack config:
`scripts/policy_config.py --stack prod` writes the file passed with `--policy-pack-config`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[3]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from pulumi_policy import (  # noqa: E402
    EnforcementLevel,
    Policy,
    PolicyConfigSchema,
    PolicyPack,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    Secret,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError  # noqa: E402

from infra.policy.plan import PlannedStack, PlanResource, ProviderInfo, resource_key  # noqa: E402
from infra.policy.rules import POLICIES, PolicyContext, PolicyRule  # noqa: E402

PACK_NAME = "ml-cluster"
PROTECTED_SCHEMA = PolicyConfigSchema(properties={"protected": {"type": "boolean", "default": False}})
_LEVELS = {"mandatory": EnforcementLevel.MANDATORY, "advisory": EnforcementLevel.ADVISORY}


def plain(value: Any) -> Any:
    """CrossGuard's property proxies as plain dicts/lists: unknown values become None, secrets "[secret]"."""
    if isinstance(value, Secret):
        return "[secret]"
    if isinstance(value, Mapping):
        result = {}
        for key in value:
            try:
                result[key] = plain(value[key])
            except UnknownValueError:
                result[key] = None
        return result
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items = []
        for index in range(len(value)):
            try:
                items.append(plain(value[index]))
            except UnknownValueError:
                items.append(None)
        return items
    return value


def to_plan_resource(source: ResourceValidationArgs | PolicyResource) -> PlanResource:
    provider = None
    if source.provider is not None:
        provider = ProviderInfo(
            source.provider.resource_type, source.provider.name, plain(source.provider.props)
        )
    refs: dict[str, tuple[str, ...]] = {}
    for key, dependencies in getattr(source, "property_dependencies", {}).items():
        refs[key] = tuple(resource_key(d.resource_type, d.name) for d in dependencies)
    return PlanResource(
        type=source.resource_type,
        name=source.name,
        inputs=plain(source.props),
        protect=bool(source.opts.protect),
        retain_on_delete=None,  # not part of PolicyResourceOptions
        provider=provider,
        refs=refs,
    )


def _context(config: Mapping[str, Any]) -> PolicyContext:
    return PolicyContext(stack_protected=bool(config.get("protected", False)))


def _policy_settings(rule: PolicyRule) -> dict[str, Any]:
    """What a CrossGuard policy takes from its rule, whether it checks resources or the whole stack."""
    return {"name": rule.name, "description": rule.description, "enforcement_level": _LEVELS[rule.enforcement],
            "config_schema": PROTECTED_SCHEMA if rule.reads_stack_protected else None}


def resource_policy(rule: PolicyRule) -> ResourceValidationPolicy:
    check = rule.check_resource
    assert check is not None

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type not in rule.resource_types:
            return
        for message in check(to_plan_resource(args), _context(args.get_config())):
            report_violation(message, args.urn)

    return ResourceValidationPolicy(validate=validate, **_policy_settings(rule))


def stack_policy(rule: PolicyRule) -> StackValidationPolicy:
    def validate(args: StackValidationArgs, report_violation: ReportViolation) -> None:
        urns = {
            resource_key(resource.resource_type, resource.name): resource.urn for resource in args.resources
        }
        plan = PlannedStack(to_plan_resource(resource) for resource in args.resources)
        for violation in rule.run(plan, _context(args.get_config())):
            urn = urns.get(violation.resource.key) if violation.resource else None
            report_violation(violation.message, urn)

    return StackValidationPolicy(validate=validate, **_policy_settings(rule))


def build_policies(rules: Sequence[PolicyRule] = POLICIES) -> list[Policy]:
    return [
        resource_policy(rule) if rule.check_resource is not None else stack_policy(rule) for rule in rules
    ]


if __name__ == "__main__":
    PolicyPack(name=PACK_NAME, policies=build_policies(), enforcement_level=EnforcementLevel.MANDATORY)
