"""The trainer's module imports no boto3 (nor botocore, s3transfer) where no checkpoint or dataset is on S3: the
S3 checkpoint mirror and tier import it where they are made. Checked in this process, with the workloads modules
imported afresh and an import blocker that records what asked for boto3, then the modules put back as they were
(a subprocess would spend seconds importing torch again)."""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType

S3_PACKAGES = ("boto3", "botocore", "s3transfer")


def ours(name: str) -> bool:
    return name.split(".")[0] in ("workloads", *S3_PACKAGES)


class Blocker(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.asked: list[str] = []

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        if name.split(".")[0] in S3_PACKAGES:
            self.asked.append(name)
            raise ImportError(f"blocked in this test: {name}")


def test_the_trainers_module_imports_without_boto3() -> None:
    saved = {name: module for name, module in sys.modules.items() if ours(name)}
    blocker = Blocker()
    for name in saved:
        del sys.modules[name]
    sys.meta_path.insert(0, blocker)
    try:
        importlib.import_module("workloads.train.__main__")
        loaded = sorted(name for name in sys.modules if name.split(".")[0] in S3_PACKAGES)
        fresh = "workloads.train.checkpoint" in sys.modules and "workloads.train.tiers" in sys.modules
    finally:
        sys.meta_path.remove(blocker)
        for name in [name for name in sys.modules if ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
    assert fresh  # the modules that hold the S3 checkpoint stores were imported by this test
    assert blocker.asked == [] and loaded == []
