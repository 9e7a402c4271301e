"""Predicted goodput of a stack's training Jobs at plan time: the first-order checkpoint/restart model.

Goodput is the fraction of a run's wall time that makes training progress. For a gang that checkpoints every `tau`
seconds at a cost of `delta` seconds, fails on average every `M` seconds (the whole gang: any node's failure stops
every rank) and needs `R` seconds to come back after a failure, the first-order model of Young (1974, "A first order
approximation to the optimum checkpoint interval", CACM 17(9)) and Daly (2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3)) gives

    expected goodput = 1 - delta / tau - tau / (2 M) - R / M
    optimal interval  tau* = sqrt(2 delta M)

(time spent writing checkpoints, work redone after a failure: half an interval on average, and the restart). It holds
while delta << tau << M; Daly's higher-order terms matter only when M is within a few checkpoint intervals.

The inputs, each a stated source or a documented assumption (docs/monitoring.md, "Predicted goodput"):
- node interruptions per 1000 GPU-days, per instance family (INTERRUPTIONS_PER_1000_GPU_DAYS);
- Spot reclaims per node and 30 days on a SPOT pool (SPOT_RECLAIMS_PER_NODE_MONTH);
- the checkpoint cost: the Job's checkpoint.size over checkpoint.writeRate (a file system's share where it
  checkpoints to FSx for Lustre), twice when it is also uploaded (as its
  terminationGracePeriodSeconds counts it), taken as fully blocking (an async checkpoint costs less);
- the restart time per capacity type (RESTART_S): eviction of the lost pod, a replacement node, the image pull, the
  rendezvous and the resume;
- the chosen interval: the Job's `--checkpoint-every` steps times a step time the spec does not state
  (DEFAULT_STEP_S unless the caller says otherwise).
Nothing here has been measured on a real cluster.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.plan.holdings import jobs_of, pools_of
from workloads.cluster_facts import facts_from_dict
from workloads.jobspec.pod import resolve_checkpoint_rate
from workloads.quantity import quantity_bytes

SECONDS_PER_DAY = 86400.0
# Meta's Llama 3 report (Dubey et al. 2024, "The Llama 3 Herd of Models", section 3.3.4): 419 unexpected interruptions
# in a 54-day snapshot of pre-training on 16,384 H100 GPUs = 419 / (54 x 16384) x 1000 = 0.474 per 1000 GPU-days.
LLAMA3_PER_1000_GPU_DAYS = 419 / (54 * 16384) * 1000
# Per EC2 instance family. p5 (H100) is the Llama 3 figure; the others are ASSUMED equal to it (no published rate).
INTERRUPTIONS_PER_1000_GPU_DAYS: dict[str, float] = {"p5": LLAMA3_PER_1000_GPU_DAYS, "p5e": LLAMA3_PER_1000_GPU_DAYS,
                                                      "p5en": LLAMA3_PER_1000_GPU_DAYS}
DEFAULT_INTERRUPTIONS_PER_1000_GPU_DAYS = LLAMA3_PER_1000_GPU_DAYS  # ASSUMED for families without a figure
# ASSUMED: the EC2 Spot Instance Advisor's highest "frequency of interruption" bucket (>20% of instances reclaimed in
# the trailing month), where large GPU types usually sit: 0.2 reclaims per node per 30 days.
SPOT_RECLAIMS_PER_NODE_MONTH = 0.2
# ASSUMED restart time, per capacity type: 60 s until the lost pod is evicted (NODE_LOST_TOLERATION_S), 300 s for a
# replacement instance to join (EC2 launch, EKS bootstrap, GPU operator ready), 120 s image pull, 60 s rendezvous and
# checkpoint load = 540 s on demand; a Spot replacement waits another 300 s for capacity = 840 s.
RESTART_S: dict[str, float] = {"ON_DEMAND": 540.0, "SPOT": 840.0, "CAPACITY_BLOCK": 540.0}
DEFAULT_STEP_S = 0.5  # ASSUMED seconds per training step: the spec does not state it
FAR_FACTOR = 3.0  # a chosen interval more than this many times away from the optimum gets a note


@dataclass(frozen=True)
class GoodputInputs:
    nodes: int
    gpus: int
    interruptions_per_1000_gpu_days: float
    spot_reclaims_per_node_month: float  # 0 on on-demand capacity
    checkpoint_s: float  # delta
    restart_s: float  # R
    interval_s: float  # tau, the chosen interval


@dataclass(frozen=True)
class Prediction:
    inputs: GoodputInputs
    mtbf_s: float  # M, of the whole gang
    goodput: float  # at the chosen interval
    optimal_interval_s: float
    optimal_goodput: float

    @property
    def ratio(self) -> float:
        """How many times the chosen interval is away from the optimum (>= 1, either direction)."""
        tau, best = self.inputs.interval_s, self.optimal_interval_s
        return max(tau / best, best / tau)


def gang_mtbf_s(inputs: GoodputInputs) -> float:
    """Mean time between failures of the whole gang: node MTBF / nodes, hardware and Spot rates added."""
    per_second = (inputs.interruptions_per_1000_gpu_days / 1000 * inputs.gpus / SECONDS_PER_DAY
                  + inputs.spot_reclaims_per_node_month * inputs.nodes / (30 * SECONDS_PER_DAY))
    return math.inf if per_second <= 0 else 1 / per_second


def optimal_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum: sqrt(2 delta M)."""
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def expected_goodput(checkpoint_s: float, interval_s: float, mtbf_s: float, restart_s: float) -> float:
    """1 - delta/tau - tau/(2M) - R/M (Young 1974, Daly 2006)."""
    return 1 - checkpoint_s / interval_s - interval_s / (2 * mtbf_s) - restart_s / mtbf_s


def predict(inputs: GoodputInputs) -> Prediction:
    if inputs.interval_s <= 0 or inputs.checkpoint_s <= 0:
        raise ValueError("interval_s and checkpoint_s must be positive")
    mtbf = gang_mtbf_s(inputs)
    best = optimal_interval_s(inputs.checkpoint_s, mtbf)
    return Prediction(inputs, mtbf, expected_goodput(inputs.checkpoint_s, inputs.interval_s, mtbf, inputs.restart_s),
                      best, expected_goodput(inputs.checkpoint_s, best, mtbf, inputs.restart_s))


# ------------------------------------------------------------------------------------- the plan's Jobs


def checkpoint_every(args: Sequence[str]) -> int:
    """The trainer's --checkpoint-every steps in `args` (0: none)."""
    for index, arg in enumerate(args):
        if arg == "--checkpoint-every" and index + 1 < len(args):
            return int(args[index + 1])
        if arg.startswith("--checkpoint-every="):
            return int(arg.split("=", 1)[1])
    return 0


def checkpoint_rate(plan: Mapping[str, Any], spec: Any) -> int:
    """Bytes/s the Job's checkpoint is written at, as its grace period was sized: the file system's share where it
    checkpoints to one of provisioned throughput (the plan's jobFacts), else checkpoint.writeRate."""
    data = (plan.get("outputs") or {}).get("jobFacts")
    if isinstance(data, dict):
        # facts of another shape, or a rate the plan refused already: the spec's own rate
        with contextlib.suppress(ValueError):
            spec = resolve_checkpoint_rate(spec, facts_from_dict(data))
    return quantity_bytes(spec.checkpoint.write_rate)


def job_predictions(plan: Mapping[str, Any], specs: Sequence[Any],
                    step_s: float = DEFAULT_STEP_S) -> list[tuple[str, Prediction | None, str]]:
    """(Job name, prediction or None, what it ran on or why not) for each stack Job spec rendered as a batch Job of
    `plan`; `specs` are the stack's TrainingJobSpecs (the checkpoint size and write rate are not in the plan)."""
    pools = pools_of(plan)
    rendered = {job.name: job for job in jobs_of(plan)}
    out: list[tuple[str, Prediction | None, str]] = []
    for spec in specs:
        job = rendered.get(spec.name)
        if job is None:
            continue  # another controller kind (JobSet, TrainJob): not read here
        steps = checkpoint_every(spec.args or [])
        if spec.checkpoint is None or steps <= 0:
            out.append((spec.name, None, "no checkpoints: a failure restarts the run from the start"))
            continue
        pool = next((p for p in pools if job.node_selector
                     and all(p.labels.get(k) == v for k, v in job.node_selector.items())), None)
        if pool is None:
            out.append((spec.name, None, "no node pool matches its nodeSelector"))
            continue
        per_pod = math.ceil(job.gpus_per_pod / pool.gpus_per_node) if pool.gpus_per_node and job.gpus_per_pod else 1
        writes = 2 if spec.checkpoint.uri is not None or spec.checkpoint.bucket is not None else 1
        family = pool.instance_type.split(".", 1)[0]
        inputs = GoodputInputs(
            nodes=job.pods * per_pod, gpus=job.pods * job.gpus_per_pod,
            interruptions_per_1000_gpu_days=INTERRUPTIONS_PER_1000_GPU_DAYS.get(
                family, DEFAULT_INTERRUPTIONS_PER_1000_GPU_DAYS),
            spot_reclaims_per_node_month=SPOT_RECLAIMS_PER_NODE_MONTH if pool.capacity_type == "SPOT" else 0.0,
            checkpoint_s=writes * quantity_bytes(spec.checkpoint.size) / checkpoint_rate(plan, spec),
            restart_s=RESTART_S.get(pool.capacity_type, RESTART_S["ON_DEMAND"]), interval_s=steps * step_s)
        out.append((spec.name, predict(inputs), f"{pool.name}, {pool.instance_type} {pool.capacity_type}"))
    return out


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def goodput_lines(predictions: Sequence[tuple[str, Prediction | None, str]],
                  step_s: float = DEFAULT_STEP_S) -> list[str]:
    """The plan summary's section: per Job, predicted goodput, the chosen and the optimal checkpoint interval."""
    if not predictions:
        return []
    lines = ["", f"predicted goodput (Young/Daly; step time {step_s:g} s assumed; docs/monitoring.md):"]
    for name, prediction, where in predictions:
        if prediction is None:
            lines.append(f"  {name}: not predicted: {where}")
            continue
        inputs = prediction.inputs
        lines.append(f"  {name} ({inputs.nodes} nodes, {inputs.gpus} GPUs on {where}): goodput "
                     f"{prediction.goodput:.2%} at the chosen interval {_hours(inputs.interval_s)}; optimum "
                     f"{_hours(prediction.optimal_interval_s)} -> {prediction.optimal_goodput:.2%} (checkpoint "
                     f"{inputs.checkpoint_s:.1f} s, restart {inputs.restart_s:.0f} s, gang MTBF "
                     f"{prediction.mtbf_s / SECONDS_PER_DAY:.1f} days)")
    return lines


def goodput_notes(predictions: Sequence[tuple[str, Prediction | None, str]], factor: float = FAR_FACTOR) -> list[str]:
    """A note per Job whose chosen checkpoint interval is more than `factor` times away from the optimum."""
    notes = []
    for name, prediction, _ in predictions:
        if prediction is None or prediction.ratio <= factor:
            continue
        inputs = prediction.inputs
        way = "shorter" if inputs.interval_s < prediction.optimal_interval_s else "longer"
        notes.append(f"jobs[{name}]: checkpoint interval {inputs.interval_s:.0f} s is {prediction.ratio:.1f}x {way} "
                     f"than the Young/Daly optimum {prediction.optimal_interval_s:.0f} s (checkpoint "
                     f"{inputs.checkpoint_s:.1f} s, gang MTBF {prediction.mtbf_s / SECONDS_PER_DAY:.1f} days): "
                     f"predicted goodput {prediction.goodput:.2%}, {prediction.optimal_goodput:.2%} at the optimum")
    return notes
