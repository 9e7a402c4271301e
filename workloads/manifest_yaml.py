"""Manifests as YAML a reviewer reads: every object written out in full, never as an anchor (`&id001`) and an alias
(`*id001`), which PyYAML emits wherever two places hold the same Python object (a shared toleration list, a shared
selector). Kubernetes accepts aliases, but a reviewer diffing a rendered Job should not have to resolve them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_manifest(manifest: Any) -> str:
    return yaml.dump(manifest, Dumper=_NoAliasDumper, sort_keys=False)


def dump_manifests(manifests: Iterable[Any]) -> str:
    return yaml.dump_all(list(manifests), Dumper=_NoAliasDumper, sort_keys=False)
