"""A spec's goodput prediction against the cluster facts (workloads.jobspec.goodput): the pool it lands on (its
instance family's failure rate, its capacity type's Spot reclaims and restart time), its gang size, its checkpoint
cost and interval. The stack computes it for its Jobs (the plan's `jobGoodput` output) and `submit render` for the
spec it renders, whatever the controller kind."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workloads.cluster_facts import ClusterFacts, PoolFacts
from workloads.jobspec.fields import JobSpecError
from workloads.jobspec.goodput import (
    DEFAULT_INTERRUPTIONS_PER_1000_GPU_DAYS,
    DEFAULT_STEP_S,
    INTERRUPTIONS_PER_1000_GPU_DAYS,
    RESTART_S,
    SPOT_RECLAIMS_PER_NODE_MONTH,
    STAGING_BYTES_PER_S,
    GoodputInputs,
    Prediction,
    inputs_to_dict,
    predict,
)
from workloads.jobspec.placement import candidate_pools
from workloads.jobspec.pod import resolve_checkpoint_rate
from workloads.jobspec.spec import TrainingJobSpec

CHECKPOINT_EVERY = "--checkpoint-every"
GOODPUT_OUTPUT = "jobGoodput"  # the stack output (infra/stack.py) the plan summary predicts from
PREDICTED_ANNOTATION = "predicted-goodput"  # <label prefix>/predicted-goodput: "0.9981" (a fraction)


def checkpoint_every(words: list[str]) -> int | str:
    """The last --checkpoint-every N in `words` (argparse's rule); 0 when absent; a reason when N is not a whole
    number of steps."""
    found: str | None = None
    for index, word in enumerate(words):
        if word == CHECKPOINT_EVERY and index + 1 < len(words):
            found = words[index + 1]
        elif word.startswith(CHECKPOINT_EVERY + "="):
            found = word.split("=", 1)[1]
    if found is None:
        return 0
    if not found.isdigit() or len(found) > 12:
        return f"{CHECKPOINT_EVERY} {found[:40]!r} is not a whole number of steps"
    return int(found)


def pool_where(pool: PoolFacts) -> str:
    return f"{pool.name}, {pool.instance_type or 'instance type unknown'} {pool.capacity_type or 'ON_DEMAND'}"


def spec_goodput_inputs(spec: TrainingJobSpec, facts: ClusterFacts) -> tuple[GoodputInputs | None, str]:
    """(inputs, where it runs) or (None, why not predicted)."""
    if spec.gpus == 0:
        return None, "no GPUs: the failure rates are per GPU"
    if spec.checkpoint is None:
        return None, "no checkpoints: a failure restarts the run from the start"
    steps = checkpoint_every([*(spec.command or []), *(spec.args or [])])
    if isinstance(steps, str):
        return None, steps
    if steps <= 0:
        return None, f"no {CHECKPOINT_EVERY} in its command or args: the interval is not known"
    try:
        pools = candidate_pools(spec, facts)
        # on a file system of provisioned throughput (FSx for Lustre) the checkpoint is written at its share, as the
        # grace period counts it
        spec = resolve_checkpoint_rate(spec, facts)
    except JobSpecError as exc:
        return None, str(exc)
    pool = pools[0]
    family = (pool.instance_type or "").split(".", 1)[0]
    capacity = pool.capacity_type or "ON_DEMAND"
    stated = spec.goodput
    step_s = stated.step_seconds if stated is not None and stated.step_seconds is not None else DEFAULT_STEP_S
    inputs = GoodputInputs(
        nodes=spec.nodes, gpus=spec.nodes * spec.gpus,
        interruptions_per_1000_gpu_days=INTERRUPTIONS_PER_1000_GPU_DAYS.get(
            family, DEFAULT_INTERRUPTIONS_PER_1000_GPU_DAYS),
        spot_reclaims_per_node_month=SPOT_RECLAIMS_PER_NODE_MONTH if capacity == "SPOT" else 0.0,
        checkpoint_s=spec.checkpoint_save_seconds(),
        restart_s=(stated.restart_seconds if stated is not None and stated.restart_seconds is not None
                   else RESTART_S.get(capacity, RESTART_S["ON_DEMAND"])),
        interval_s=steps * step_s, step_s=step_s,
        step_stated=stated is not None and stated.step_seconds is not None,
        mtbf_s=stated.mtbf_hours * 3600 if stated is not None and stated.mtbf_hours is not None else None,
        stall_s=_stall_s(spec))
    return inputs, pool_where(pool)


def _stall_s(spec: TrainingJobSpec) -> float | None:
    """A sharded checkpoint's stall (each rank's share staged into host memory at STAGING_BYTES_PER_S); None
    (the whole save blocks) for a whole-state checkpoint or a Job that waits for the save in flight."""
    assert spec.checkpoint is not None
    words = [*(spec.command or []), *(spec.args or [])]
    waits = any(word == "--checkpoint-if-busy=wait" or (word == "--checkpoint-if-busy" and after == "wait")
                for word, after in zip(words, [*words[1:], ""], strict=True))
    if not spec.checkpoint.sharded or waits:
        return None
    return spec._save_shares().per_rank / STAGING_BYTES_PER_S


def job_goodput_output(specs: Sequence[Any], facts: ClusterFacts) -> dict[str, dict[str, Any]]:
    """The `jobGoodput` output: per stack Job spec, {"where": pool, "inputs": {...}} or {"reason": why not}."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        inputs, where = spec_goodput_inputs(spec, facts)
        out[spec.name] = {"reason": where} if inputs is None else {"where": where, "inputs": inputs_to_dict(inputs)}
    return out




def annotate_prediction(run: dict[str, Any], spec: TrainingJobSpec,
                        facts: ClusterFacts) -> tuple[Prediction | None, str]:
    """Predict the spec's goodput and put it on its run (the controller object: Job, JobSet or TrainJob) as the
    <label prefix>/PREDICTED_ANNOTATION annotation, which `submit status|watch` print beside the measured goodput.
    Stack Jobs (infra/jobs.py) and `submit render|submit` both call it, after the name is hashed: it changes no
    Job name. Returns (the prediction or None, where it runs or why it is not predicted)."""
    inputs, where = spec_goodput_inputs(spec, facts)
    if inputs is None:
        return None, where
    prediction = predict(inputs)
    run["metadata"].setdefault("annotations", {})[f"{facts.label_prefix}/{PREDICTED_ANNOTATION}"] = \
        f"{prediction.goodput:.4f}"
    return prediction, where
