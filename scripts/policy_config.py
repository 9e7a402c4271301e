"""Write the CrossGuard pack config for a stack: `protected` from its stack file, for the rules reading it.

    python scripts/policy_config.py --stack NAME [--stacks-dir stacks] [--out FILE]

The file is what `pulumi preview|up --policy-pack infra/policy/pack --policy-pack-config FILE` takes
(pulumi/actions: `policyPackConfigs`). Printed without --out. Exit 2 with `error: <where>: <why>` for a
missing or bad stack file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# Relative to the working directory, so messages read `stacks/Pulumi.prod.yaml` when run from the repository.
DEFAULT_STACKS_DIR = Path(os.path.relpath(Path(__file__).resolve().parent.parent / "stacks"))

from infra.policy.rules import POLICIES  # noqa: E402
from infra.policy.stackfile import StackFileError, stack_file_path, stack_protected  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402
from workloads.data.format.manifest import atomic_write_bytes  # noqa: E402


def pack_config(protected: bool) -> dict[str, dict[str, bool]]:
    return {rule.name: {"protected": protected} for rule in POLICIES if rule.reads_stack_protected}


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="Write the policy pack config for a stack.")
    parser.add_argument("--stack", required=True)
    parser.add_argument("--stacks-dir", type=Path, default=DEFAULT_STACKS_DIR)
    parser.add_argument("--out", type=Path, help="write here (atomically) instead of printing")
    args = parser.parse_args(argv)
    path = stack_file_path(args.stacks_dir, args.stack)
    if not path.is_file():
        print(f"error: stack: no stack file {path}", file=sys.stderr)
        return 2
    try:
        protected = stack_protected(path)
    except StackFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(pack_config(protected), indent=2, sort_keys=True) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        atomic_write_bytes(args.out, text.encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
