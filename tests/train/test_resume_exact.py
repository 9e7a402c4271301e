"""Sample-exact resume: a loader killed with SIGKILL mid-epoch continues, on another world size, with exactly the
samples it had not yet seen (identified by their pixels, not by the indices the sampler claims)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads.data.reading.dataset import HDF5Dataset, make_loader, to_tensors
from workloads.data.reading.sampler import ElasticBatchSampler

REPO = Path(__file__).resolve().parents[2]

# Two ranks stepping together in one process, DataLoader workers included; after every step the position and the
# samples seen so far are saved together atomically, as a checkpoint would hold them.
CHILD = """
import hashlib, json, os, sys, time
from workloads.data.reading.dataset import HDF5Dataset, make_loader, to_tensors
from workloads.data.reading.sampler import ElasticBatchSampler
data, state_path = sys.argv[1], sys.argv[2]
dataset = HDF5Dataset(data)
samplers = [ElasticBatchSampler(dataset.shard_sizes, 3, seed=21, shuffle_shards=1, canonical_nodes=2, rank=r,
                                world_size=2, local_world_size=1) for r in range(2)]
for sampler in samplers:
    sampler.set_epoch(4)
loaders = [iter(make_loader(dataset, s, workers=2, multiprocessing_context="fork")) for s in samplers]
seen = []
for step, batches in enumerate(zip(*loaders), start=1):
    for batch in batches:
        images, _ = to_tensors(batch)
        seen += [hashlib.sha256(image.numpy().tobytes()).hexdigest() for image in images]
    payload = json.dumps({"loader": samplers[0].state_dict(step), "seen": seen})
    with open(state_path + ".tmp", "w") as handle:
        handle.write(payload)
    os.replace(state_path + ".tmp", state_path)
    time.sleep(0.05)
"""


def _hashes(dataset: HDF5Dataset, sampler: ElasticBatchSampler) -> list[list[str]]:
    return [[hashlib.sha256(image.numpy().tobytes()).hexdigest() for image in to_tensors(batch)[0]]
            for batch in make_loader(dataset, sampler, workers=0)]


@pytest.mark.parametrize("world", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_killed_mid_epoch_the_rest_is_exactly_what_was_not_seen(
    tiny_data: dict[str, Path], tmp_path: Path, world: int
) -> None:
    data = tiny_data["decoded"]
    state_path = tmp_path / "state.json"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(data), str(state_path)], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.poll() is None:
            if state_path.exists() and len(json.loads(state_path.read_text())["seen"]) >= 12:
                break
            time.sleep(0.01)
        assert child.poll() is None, "the loader finished before it could be killed"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    saved = json.loads(state_path.read_text())
    seen = saved["seen"]
    assert 12 <= len(seen) < 42

    dataset = HDF5Dataset(data)
    resumed = [ElasticBatchSampler(dataset.shard_sizes, 2, seed=21, shuffle_shards=1, canonical_nodes=2, rank=r,
                                   world_size=world, local_world_size=1) for r in range(world)]
    for sampler in resumed:
        sampler.load_state_dict(saved["loader"])
    rest = [digest for sampler in resumed for batch in _hashes(dataset, sampler) for digest in batch]
    everything = [digest for batch in _hashes(dataset, ElasticBatchSampler([42], 42, shuffle=False))
                  for digest in batch]
    assert len(set(everything)) == 42  # every sample is identifiable by its pixels
    assert sorted(seen + rest) == sorted(everything)  # nothing repeated, nothing skipped
