"""examples/train_lightning.py and examples/train_accelerate.py on CPU against moto S3, through the staging cache.

Both frameworks are pinned in the project's `examples` extra, which `make setup` installs: the tests never skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.data.moving.cache import ReadPlan, read_plan
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import UploadOptions, upload

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"lightning": ROOT / "examples" / "train_lightning.py",
            "accelerate": ROOT / "examples" / "train_accelerate.py"}


@pytest.mark.slow
@pytest.mark.parametrize("framework", sorted(EXAMPLES))
def test_framework_example_trains_through_the_staging_cache_and_resumes(
    framework: str, packed: Path, s3_url: str, bucket: str, tmp_path: Path
) -> None:
    upload(make_client(s3_url, 2, botocore_attempts=3), packed, S3Uri(bucket, "sets/small"),
           UploadOptions(workers=2, progress=False))
    dest, checkpoints = tmp_path / "cache", tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ML_CLUSTER_SHM_BYTES": str(1 << 30)}

    def run(epochs: int) -> list[dict[str, object]]:
        result = subprocess.run(
            [sys.executable, str(EXAMPLES[framework]), "--data", str(dest), "--remote", f"s3://{bucket}/sets/small",
             "--endpoint-url", s3_url, "--budget", "1MiB", "--epochs", str(epochs), "--batch-size", "8",
             "--workers", "0", "--checkpoint-dir", str(checkpoints)],
            capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        print(result.stdout)
        return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]

    lines = run(2)
    samples = json.loads((packed / "manifest.json").read_text())
    total = sum(shard["num_samples"] for shard in samples["shards"])
    assert [(line["epoch"], line["samples"]) for line in lines if "epoch" in line] == [(0, total), (1, total)]
    assert [line for line in lines if "stager" in line], "the example started the stager and reported it"
    assert read_plan(dest) == ReadPlan(order=[], done=True)  # told the stager that reading is done
    assert any(checkpoints.iterdir())
    # A rerun for one epoch more resumes from the checkpoint: only the third epoch is trained.
    assert [line["epoch"] for line in run(3) if "epoch" in line] == [2]
