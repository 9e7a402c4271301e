"""The steps of an acceptance run of one stack, each with its commands and deadline: pure, so `--dry-run` prints
exactly what a real run executes.

Every step is one of the project's own commands (preflight, `pulumi up`, `make kubeconfig`, `make push`,
verify_stack, `workloads.submit`, check_destroy, `pulumi destroy`) or a probe of probes.py where no CLI does the
job (burn-in labels, the chaos step, what a destroy left behind). A command may name a value an earlier command
printed (`{allreduce_job}`: the Job `submit` created); `capture` says where it comes from.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra.acceptance.bundle import Figure
from infra.config.nodepools import NodePoolConfig
from infra.config.schema import StackConfig
from workloads.train.allreduce import FLOORS_GBPS, floor_for, parse_rows, verdict

# Deadlines per step, in seconds. `up` of a new EKS stack is mostly the control plane and the node groups (EKS
# documents 10-20 minutes for a control plane alone); two hours leaves room and still ends a stuck run.
DEADLINES_S = {"preflight": 600, "stack-state": 2400, "up": 7200, "kubeconfig": 300, "image": 3600, "verify": 1200,
               "burn-in": 3600, "allreduce": 3600, "bench-gpu": 3600, "chaos": 5400, "destroy": 5400}
JOB_CREATED = r"^created (?:job|jobset|trainjob)/(\S+) in "
SUBMIT = ("-m", "workloads.submit")


@dataclass(frozen=True)
class Command:
    """One of the project's commands. `capture`: (name, regex with one group) read from its output for the
    commands after it; `always`: runs at the end of its step even when a command before it failed (cleanup)."""

    argv: tuple[str, ...]
    capture: tuple[tuple[str, str], ...] = ()
    always: bool = False

    def shell(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class Probe:
    """A check of probes.py with its arguments (strings; `{name}` filled from captures like a command's)."""

    probe: str
    args: tuple[tuple[str, str], ...] = ()
    always: bool = False

    def shell(self) -> str:
        return f"probe {self.probe}" + "".join(f" {key}={shlex.quote(value)}" for key, value in self.args)


Action = Command | Probe


@dataclass(frozen=True)
class ActionResult:
    exit_status: int
    output: str
    seconds: float
    figures: Mapping[str, Figure] = field(default_factory=dict)


FigureParser = Callable[[Sequence[ActionResult]], dict[str, Figure]]


@dataclass(frozen=True)
class Step:
    name: str
    actions: tuple[Action, ...]
    deadline_s: float
    figures: FigureParser | None = None
    skip: str | None = None  # why the step does not apply to this stack (it is recorded as skipped)
    after_up: bool = False  # destroy: runs whenever `up` began, even after a failed step (unless keep)


@dataclass(frozen=True)
class Options:
    stack: str
    python: str  # the interpreter every project command runs under (.venv/bin/python)
    bundle: str  # the evidence folder (the generated Job specs are written there)
    image_tag: str
    gang_spec: str  # the chaos step's multi-node Job spec
    allreduce_floor: float | None = None
    namespace: str = "training"
    previous_up: str = ""  # non-empty: an earlier run of this kit died once its `up` began (its run lock says so)


@dataclass(frozen=True)
class PoolFit:
    """What a GPU pool can hold: its type, GPUs per node (its first instance type's) and its most nodes."""

    name: str
    gpu_type: str
    gpus: int
    max_size: int


@dataclass(frozen=True)
class GpuPool:
    name: str
    instance_type: str
    gpu_type: str
    gpus: int
    nodes: int  # nodes the all-reduce spans: 2 where the pool may grow to 2, else 1
    efa: bool
    fits: tuple[PoolFit, ...] = ()  # every GPU pool


class PlanError(ValueError):
    def __init__(self, where: str, why: str):
        super().__init__(f"{where}: {why}")
        self.where, self.why = where, why


def gpu_pool(cfg: StackConfig, shape_of: Callable[[str], Any]) -> GpuPool:
    """The GPU pool the checks run on: the first one with EFA, else the first GPU pool. `shape_of(type)` gives
    its InstanceShape (the offline fixtures here, as `make plan` answers them)."""
    from infra.nodes.poolplan import gpu_type_label

    pools: list[NodePoolConfig] = [pool for pool in cfg.node_pools if pool.gpu and pool.instance_types]
    if not pools:
        raise PlanError("ml-cluster:nodePools", "no GPU pool with instanceTypes: the GPU steps need one")
    shapes = [(pool, shape_of(pool.instance_types[0])) for pool in pools]
    pool, shape = next(((p, s) for p, s in shapes if s.efa_interfaces), shapes[0])
    if not shape.gpu_count or not shape.gpu_name:
        raise PlanError(f"ml-cluster:nodePools[{pool.name}]", f"{pool.instance_types[0]} has no GPUs")
    return GpuPool(pool.name, pool.instance_types[0], gpu_type_label(shape.gpu_name), shape.gpu_count,
                   min(2, pool.max_size), bool(shape.efa_interfaces),
                   tuple(PoolFit(p.name, gpu_type_label(s.gpu_name), s.gpu_count, p.max_size)
                         for p, s in shapes if s.gpu_name and s.gpu_count))


def allreduce_spec(options: Options, pool: GpuPool) -> dict[str, Any]:
    """workloads/jobs/nccl-allreduce.yaml fitted to the stack's GPU pool (its type's published floor, or --floor)."""
    floor = (["--floor", f"{options.allreduce_floor:g}"] if options.allreduce_floor is not None
             else ["--instance-type", pool.instance_type])
    return {"name": "acceptance-allreduce", "imageTag": options.image_tag,
            "command": ["torchrun", "-m", "workloads.train.allreduce"], "args": ["--max-bytes", "2Gi", *floor],
            "nodes": pool.nodes, "gpus": pool.gpus, "gpuType": pool.gpu_type, "backoffLimit": 0,
            "activeDeadlineSeconds": 1800}


def bench_spec(options: Options, pool: GpuPool) -> dict[str, Any]:
    """scripts/bench_gpu.py (in the image beside workloads/) on one node of the pool, all its GPUs' first."""
    return {"name": "acceptance-bench-gpu", "imageTag": options.image_tag,
            "command": ["python", "/app/scripts/bench_gpu.py", "--json"], "gpus": 1, "gpuType": pool.gpu_type,
            "shmSize": "8Gi", "ephemeralStorage": "20Gi", "backoffLimit": 0, "activeDeadlineSeconds": 3000}


def spec_files(options: Options, pool: GpuPool, gang: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The Job specs the run writes into its bundle (and submits from there); `gang`: the default chaos gang's."""
    dump = lambda spec: yaml.safe_dump(spec, sort_keys=False)  # noqa: E731
    files = {"allreduce-job.yaml": dump(allreduce_spec(options, pool)),
             "bench-gpu-job.yaml": dump(bench_spec(options, pool))}
    if gang is not None:
        files["gang-job.yaml"] = dump(dict(gang))
    return files


def floor_warning(options: Options, pool: GpuPool) -> str | None:
    """Why the all-reduce check cannot pass as planned (no floor for the type and none given), else None."""
    if options.allreduce_floor is not None or pool.instance_type in FLOORS_GBPS:
        return None
    return (f"--allreduce-floor: no published nccl-tests floor for {pool.instance_type} (pool {pool.name}): the "
            "all-reduce check fails without one; pass ALLREDUCE_FLOOR=GBPS (docs/operations.md, Verify EFA)")


# --- figures -------------------------------------------------------------------------------------------------------

def up_figures(results: Sequence[ActionResult]) -> dict[str, Figure]:
    """The time of `pulumi up` itself (the second command, after the policy pack's config)."""
    return {"up_seconds": round(results[1].seconds, 1)} if len(results) > 1 else {}


def verify_figures(results: Sequence[ActionResult]) -> dict[str, Figure]:
    import json

    try:
        checks = json.loads(results[0].output)
    except json.JSONDecodeError:
        return {}
    if not isinstance(checks, list):
        return {}
    statuses = [check.get("status") for check in checks if isinstance(check, dict)]
    return {"checks": len(statuses), "checks_failed": statuses.count("FAIL"), "checks_skipped": statuses.count("SKIP")}


def allreduce_figures(floor: float | None, why: str) -> FigureParser:
    def figures(results: Sequence[ActionResult]) -> dict[str, Figure]:
        rows = parse_rows(results[-1].output.splitlines())
        passed, line = verdict(rows, floor, why)
        at = [row for row in rows if row.size_bytes == 2**31] or sorted(rows, key=lambda row: row.size_bytes)[-1:]
        return {"allreduce_busbw_gbps": at[0].busbw_gbps if at else None,
                "allreduce_bytes": at[0].size_bytes if at else None,
                "allreduce_floor_gbps": floor, "allreduce_passed": passed, "allreduce_verdict": line}
    return figures


def bench_figures(results: Sequence[ActionResult]) -> dict[str, Figure]:
    """bench_gpu.py --json's report from the pod's log: the GPU-busy share per model."""
    import json

    text = results[-1].output
    start = text.find("{\n")
    try:
        report = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict):
        return {}
    figures: dict[str, Figure] = {"gpu_device": report.get("device")}
    for entry in report.get("results") or []:
        if isinstance(entry, dict) and isinstance(entry.get("gpu_busy_share"), int | float):
            figures[f"gpu_busy_share_{entry.get('model')}"] = round(float(entry["gpu_busy_share"]), 4)
    return figures


def probe_figures(results: Sequence[ActionResult]) -> dict[str, Figure]:
    merged: dict[str, Figure] = {}
    for result in results:
        merged.update(result.figures)
    return merged


# --- the steps -----------------------------------------------------------------------------------------------------

def _submit(options: Options, *words: str, capture: tuple[tuple[str, str], ...] = (),
            always: bool = False) -> Command:
    return Command((options.python, *SUBMIT, "--stack", options.stack, "-n", options.namespace, *words),
                   capture, always)


def plan_steps(options: Options, cfg: StackConfig, pool: GpuPool) -> list[Step]:
    """The run, in order: preflight, stack-state (what an interrupted earlier `up` left: stackstate.py), up,
    kubeconfig, image, verify, burn-in, allreduce, bench-gpu, chaos, destroy (its own stack-state check first)."""
    py, stack, bundle = options.python, options.stack, options.bundle
    watch = lambda name, deadline: _submit(options, "watch", name, "--timeout", str(deadline))  # noqa: E731
    submit_allreduce = _submit(options, "submit", f"{bundle}/allreduce-job.yaml",
                               capture=(("allreduce_job", JOB_CREATED),))
    burn_in = cfg.gpu.health.runs(cfg.protected)
    label = f"{cfg.label_prefix}/gpu-health"
    floor, why = floor_for(pool.instance_type, options.allreduce_floor)
    cluster = cfg.cluster.name if cfg.cluster is not None else ""
    deadline = DEADLINES_S
    return [
        Step("preflight", (Command((py, "scripts/preflight.py", "--stack", stack)),), deadline["preflight"]),
        Step("stack-state", (Probe("stack_state", (("stack", stack), ("ours", options.previous_up))),),
             deadline["stack-state"], probe_figures),
        Step("up", (Command((py, "scripts/policy_config.py", "--stack", stack, "--out",
                             f"{bundle}/policy-config.json")),
                    Command(("pulumi", "up", "--stack", stack, "--yes", "--non-interactive", "--policy-pack",
                             "infra/policy/pack", "--policy-pack-config", f"{bundle}/policy-config.json"))),
             deadline["up"], up_figures),
        Step("kubeconfig", (Command(("make", "-s", "kubeconfig", f"STACK={stack}")),
                            Command(("pulumi", "stack", "output", "--json", "--stack", stack))),  # secrets: [secret]
             deadline["kubeconfig"]),
        Step("image", (Command(("make", "-s", "push", f"STACK={stack}", f"IMAGE_TAG={options.image_tag}")),),
             deadline["image"]),
        Step("verify", (Command((py, "scripts/verify_stack.py", "--stack", stack, "--json")),), deadline["verify"],
             verify_figures),
        Step("burn-in", (submit_allreduce,
                         Probe("burn_in_labels", (("pool", pool.name), ("nodes", str(pool.nodes)), ("label", label),
                                                  ("pool_label", f"{cfg.label_prefix}/pool")))),
             deadline["burn-in"], probe_figures,
             skip=None if burn_in else f"ml-cluster:gpu.health: the burn-in is off in stack {stack}: no label to "
                                       "check (the all-reduce Job scales the pool up itself)"),
        Step("allreduce", (*(() if burn_in else (submit_allreduce,)),
                           watch("{allreduce_job}", deadline["allreduce"]),
                           _submit(options, "logs", "{allreduce_job}", always=True)),
             deadline["allreduce"], allreduce_figures(floor, why)),
        Step("bench-gpu", (_submit(options, "submit", f"{bundle}/bench-gpu-job.yaml",
                                   capture=(("bench_job", JOB_CREATED),)),
                           watch("{bench_job}", deadline["bench-gpu"]),
                           _submit(options, "logs", "{bench_job}", always=True)),
             deadline["bench-gpu"], bench_figures),
        Step("chaos", (_submit(options, "submit", options.gang_spec, capture=(("gang_job", JOB_CREATED),)),
                       Probe("chaos", (("job", "{gang_job}"), ("namespace", options.namespace))),
                       _submit(options, "delete", "{gang_job}", always=True)),
             deadline["chaos"], probe_figures),
        Step("destroy", (Command((py, "scripts/check_destroy.py", "--stack", stack, "--confirm", stack)),
                         Probe("stack_state", (("stack", stack), ("ours", options.previous_up + "{interrupted?}"))),
                         Command(("pulumi", "destroy", "--stack", stack, "--yes", "--non-interactive")),
                         Probe("leftovers", (("stack", stack), ("cluster", cluster)))),
             deadline["destroy"], probe_figures, after_up=True),
    ]


def plan_lines(steps: Sequence[Step], files: Mapping[str, str], bundle: str, warnings: Sequence[str],
               keep: bool) -> list[str]:
    """What `--dry-run` prints: the warnings, each step with its deadline and exact commands, the Job specs."""
    lines = [f"warning: {line}" for line in warnings]
    lines.append(f"evidence bundle: {bundle}/ (summary.json and a log per step)")
    for number, step in enumerate(steps, start=1):
        extra = " (runs whenever up began, unless KEEP=1)" if step.after_up else ""
        lines.append(f"{number:2d}. {step.name} (deadline {step.deadline_s:g} s){extra}")
        skip = "KEEP=1: the stack stays up" if step.after_up and keep else step.skip
        if skip:
            lines.append(f"    skipped: {skip}")
            continue
        lines += [f"    $ {action.shell()}" for action in step.actions]
    for name, text in files.items():
        lines += [f"--- {bundle}/{name}", *text.rstrip("\n").split("\n")]
    return lines
