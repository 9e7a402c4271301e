"""The user's per-record work in a pack: `--map module:function`, a function record -> record | None.

The function gets each record as a dict (a table row's columns; an image column already holding the image's bytes)
and returns the record to store (the declared fields), or None to leave it out (counted as filtered). It runs in
every slice and in a local pack alike, in the plan's row order. An exception it raises leaves that record out,
counted and named in the pack report with the exception ("map: ValueError: ..."), like an unreadable image; with
--strict the first one stops the pack.

The hook's identity is its module's source: the sha256 of the module file goes into the manifest ("map_hook") and
into the slices' plan digest, so a changed function is another dataset (and slices of another function never
combine). The module is imported by name from the PYTHONPATH of the packer (in a Job: its image, or a ConfigMap).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workloads.data.format.errors import DataToolError

Record = dict[str, Any]


@dataclass(frozen=True)
class MapHook:
    name: str  # module:function
    sha256: str  # of the module's source file
    function: Callable[[Record], Record | None]

    def describe(self) -> dict[str, str]:
        return {"name": self.name, "sha256": self.sha256}

    def apply(self, record: Record) -> tuple[Record | None, str]:
        """(record, "") to keep, (None, "") filtered out, (None, reason) when the function raised."""
        try:
            result = self.function(dict(record))
        except Exception as exc:  # the user's code: any failure is this record's
            return None, f"map: {type(exc).__name__}: {exc}"
        if result is not None and not isinstance(result, dict):
            return None, f"map: returned a {type(result).__name__}, not a dict or None"
        return result, ""


def load_map(spec: str) -> MapHook:
    """Import `module:function`; DataToolError naming --map when it cannot be."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute.isidentifier():
        raise DataToolError("--map", f"expected module:function, got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise DataToolError("--map", f"cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise DataToolError("--map", f"{module_name} has no function {attribute!r}")
    try:
        source = inspect.getsource(module).encode()
    except (OSError, TypeError) as exc:
        raise DataToolError("--map", f"{module_name}: no source to hash ({exc}); ship it as a .py module") from None
    return MapHook(spec, hashlib.sha256(source).hexdigest(), function)
