"""Predicted goodput of a training Job: the first-order checkpoint/restart model, its stated inputs, and the spec's
`goodput:` block that overrides them.

Goodput is the fraction of a run's wall time that makes training progress. For a gang that checkpoints every `tau`
seconds at a cost of `delta` seconds, fails on average every `M` seconds (the whole gang: any node's failure stops
every rank) and needs `R` seconds to come back after a failure, the first-order model of Young (1974, "A first order
approximation to the optimum checkpoint interval", CACM 17(9)) and Daly (2006, "A higher order estimate of the optimum
checkpoint interval for restart dumps", FGCS 22(3)) gives

    expected goodput = 1 - delta / tau - tau / (2 M) - R / M
    optimal interval  tau* = sqrt(2 delta M)

(time spent writing checkpoints, work redone after a failure: half an interval on average, and the restart). It holds
while delta << tau << M; Daly's higher-order terms matter only when M is within a few checkpoint intervals.

A sharded checkpoint (workloads/train/sharded.py) is asynchronous and skipped while the previous one is in flight:
the loop is blocked only for the snapshot into host memory (`s`, the stall), the write and the copy (delta) run beside
the next steps, so saves start every tau_e = tau x ceil(delta / tau) (the next interval after the previous save is
complete: max(tau, delta) rounded up to whole intervals), and a failure loses the work since the newest COMPLETE
save: tau_e/2 + delta on average (the save in flight counts for nothing). The model then says

    expected goodput = 1 - s / tau_e - (tau_e / 2 + delta) / M - R / M
    optimal interval  tau* = max(sqrt(2 s M), delta)

The inputs, each a stated source or a documented assumption (docs/monitoring.md, "Predicted goodput"):
- node interruptions per 1000 GPU-days, per instance family (INTERRUPTIONS_PER_1000_GPU_DAYS);
- Spot reclaims per node and 30 days on a SPOT pool (SPOT_RECLAIMS_PER_NODE_MONTH);
- the checkpoint cost: what the Job's stop path takes to save (TrainingJobSpec.checkpoint_save_seconds: size over
  writeRate, twice when uploaded; sharded: the per-node share), fully blocking unless the checkpoint is sharded;
- sharded: the stall, each rank's share over STAGING_BYTES_PER_S (half a measured rate), unless the Job waits for a
  save in flight (--checkpoint-if-busy wait), which the model takes as blocking (an upper bound);
- the restart time per capacity type (RESTART_S);
- the chosen interval: the Job's `--checkpoint-every` steps times `goodput.stepSeconds` (DEFAULT_STEP_S assumed).
`goodput.mtbfHours` and `goodput.restartSeconds` replace the rates and the restart time for one Job.
Nothing here has been measured on a real cluster. Pure: no Pulumi, no Kubernetes (submit render uses it too).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import Field

from workloads.jobspec.fields import _Spec

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
# MEASURED: one rank's copy of its shards into host memory through the checkpointer's cached pinned staging
# (workloads/train/pinned.py), the SECOND save of a 3 GiB state, one H100 80GB HBM3, torch 2.11.0+cu130:
# 3 GiB in 0.0623 s = 48 GiB/s (scripts/bench_checkpoint_device.py --device cuda --state-mib 3072, the lead's device
# run; a raw pinned device-to-host copy measured 51.3 GiB/s, a pageable one 1.48 GiB/s).
MEASURED_PINNED_STAGING_BYTES_PER_S = 48 << 30
# What the model uses: half of it, ASSUMED, to stay conservative (a stall predicted longer, goodput lower) where the
# measurement does not reach: every rank of a node staging at once shares the host's memory bandwidth (one rank was
# measured). A run's first save also allocates and pins the buffers, once per start and not in the model: a 1 GiB
# state on the same card and torch took 0.088 s (11.3 GiB/s) plain, 1.05 s (0.95 GiB/s) FSDP2, against 0.023 s and
# 0.025 s on the second save (scripts/bench_checkpoint_device.py --device cuda --state-mib 1024).
STAGING_BYTES_PER_S = MEASURED_PINNED_STAGING_BYTES_PER_S // 2
DEFAULT_STEP_S = 0.5  # ASSUMED seconds per training step where the spec does not state goodput.stepSeconds
FAR_FACTOR = 3.0  # a chosen interval more than this many times away from the optimum gets a note


class GoodputSpec(_Spec):
    """What the goodput prediction should use for this Job instead of its assumptions (docs/monitoring.md)."""

    step_seconds: float | None = Field(default=None, gt=0, le=86400, allow_inf_nan=False)
    ("Seconds per training step (a batch event's data_time + compute_time, or an estimate): the predicted checkpoint "
     "interval is --checkpoint-every x this. Unset: 0.5 s assumed.")
    mtbf_hours: float | None = Field(default=None, gt=0, le=10_000_000, allow_inf_nan=False)
    ("The whole gang's mean time between failures, hours, instead of the per-family interruption rate and the Spot "
     "reclaims (for example from your own incident history).")
    restart_seconds: float | None = Field(default=None, gt=0, le=7 * 86400, allow_inf_nan=False)
    ("Seconds from a failure to the gang's first step after the resume, instead of the assumed 540 s (840 s on Spot); "
     "`submit status` reports each incident's time to resume.")


@dataclass(frozen=True)
class GoodputInputs:
    nodes: int
    gpus: int
    interruptions_per_1000_gpu_days: float
    spot_reclaims_per_node_month: float  # 0 on on-demand capacity
    checkpoint_s: float  # delta
    restart_s: float  # R
    interval_s: float  # tau, the chosen interval
    step_s: float = DEFAULT_STEP_S  # what tau was computed from
    step_stated: bool = False  # goodput.stepSeconds gave step_s (else DEFAULT_STEP_S, assumed)
    mtbf_s: float | None = None  # goodput.mtbfHours: replaces the rates
    stall_s: float | None = None  # s: an asynchronous save's stall (sharded, skip-while-busy); None: delta blocks


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
    """Mean time between failures of the whole gang: the stated one, else node MTBF / nodes, hardware and Spot rates
    added."""
    if inputs.mtbf_s is not None:
        return inputs.mtbf_s
    per_second = (inputs.interruptions_per_1000_gpu_days / 1000 * inputs.gpus / SECONDS_PER_DAY
                  + inputs.spot_reclaims_per_node_month * inputs.nodes / (30 * SECONDS_PER_DAY))
    return math.inf if per_second <= 0 else 1 / per_second


def optimal_interval_s(checkpoint_s: float, mtbf_s: float, stall_s: float | None = None) -> float:
    """Young's first-order optimum: sqrt(2 delta M); asynchronous (stall_s): max(sqrt(2 s M), delta), no save
    starting more often than the previous one completes."""
    if stall_s is None:
        return math.sqrt(2 * checkpoint_s * mtbf_s)
    return max(math.sqrt(2 * stall_s * mtbf_s), checkpoint_s)


def effective_interval_s(checkpoint_s: float, interval_s: float) -> float:
    """Asynchronous saves skipped while one is in flight start every tau x ceil(delta / tau)."""
    return interval_s * max(1, math.ceil(checkpoint_s / interval_s - 1e-9))


@dataclass(frozen=True)
class Terms:
    """The model's terms for one checkpoint interval: how often a save starts, what each blocks the loop, what a
    failure loses and what it costs to come back (seconds)."""

    interval_s: float  # tau, or tau_e for asynchronous saves skipped while one is in flight
    blocked_s: float  # delta, or the stall s of an asynchronous save
    lost_s: float  # tau/2, or tau_e/2 + delta (the save in flight counts for nothing); an orderly stop: delta
    restart_s: float  # R

    def first_order(self, mtbf_s: float) -> float:
        """1 - blocked/interval - lost/M - R/M: the module's formula (it holds while delta << tau << M)."""
        return 1 - self.blocked_s / self.interval_s - self.lost_s / mtbf_s - self.restart_s / mtbf_s

    def unexpanded(self, mtbf_s: float) -> float:
        """The same terms without the first-order expansion: 1 / (1 + blocked/interval + (lost + R)/M), productive
        time over productive plus lost time, for an M that is not much larger than the interval and R (the chaos
        harness's trials: seconds, not days)."""
        return 1 / (1 + self.blocked_s / self.interval_s + (self.lost_s + self.restart_s) / mtbf_s)


def goodput_terms(checkpoint_s: float, interval_s: float, restart_s: float, stall_s: float | None = None, *,
                  orderly: bool = False) -> Terms:
    """The terms of the module's model: synchronous saves (stall_s None) block delta every tau and a failure loses
    tau/2 on average; asynchronous ones block s every tau_e and a failure loses tau_e/2 + delta. orderly: a stop
    with notice (SIGTERM: a drain, a Spot notice) loses no steps but waits for one last whole save (delta)."""
    if stall_s is None:
        return Terms(interval_s, checkpoint_s, checkpoint_s if orderly else interval_s / 2, restart_s)
    every = effective_interval_s(checkpoint_s, interval_s)
    return Terms(every, stall_s, checkpoint_s if orderly else every / 2 + checkpoint_s, restart_s)


def expected_goodput(checkpoint_s: float, interval_s: float, mtbf_s: float, restart_s: float,
                     stall_s: float | None = None) -> float:
    """1 - delta/tau - tau/(2M) - R/M (Young 1974, Daly 2006); with an asynchronous save's stall s,
    1 - s/tau_e - (tau_e/2 + delta)/M - R/M (module text; goodput_terms). Never below 0 (the terms then say the run
    makes no progress: a checkpoint longer than its interval, a restart longer than the time between failures)."""
    return max(0.0, goodput_terms(checkpoint_s, interval_s, restart_s, stall_s).first_order(mtbf_s))


def predict(inputs: GoodputInputs) -> Prediction:
    for name in ("interval_s", "checkpoint_s", "restart_s"):
        value = getattr(inputs, name)
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, not {value!r}")
    mtbf = gang_mtbf_s(inputs)
    if not mtbf > 0:
        raise ValueError(f"mtbf_s must be positive, not {mtbf!r}")
    stall = inputs.stall_s
    if stall is not None and not (math.isfinite(stall) and stall >= 0):
        raise ValueError(f"stall_s must be a finite number >= 0, not {stall!r}")
    best = optimal_interval_s(inputs.checkpoint_s, mtbf, stall)
    return Prediction(inputs, mtbf,
                      expected_goodput(inputs.checkpoint_s, inputs.interval_s, mtbf, inputs.restart_s, stall),
                      best, expected_goodput(inputs.checkpoint_s, best, mtbf, inputs.restart_s, stall))


def inputs_to_dict(inputs: GoodputInputs) -> dict[str, Any]:
    """The inputs as the `jobGoodput` output holds them; stall_s only for an asynchronous checkpoint."""
    data = asdict(inputs)
    if data["stall_s"] is None:
        del data["stall_s"]
    return data


def inputs_from_dict(data: Any) -> GoodputInputs:
    """The inputs as a plan's `jobGoodput` output holds them; ValueError naming the field when one is off."""
    if not isinstance(data, dict):
        raise ValueError(f"expected an object, got {type(data).__name__}")
    fields = GoodputInputs.__dataclass_fields__
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{unknown[0]}: not a goodput input")
    for name, value in data.items():
        if name == "step_stated":
            if not isinstance(value, bool):
                raise ValueError(f"{name}: expected true or false")
        elif (value is not None or name not in ("mtbf_s", "stall_s")) and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value < 0):
            raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    try:
        return GoodputInputs(**data)
    except TypeError as exc:  # a missing field
        raise ValueError(str(exc)) from None


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds:.0f} s"


def prediction_line(name: str, prediction: Prediction, where: str) -> str:
    """`resnet50-ddp (2 nodes, 16 GPUs on gpu-h100, p5.48xlarge ON_DEMAND): goodput 97.95% at the chosen interval
    500 s; optimum 4.24 h -> 99.86% (checkpoint 10.2 s, restart 540 s, gang MTBF 132.0 days)`"""
    inputs = prediction.inputs
    step = "" if inputs.step_stated else f", step {inputs.step_s:g} s assumed"
    return (f"{name} ({inputs.nodes} nodes, {inputs.gpus} GPUs on {where}): goodput {prediction.goodput:.2%} at the "
            f"chosen interval {_hours(inputs.interval_s)}; optimum {_hours(prediction.optimal_interval_s)} -> "
            f"{prediction.optimal_goodput:.2%} (checkpoint {inputs.checkpoint_s:.1f} s"
            f"{'' if inputs.stall_s is None else f' in the background, stall {inputs.stall_s:.2f} s'}, restart "
            f"{inputs.restart_s:.0f} s, gang MTBF {prediction.mtbf_s / SECONDS_PER_DAY:.1f} days{step})")


def far_note(name: str, prediction: Prediction, factor: float = FAR_FACTOR) -> str | None:
    """The note for a Job whose chosen checkpoint interval is more than `factor` times away from the optimum."""
    if prediction.ratio <= factor:
        return None
    inputs = prediction.inputs
    way = "shorter" if inputs.interval_s < prediction.optimal_interval_s else "longer"
    return (f"jobs[{name}]: checkpoint interval {inputs.interval_s:.0f} s is {prediction.ratio:.1f}x {way} than "
            f"the Young/Daly optimum {prediction.optimal_interval_s:.0f} s (checkpoint {inputs.checkpoint_s:.1f} s, "
            f"gang MTBF {prediction.mtbf_s / SECONDS_PER_DAY:.1f} days): predicted goodput {prediction.goodput:.2%}, "
            f"{prediction.optimal_goodput:.2%} at the optimum")
