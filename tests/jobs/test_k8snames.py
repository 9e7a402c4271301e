"""The one Kubernetes-name validator (workloads.k8snames), and that the schema patterns built from it are unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.k8snames import (
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_PATTERN,
    is_dns1035_label,
    is_dns_label,
    is_dns_subdomain,
    is_label_name,
    is_label_value,
)


@pytest.mark.parametrize(("value", "label", "subdomain", "dns1035"), [
    ("train", True, True, True),
    ("9lives", True, True, False),
    ("a" * 63, True, True, True),
    ("a" * 64, False, True, False),
    ("ml-cluster.io", False, True, False),
    ("-x", False, False, False),
    ("x-", False, False, False),
    ("Upper", False, False, False),
    ("", False, False, False),
    ("dev\n", False, False, False),  # `$` alone would let a trailing newline through
    (".".join(["a" * 63] * 4), False, False, False),  # 255 characters
])
def test_the_dns_rules(value: str, label: bool, subdomain: bool, dns1035: bool) -> None:
    assert (is_dns_label(value), is_dns_subdomain(value), is_dns1035_label(value)) == (label, subdomain, dns1035)


def test_a_length_the_caller_checks_itself() -> None:
    assert is_dns_label("a" * 80, max_length=None) and not is_dns_label("a" * 80)
    assert is_dns1035_label("abcd", max_length=4) and not is_dns1035_label("abcde", max_length=4)


def test_label_values_and_names() -> None:
    assert is_label_value("") and not is_label_name("")
    assert is_label_value("A_b.c-9") and is_label_name("gpu-type")
    assert not is_label_value("_x") and not is_label_value("x" * 64)


def test_the_schema_keeps_the_patterns_it_had() -> None:
    schema = json.loads(Path("docs/reference/schemas/stack-file.schema.json").read_text())
    text = json.dumps(schema)
    assert json.dumps(DNS1123_LABEL_PATTERN) in text and json.dumps(DNS1123_SUBDOMAIN_PATTERN) in text
