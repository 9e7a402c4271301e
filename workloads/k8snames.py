"""Kubernetes names, written once: the DNS-1123 label (most object names, namespaces, a stack's name), the DNS-1123
subdomain (the other object names, node names, label-key prefixes), the DNS-1035 label (Service names), and label
names and values.

The rules are apimachinery's (k8s.io/apimachinery pkg/util/validation/validation.go: IsDNS1123Label,
IsDNS1123Subdomain, IsDNS1035Label, IsQualifiedName's name part, IsValidLabelValue); the patterns are the same
strings as before, so a pydantic `pattern=` built from them leaves the generated JSON schema unchanged.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_MAX = 63

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_LABEL_PATTERN = rf"^{_LABEL}$"
DNS1123_SUBDOMAIN_PATTERN = rf"^{_LABEL}(\.{_LABEL})*$"
DNS1035_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
LABEL_VALUE_MAX = 63
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"  # empty, or alphanumerics and -_. inside

_DNS1123_LABEL = re.compile(DNS1123_LABEL_PATTERN)
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_PATTERN)
_DNS1035_LABEL = re.compile(DNS1035_LABEL_PATTERN)
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


def is_dns_label(value: str, max_length: int | None = DNS1123_LABEL_MAX) -> bool:
    """A DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit, at most
    `max_length` (63; None: the caller checks the length) characters."""
    return (max_length is None or len(value) <= max_length) and _DNS1123_LABEL.fullmatch(value) is not None


def is_dns_subdomain(value: str) -> bool:
    """A DNS-1123 subdomain: DNS-1123 labels joined by '.', at most 253 characters."""
    return len(value) <= DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(value) is not None


def is_dns1035_label(value: str, max_length: int | None = DNS1035_LABEL_MAX) -> bool:
    """A DNS-1035 label: a DNS-1123 label that starts with a letter (a Service's name), at most `max_length` (None:
    the caller checks the length)."""
    return (max_length is None or len(value) <= max_length) and _DNS1035_LABEL.fullmatch(value) is not None



def is_label_value(value: str) -> bool:
    """A label value: empty, or at most 63 letters, digits, '-', '_' and '.', starting and ending alphanumeric."""
    return len(value) <= LABEL_VALUE_MAX and _LABEL_VALUE.fullmatch(value) is not None


def is_label_name(value: str) -> bool:
    """The name part of a label key (after an optional `prefix/`): a non-empty label value."""
    return value != "" and is_label_value(value)


# pydantic field types (the validators' names are what the generated reference shows as the rule).


def dns_label(value: str) -> str:
    if not is_dns_label(value):
        raise ValueError(f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', at most 63)")
    return value


def dns_subdomain(value: str) -> str:
    if not is_dns_subdomain(value):
        raise ValueError(f"{value!r} is not a DNS-1123 subdomain")
    return value


DnsLabel = Annotated[str, AfterValidator(dns_label)]
DnsSubdomain = Annotated[str, AfterValidator(dns_subdomain)]


# Namespaces Kubernetes itself owns: `default`, and every `kube-` name (kube-system, kube-public, kube-node-lease;
# Kubernetes docs, "Namespaces": "Avoid creating namespaces with the prefix kube-, since it is reserved for
# Kubernetes system namespaces").
SYSTEM_NAMESPACE_PREFIX = "kube-"
SYSTEM_NAMESPACES = frozenset({"default"})


def reserved_namespace(name: str, stack_namespaces: frozenset[str] = frozenset()) -> str | None:
    """Why `name` cannot be a namespace of a tenant's own (Kubernetes' own, or one the stack installs into), or
    None. A team put there would get a deny-all NetworkPolicy, a quota and edit rights in a namespace shared with
    the system."""
    if name in SYSTEM_NAMESPACES or name.startswith(SYSTEM_NAMESPACE_PREFIX):
        return f"{name} is a Kubernetes system namespace"
    if name in stack_namespaces:
        return f"{name} is a namespace the stack installs into ({', '.join(sorted(stack_namespaces))})"
    return None
