"""Guard for `pulumi destroy` (used by .github/workflows/destroy.yml): refuse unless it is clearly meant.

    python scripts/check_destroy.py --stack NAME --confirm NAME [--stacks-dir stacks]

Exit 0 when the confirmation equals the stack name, the stack file exists, and it does not mark the stack
protected (`ml-cluster:protected: true`); otherwise exit 2 with one `error: <where>: <why>` line per problem.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Relative to the working directory, so messages read `stacks/Pulumi.prod.yaml` when run from the repository.
DEFAULT_STACKS_DIR = Path(os.path.relpath(Path(__file__).resolve().parent.parent / "stacks"))

from infra.policy.stackfile import PROTECTED_KEY, StackFileError, stack_file_path, stack_protected  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402

_STACK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def destroy_refusals(stack: str, confirmation: str, stacks_dir: Path) -> list[str]:
    """Every reason to refuse destroying `stack`, as `<where>: <why>`; empty when destroy may go ahead."""
    if not _STACK_NAME.match(stack):
        return [f"stack: {stack!r} is not a stack name (letters, digits, '_', '.', '-')"]
    problems = []
    if confirmation != stack:
        problems.append(f"confirm: {confirmation!r} does not equal the stack name {stack!r}; type the stack name")
    path = stack_file_path(stacks_dir, stack)
    if not path.is_file():
        return [*problems, f"stack: no stack file {path}"]
    try:
        if stack_protected(path):
            problems.append(
                f"{path}: {PROTECTED_KEY} is true: stack {stack!r} is protected and is never destroyed "
                "from CI; see docs/operations.md (Destroys) for the manual procedure"
            )
    except StackFileError as exc:
        problems.append(str(exc))
    return problems


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Refuse `pulumi destroy` unless confirmed and the stack is not protected.")
    parser.add_argument("--stack", required=True, help="stack to destroy")
    parser.add_argument("--confirm", required=True, help="must equal --stack")
    parser.add_argument("--stacks-dir", type=Path, default=DEFAULT_STACKS_DIR)
    args = parser.parse_args(argv)
    problems = destroy_refusals(args.stack, args.confirm, args.stacks_dir)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if problems:
        return 2
    print(f"ok: stack {args.stack!r} is confirmed and not protected")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
