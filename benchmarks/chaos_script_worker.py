"""Your own training script as the chaos harness runs it: `python -m benchmarks.chaos_script_worker SCRIPT [ARGS]`.

The script runs unchanged (runpy, as `__main__`); this only watches the data API it reads through (the
ElasticBatchSampler of workloads/data/reading/sampler.py, under PackedData) and reports what the harness needs, which
the bundled trainer reports itself:

- to $CHAOS_LOG_DIR/rank<RANK>-<pid>.jsonl: first {"start": P, "time": t, "world": n} (P: the data position the run
  resumed from, in samples since the start of epoch 0; t: rank 0's clock when the formation first read, the same
  on every rank), then one {"epoch": e, "ids": [...], "pos": P} per batch handed out (P: the position after it);
- on stdout (rank 0), JSON events: "config" (world_size), "resumed" (step), "model_loading" (a new formation),
  and "batch" (step) once the step of a batch is done (the script asks for the next one, or the epoch ends). A
  script that reports its steps itself (workloads.data.api.StepReport, as the examples do) prints the "batch"
  events instead, with their data and compute times (what measured goodput needs); this only puts its own step
  numbering into them and prints none of its own.

Steps are counted in global batches of $CHAOS_STEP_SAMPLES samples (the uninterrupted run's), from the position,
so they mean the same at any world size. $CHAOS_STEP_DELAY seconds of sleep per batch make the steps long enough
to be hit. The harness reads batches with --workers 0, so the sampler runs in the script's own process.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.train.steps import StepReport


def _install(log_path: str) -> None:
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    iterate = ElasticBatchSampler.__iter__
    delay = float(os.environ.get("CHAOS_STEP_DELAY", "0"))
    step_samples = int(os.environ["CHAOS_STEP_SAMPLES"])
    rank = int(os.environ.get("RANK", "0"))
    formed = [False]
    reported = [False]  # the script reports its steps itself (StepReport)
    last = [0]  # the position after the last batch handed out

    def emit(event: str, **fields: Any) -> None:
        if rank == 0:
            print(json.dumps({"event": event, **fields}), flush=True)

    def position(sampler: ElasticBatchSampler, offsets: Any) -> int:
        return int(sampler.epoch * sampler.num_samples + sum(offsets))

    def first_read(sampler: ElasticBatchSampler) -> None:
        formed[0] = True
        when, world = [time.time()], 1
        if dist.is_available() and dist.is_initialized():
            dist.broadcast_object_list(when, src=0)  # one formation time for every rank of the formation
            world = dist.get_world_size()
        start = position(sampler, sampler.start if sampler.start is not None else [0])
        log.write(json.dumps({"start": start, "time": when[0], "world": world}) + "\n")
        emit("config", world_size=world)
        emit("resumed", step=start // step_samples)
        emit("model_loading")

    def logged(self: ElasticBatchSampler) -> Iterator[list[int]]:
        if not formed[0]:
            first_read(self)
        steps = self._steps()
        done: int | None = None
        for number, batch in enumerate(iterate(self)):
            if done is not None and not reported[0]:
                emit("batch", step=done // step_samples)  # asked for the next batch: the last one's step is done
            done = last[0] = position(self, steps[number].offsets)
            log.write(json.dumps({"epoch": self.epoch, "ids": [int(i) for i in batch], "pos": done}) + "\n")
            time.sleep(delay)
            yield batch
        if done is not None and not reported[0]:
            emit("batch", step=done // step_samples)

    report_step = StepReport.step

    def step_reported(self: StepReport, step: int, **fields: Any) -> None:
        reported[0] = True
        report_step(self, last[0] // step_samples, **fields)  # the harness's steps: global batches of the first run

    ElasticBatchSampler.__iter__ = logged  # type: ignore[method-assign]
    StepReport.step = step_reported  # type: ignore[method-assign]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m benchmarks.chaos_script_worker SCRIPT [ARGS]")
    folder = os.environ["CHAOS_LOG_DIR"]
    _install(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.jsonl"))
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
