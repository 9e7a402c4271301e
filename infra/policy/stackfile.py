"""Whether a stack file marks its stack protected (`ml-cluster:protected: true`), without the config schema.

Used where the full config model is not wanted or not importable: the destroy guard, the policy pack's config
(`ml-cluster:protected` becomes the `protected` setting of the policies that read it) and the policy tests.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from infra.stackyaml import load_stack_yaml

PROTECTED_KEY = "ml-cluster:protected"


class StackFileError(ValueError):
    """A stack file that cannot be read, or whose protected flag is not a boolean; names the file."""


def stack_file_path(stacks_dir: Path, stack: str) -> Path:
    return stacks_dir / f"Pulumi.{stack}.yaml"


def stack_protected(path: Path) -> bool:
    """True when the stack file sets `ml-cluster:protected` to true (YAML boolean or the string "true").

    Pulumi writes `pulumi config set ml-cluster:protected true` as the string "true", so both spellings count.
    Anything else but false/"false"/absent is an error: a guard must not guess.
    """
    try:
        document = load_stack_yaml(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise StackFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise StackFileError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    config = document.get("config") if isinstance(document, dict) else None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise StackFileError(f"{path}: config: expected a mapping")
    value = config.get(PROTECTED_KEY, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise StackFileError(f"{path}: config.{PROTECTED_KEY}: expected true or false, got {value!r}")
