"""The first-deploy acceptance kit: on a real AWS account, deploy STACK, check it as an evaluator would, destroy it,
and leave an evidence bundle (infra.acceptance; docs/operations.md, "Run the acceptance kit").

    python scripts/acceptance.py --stack dev --dry-run          # the steps and their exact commands; calls nothing
    python scripts/acceptance.py --stack dev [--keep] [--allreduce-floor GBPS] [--gang-spec FILE]
    python scripts/acceptance.py --check-bundle evidence/dev-20261127T010203Z
    python scripts/acceptance.py --print-schema                 # summary.json's JSON Schema

Steps, in order, each with a deadline: preflight, `pulumi up` (timed), kubeconfig, image (make push), verify_stack,
burn-in labels, the NCCL all-reduce against its floor, the GPU-busy benchmark, a chaos step (one EC2 instance of a
running gang terminated; the incident and the time to resume), and `pulumi destroy` with a check that nothing
billable is left. A failed step stops the run; destroy still runs once `up` began, unless --keep. Writes
evidence/<stack>-<UTC time>/ (a log per step, summary.json); exit 0 when every step passed, 1 when one failed, 2 on
bad input (one `error: <where>: <why>` line).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.acceptance.bundle import BundleError, BundleWriteError, check_bundle, schema_text  # noqa: E402
from infra.acceptance.gang import (  # noqa: E402
    GANG_FILE,
    GangError,
    checkpoint_claim,
    dataset_problem,
    dataset_sources,
    default_gang_problems,
    default_gang_spec,
    fit_problem,
    parse_gang,
    s3_head,
)
from infra.acceptance.plan import (  # noqa: E402
    GpuPool,
    Options,
    PlanError,
    Step,
    floor_warning,
    gpu_pool,
    plan_lines,
    plan_steps,
    spec_files,
)
from infra.acceptance.runlock import DeadRun, RunLock, RunLockError, claim, inspect  # noqa: E402
from infra.config import ConfigError  # noqa: E402
from workloads.cli import ArgumentParser  # noqa: E402

PYTHON = ".venv/bin/python"  # every command runs from the repository root, as make does


class UsageError(Exception):
    def __init__(self, where: str, why: str):
        self.where, self.why = where, why


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise UsageError("git", (done.stderr.strip().splitlines() or [f"git {args[0]} failed"])[-1])
    return done.stdout.strip()


def _stack_config(stack: str):  # type: ignore[no-untyped-def]
    from infra.config.schema import decode_config_value, parse_stack_config
    from infra.plan.engine import load_stack_file, offline_config

    stack_file = load_stack_file(stack, None)
    config, secret_keys = offline_config(stack_file)
    cfg = parse_stack_config({key: decode_config_value(value) for key, value in config.items()}, secret_keys)
    if cfg.platform != "eks" or cfg.region is None or cfg.cluster is None:
        raise UsageError(os.path.relpath(stack_file.path), f"ml-cluster:platform is {cfg.platform}: the acceptance kit "
                         "deploys an EKS stack (it terminates an EC2 instance and checks the account)")
    return cfg


def _shape(instance_type: str):  # type: ignore[no-untyped-def]
    from infra.nodes.instances import shape_from_result
    from infra.plan.engine import FixtureError, Fixtures

    try:
        return shape_from_result(instance_type, Fixtures().lookup("instance_types.json", instance_type,
                                                                  "instance type"))
    except FixtureError as exc:
        raise UsageError(exc.fixture, exc.why) from None


def _spec(path: str) -> dict:  # type: ignore[type-arg]
    import yaml

    from workloads.safeio import StateFileError, read_text_file

    try:
        spec = yaml.safe_load(read_text_file(path, 1 << 20))
    except StateFileError as exc:
        raise UsageError("--gang-spec", str(exc)) from None
    except yaml.YAMLError as exc:
        raise UsageError(f"--gang-spec: {path}", f"not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(spec, dict):
        raise UsageError(f"--gang-spec: {path}", "not a Job spec (a mapping)")
    return spec


def _gang(args: Any, cfg: Any, options: Options, pool: GpuPool) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """(the default gang's spec or None for --gang-spec, why the chaos step could not run, the dataset URIs to check
    in S3 before a real run)."""
    if args.gang_spec is None:
        claim = checkpoint_claim([volume.name for volume in cfg.storage.shared_volumes])
        gang = default_gang_spec(options, pool, claim, args.gang_dataset)
        parse_gang(gang, "the default spec")  # the derived spec is a valid one
        uris = [args.gang_dataset] if args.gang_dataset else []
        return gang, default_gang_problems(pool, claim, args.gang_dataset, args.stack), uris
    if args.gang_dataset is not None:
        raise UsageError("--gang-dataset", "the default gang's dataset: a --gang-spec names its own")
    spec = parse_gang(_spec(args.gang_spec), args.gang_spec)
    uris, where = dataset_sources(spec)
    return None, [line for line in (fit_problem(spec, pool.fits, args.stack), where) if line], uris


def _project() -> str:
    """The Pulumi project's name (Pulumi.yaml): every resource's `project` tag (infra/stack.py)."""
    import yaml

    return str(yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["name"])


def main(argv: list[str]) -> int:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", help="the Pulumi stack to deploy, check and destroy")
    parser.add_argument("--dry-run", action="store_true", help="print the steps and their commands; call nothing")
    parser.add_argument("--keep", action="store_true", help="leave the stack up: no destroy step (KEEP=1)")
    parser.add_argument("--allreduce-floor", type=float, metavar="GBPS",
                        help="the all-reduce floor for a type without a published one (default: the type's)")
    parser.add_argument("--gang-spec", help="the chaos step's multi-node Job spec, its dataset in S3 (default: the "
                                             "bundled trainer on the stack's GPU pool, on --gang-dataset)")
    parser.add_argument("--gang-dataset", metavar="S3_URI",
                        help="the default gang's packed dataset, s3://bucket/prefix (GANG_DATASET=)")
    parser.add_argument("--evidence", default="evidence", help="where bundles are written")
    parser.add_argument("--check-bundle", metavar="DIR", help="check a bundle's summary.json and logs, and exit")
    parser.add_argument("--print-schema", action="store_true", help="print summary.json's JSON Schema, and exit")
    args = parser.parse_args(argv)
    if args.print_schema:
        print(schema_text(), end="")
        return 0
    if args.check_bundle:
        summary = check_bundle(Path(args.check_bundle))
        running = next((step.name for step in summary.steps if step.status == "running"), None)
        print(f"ok: {args.check_bundle}: stack {summary.stack}, {summary.result}"
              + (f" (failed at {summary.failed_step})" if summary.failed_step else "")
              + (f" (step {running} was running when this summary was written: a run that died stops here)"
                 if running else ""))
        return 0
    if not args.stack:
        raise UsageError("--stack", "required (or --check-bundle DIR, --print-schema)")
    if args.allreduce_floor is not None and not args.allreduce_floor > 0:
        raise UsageError("--allreduce-floor", f"{args.allreduce_floor:g} is not a bandwidth (GB/s > 0)")
    os.chdir(ROOT)
    cfg = _stack_config(args.stack)
    if cfg.protected and not args.keep:
        raise UsageError(f"stacks/Pulumi.{args.stack}.yaml", "ml-cluster:protected is true: its destroy is refused "
                         "(scripts/check_destroy.py), so the run could not clean up: run it on an unprotected stack, "
                         "or with KEEP=1 and destroy by hand (docs/operations.md, Destroys)")
    commit, dirty = _git("rev-parse", "HEAD"), bool(_git("status", "--porcelain"))
    try:
        dead = inspect(Path(args.evidence), args.stack)
        held = None
    except RunLockError as exc:
        if not args.dry_run:
            raise
        dead, held = None, f"{exc.where}: {exc.why}"
    image_tag = _git("describe", "--tags", "--always", "--dirty").removeprefix("v")
    bundle = f"{args.evidence}/{args.stack}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"
    options = Options(stack=args.stack, python=PYTHON, bundle=bundle, image_tag=image_tag,
                      gang_spec=args.gang_spec or f"{bundle}/{GANG_FILE}", allreduce_floor=args.allreduce_floor,
                      previous_up=f"died:{dead.bundle}" if dead is not None and dead.up_began else "")
    pool = gpu_pool(cfg, _shape)
    gang, gang_problems, dataset_uris = _gang(args, cfg, options, pool)
    steps, files = plan_steps(options, cfg, pool), spec_files(options, pool, gang)
    problems = [line for line in [floor_warning(options, pool)] if line] + gang_problems
    if dirty:
        problems.append("git: uncommitted changes: the image is pushed by tag (make push refuses a dirty tree) and "
                        "the bundle names a commit: commit first")
    if args.dry_run:
        notes = [f"{line} (a real run stops here)" for line in [*problems, *([held] if held else [])]]
        notes += [f"{dead.line()} (a real run goes on)"] if dead is not None else []
        print("\n".join(plan_lines(steps, files, bundle, notes, args.keep)))
        return 0
    if not problems and dataset_uris:  # the one check that calls AWS, only when nothing else stops the run
        problems += [line for line in [dataset_problem(dataset_uris, s3_head(str(cfg.region)))] if line]
    if problems:
        where, _, why = problems[0].partition(": ")
        raise UsageError(where, why)
    return run(args.stack, cfg, steps, files, Path(bundle), commit, dirty, args.keep, Path(args.evidence), dead)


def run(stack: str, cfg, steps: list[Step], files: dict[str, str], folder: Path, commit: str,  # type: ignore[no-untyped-def]
        dirty: bool, keep: bool, evidence: Path, dead: DeadRun | None) -> int:
    """Hold the stack's run lock (taking over a dead run's) for the run, and let it go at the end."""
    lock = claim(evidence, stack, folder, datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), dead)
    if dead is not None:
        print(f"recovered: {dead.line()}", flush=True)
    try:
        return _run(stack, cfg, steps, files, folder, commit, dirty, keep, lock, dead)
    finally:
        lock.release()


def _run(stack: str, cfg, steps: list[Step], files: dict[str, str], folder: Path, commit: str,  # type: ignore[no-untyped-def]
         dirty: bool, keep: bool, lock: RunLock, dead: DeadRun | None) -> int:
    from infra.acceptance.probes import real_probes
    from infra.acceptance.runner import Run, run_command
    from workloads.safeio import atomic_write_in

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM (a cancelled CI job) ends the running step like Ctrl-C: destroy still runs

    signal.signal(signal.SIGTERM, interrupt)
    try:
        folder.mkdir(parents=True, exist_ok=False)
        for name, text in files.items():
            atomic_write_in(folder, name, text.encode(), create_dir=False)
    except OSError as exc:
        raise BundleWriteError.of(exc, folder) from None
    print(f"evidence bundle: {folder}/", flush=True)

    def execute(argv: Sequence[str], log: TextIO, deadline_s: float) -> tuple[int, str]:
        return run_command(argv, log, deadline_s, started=lambda pgid: lock.child(pgid, shlex.join(argv)))

    summary = Run(steps, folder, stack, commit, dirty, keep, execute=execute,
                  previous_run=None if dead is None else dead.line(),
                  probes=real_probes(stack, cfg.region, PYTHON, _project()),
                  report=lambda r: print(f"{r.name}: {r.status}" + (f" ({r.note})" if r.note else "")
                                         + "".join(f" {k}={v}" for k, v in r.figures.items()), flush=True))()
    print(f"{summary.result}" + (f": {summary.failed_step} failed" if summary.failed_step else "")
          + f"; send {folder}/ as docs/evidence/<date>-<who>/ (docs/operations.md)")
    return 0 if summary.result == "passed" else 1


def entry(argv: list[str]) -> int:
    try:
        return main(argv)
    except UsageError as exc:
        print(f"error: {exc.where}: {exc.why}", file=sys.stderr)
    except (PlanError, BundleError, GangError, RunLockError) as exc:
        print(f"error: {exc.where}: {exc.why}", file=sys.stderr)
    except BundleWriteError as exc:  # the run went on to destroy; what it wrote last is whole
        print(f"error: {exc.where}: {exc.why}: the evidence bundle is incomplete (its summary.json is the last "
              "one written whole)", file=sys.stderr)
    except ConfigError as exc:
        print("\n".join(exc.lines()), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
