"""The trainer as the chaos harness runs it: workloads.train unchanged, plus a record of what each rank trained.

Each worker process appends JSON lines to $CHAOS_LOG_DIR/rank<RANK>-<pid>.jsonl: first {"start": step, "time": t,
"world": n} (the step its run resumed from; t is rank 0's clock when the formation loaded its model, the same on
every rank of the formation), then one {"epoch": e, "ids": [...]} per batch its sampler hands out. With
--workers 0 the k-th batch is the one of step start + k; the harness keeps those at or below the step the next run
resumed from (the checkpoint), so a batch handed out but not trained, or trained after the last checkpoint and lost,
is not counted. $CHAOS_STEP_DELAY seconds of sleep per batch make the tiny model's steps last long enough to be
hit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.train import loop
from workloads.train.__main__ import exit_with, main


def _install(log_path: str) -> None:
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the process's life
    iterate = ElasticBatchSampler.__iter__
    prepare = loop._prepare_model

    delay = float(os.environ.get("CHAOS_STEP_DELAY", "0"))

    def logged(self: ElasticBatchSampler) -> Iterator[list[int]]:
        for batch in iterate(self):
            log.write(json.dumps({"epoch": self.epoch, "ids": [int(i) for i in batch]}) + "\n")
            time.sleep(delay)  # a step as long as a real one's, so a kill lands inside the run, not after it
            yield batch

    def prepared(*args: Any, **kwargs: Any) -> Any:
        state = prepare(*args, **kwargs)
        formed = [time.time()]
        if dist.is_initialized():
            dist.broadcast_object_list(formed, src=0)  # one formation time for every rank of the formation
        log.write(json.dumps({"start": state.step, "time": formed[0],
                              "world": dist.get_world_size() if dist.is_initialized() else 1}) + "\n")
        return state

    ElasticBatchSampler.__iter__ = logged  # type: ignore[method-assign]
    loop._prepare_model = prepared


if __name__ == "__main__":
    folder = os.environ["CHAOS_LOG_DIR"]
    _install(os.path.join(folder, f"rank{os.environ.get('RANK', '0')}-{os.getpid()}.jsonl"))
    exit_with(main())
