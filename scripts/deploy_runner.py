"""The runs-on labels of each stack's deploy and preview jobs, from its stack file's `ml-cluster:deploy`.

    python scripts/deploy_runner.py dev staging prod [--github-output FILE]

Prints one JSON object, stack -> list of labels, e.g. {"dev": ["ubuntu-latest"], "prod": ["self-hosted", ...]};
with --github-output it is also appended to that file as `labels=<json>` (a GitHub Actions step output). A stack
whose runner cannot reach its API server is a config error here too (exit 2, one `error: <where>: <why>` line per
problem), so the workflow stops before any stack is touched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.config import ConfigError  # noqa: E402
from infra.config.schema import decode_config_value, parse_stack_config  # noqa: E402
from infra.plan.engine import load_stack_file, offline_config  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402


def runner_labels(stacks: list[str], stacks_dir: Path | None = None) -> dict[str, list[str]]:
    """stack -> runs-on labels; ConfigError naming every problem of every stack."""
    labels: dict[str, list[str]] = {}
    problems: list[tuple[str, str]] = []
    for stack in stacks:
        path = stacks_dir / f"Pulumi.{stack}.yaml" if stacks_dir else None
        try:
            config, secret_keys = offline_config(load_stack_file(stack, path))
            parsed = parse_stack_config({k: decode_config_value(v) for k, v in config.items()}, secret_keys)
        except ConfigError as exc:
            problems += [(f"stack {stack}: {where}", why) for where, why in exc.shown()]
            continue
        labels[stack] = parsed.deploy.runs_on()
    if problems:
        raise ConfigError(problems)
    return labels


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description="runs-on labels per stack, from ml-cluster:deploy")
    parser.add_argument("stacks", nargs="+")
    parser.add_argument("--github-output", type=Path, help="append `labels=<json>` to this file")
    args = parser.parse_args(argv)
    try:
        labels = runner_labels(args.stacks)
    except ConfigError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
        return 2
    text = json.dumps(labels, separators=(",", ":"))
    if args.github_output is not None:
        with args.github_output.open("a") as output:
            output.write(f"labels={text}\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
