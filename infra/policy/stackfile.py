"""Whether a stack file marks its stack protected (`ml-cluster:protected: true`), without the config schema.

Used where the full config model is not wanted or not importable: the destroy guard, the policy pack's config
(`ml-cluster:protected` becomes the `protected` setting of the policies that read it) and the policy tests.
"""

from __future__ import annotations

from pathlib import Path

from infra.stackyaml import StackFileError, read_stack_document

__all__ = ["PROTECTED_KEY", "StackFileError", "stack_file_path", "stack_protected"]

PROTECTED_KEY = "ml-cluster:protected"


def stack_file_path(stacks_dir: Path, stack: str) -> Path:
    return stacks_dir / f"Pulumi.{stack}.yaml"


def stack_protected(path: Path) -> bool:
    """True when the stack file sets `ml-cluster:protected` to true (YAML boolean or the string "true").

    Pulumi writes `pulumi config set ml-cluster:protected true` as the string "true", so both spellings count.
    Anything else but false/"false"/absent is an error: a guard must not guess.
    """
    document = read_stack_document(path) or {}  # StackFileError: unreadable, not a regular file, not YAML
    config = document.get("config") if isinstance(document, dict) else None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise StackFileError(path, "config: expected a mapping")
    value = config.get(PROTECTED_KEY, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise StackFileError(path, f"config.{PROTECTED_KEY}: expected true or false, got {value!r}")
