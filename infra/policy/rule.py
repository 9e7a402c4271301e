"""A policy as data: `PolicyRule` (per-resource checks over type tokens, or a stack-level check over the whole
plan), the `PolicyContext` the rules read beyond the resources, and the `Violation`s they report.

The rules themselves live by what they check: infra/policy/aws_rules.py (buckets, EFS, launch templates, node
groups, IAM) and infra/policy/kubernetes_rules.py (Jobs, team namespaces); infra/policy/rules.py lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from infra.policy.plan import PlannedStack, PlanResource

Enforcement = Literal["mandatory", "advisory"]


@dataclass(frozen=True)
class PolicyContext:
    """What the rules know about the stack beyond its resources (CrossGuard: the policy config)."""

    stack_protected: bool = False  # the stack file sets `ml-cluster:protected: true` (prod)


@dataclass(frozen=True)
class Violation:
    policy: str
    enforcement: Enforcement
    resource: PlanResource | None  # None for the stack as a whole
    message: str

    def __str__(self) -> str:
        where = f"{self.resource.type} {self.resource.name}" if self.resource else "stack"
        return f"{self.enforcement}: {self.policy}: {where}: {self.message}"


ResourceCheck = Callable[[PlanResource, PolicyContext], Iterable[str]]
StackCheck = Callable[[PlannedStack, PolicyContext], Iterable[tuple[PlanResource | None, str]]]


@dataclass(frozen=True)
class PolicyRule:
    name: str
    description: str
    enforcement: Enforcement
    resource_types: tuple[str, ...] = ()  # per-resource rules: the type tokens they check
    check_resource: ResourceCheck | None = None
    check_stack: StackCheck | None = None
    reads_stack_protected: bool = False  # needs PolicyContext.stack_protected (CrossGuard config "protected")

    def run(self, plan: PlannedStack, ctx: PolicyContext) -> list[Violation]:
        found: list[Violation] = []
        if self.check_resource is not None:
            for resource in plan.of_type(*self.resource_types):
                found += [self._violation(resource, m) for m in self.check_resource(resource, ctx)]
        if self.check_stack is not None:
            found += [self._violation(resource, m) for resource, m in self.check_stack(plan, ctx)]
        return found

    def _violation(self, resource: PlanResource | None, message: str) -> Violation:
        return Violation(self.name, self.enforcement, resource, message)
