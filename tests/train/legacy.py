"""An older trainer's whole-state checkpoint (`last.pt` + its sha256 sidecar), written as that trainer wrote it, for
the tests of reading one once (workloads/train/checkpointer.py). The trainer itself no longer writes this format."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import set_state_dict

from workloads.train.checkpoint import CHECKPOINT_NAME, FORMAT_VERSION, sidecar_path
from workloads.train.checkpointer import latest_checkpoint
from workloads.train.models import MODELS


def capture_rng() -> dict[str, Any]:
    kind, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    return {"python": random.getstate(),
            "numpy": {"kind": kind, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                      "position": int(position), "has_gauss": int(has_gauss), "cached": float(cached)},
            "torch": torch.get_rng_state()}


def write_last_pt(directory: Path, state: dict[str, Any], *, sidecar: bool = True) -> Path:
    """torch.save of `state` (with the format version, unless it has one) as DIRECTORY/last.pt, and its sidecar."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / CHECKPOINT_NAME
    tmp = target.with_name(f".{target.name}.tmp")
    torch.save({"format_version": FORMAT_VERSION, **state}, tmp)
    os.replace(tmp, target)
    if sidecar:
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        sidecar_path(target).write_text(f"{digest}  {CHECKPOINT_NAME}\n")
    return target


def legacy_state(sharded_dir: Path) -> dict[str, Any]:
    """The newest sharded checkpoint of a bundled-trainer run as the older trainer held the same run: the model's
    and the optimiser's own state dicts (parameter ids, not names), rank 0's RNG, the run's record."""
    saved = latest_checkpoint(sharded_dir)
    assert saved is not None
    config = saved["config"]
    model = MODELS[config["model"]](len(saved["dataset"]["classes"]), config["width"])
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"],
                                weight_decay=config["weight_decay"])
    set_state_dict(model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"])
    keys = ("epoch", "batch", "step", "config", "world_size", "dataset", "loader", "canonical_nodes")
    return {**{key: saved[key] for key in keys}, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "rng": capture_rng()}
