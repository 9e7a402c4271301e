"""The public data API (workloads.data.api) and the example training script that uses it, against moto S3."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.helpers import write_corpus
from workloads.data.api import LoaderSettings, PackedData, Placement
from workloads.data.moving.cache import ReadPlan, read_plan
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import UploadOptions, upload
from workloads.data.writing.pack import PackOptions, pack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_plain.py"
SHARD_BYTES = 400_000  # about 130 decoded 32px samples: 8 shards, so a 1 MiB budget holds under half of them


@pytest.fixture(scope="module")
def larger_pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("corpus")
    write_corpus(source, per_class=500)
    out = tmp_path_factory.mktemp("packed")
    pack(source, out, PackOptions(layout="decoded", image_size=32, shard_bytes=SHARD_BYTES, workers=1,
                                  progress=False))
    return out


def _upload(packed: Path, s3_url: str, bucket: str) -> str:
    upload(make_client(s3_url, 4, botocore_attempts=3), packed, S3Uri(bucket, "sets/larger"),
           UploadOptions(workers=4, progress=False))
    return f"s3://{bucket}/sets/larger"


def test_reads_a_local_pack_and_resumes_from_its_state(larger_pack: Path) -> None:
    data = PackedData.open(larger_pack, batch_size=50, placement=Placement(), shuffle_shards=2)
    with data:
        data.loader(LoaderSettings(workers=0))
        first = [labels.tolist() for _, labels in data.batches(0)]
        assert sum(len(labels) for labels in first) == len(data) == 1000
        images, _ = next(iter(data.batches(1)))
        assert str(images.dtype) == "torch.uint8" and tuple(images.shape) == (50, 32, 32, 3)
    # Stop after 3 batches of epoch 1, resume in a new object with another batch size: the rest, exactly.
    seen: list[int] = []
    with PackedData.open(larger_pack, batch_size=50, placement=Placement(), shuffle_shards=2) as data:
        data.loader(LoaderSettings(workers=0))
        for count, (_, labels) in enumerate(data.batches(1), start=1):
            seen += labels.tolist()
            if count == 3:
                state = data.state_dict()
                break
    with PackedData.open(larger_pack, batch_size=70, placement=Placement(), shuffle_shards=2) as data:
        data.loader(LoaderSettings(workers=0))
        data.load_state_dict(state)
        assert data.start_epoch == 1
        rest = [label for _, labels in data.batches(1) for label in labels.tolist()]
    assert len(seen) + len(rest) == 1000


def test_options_are_checked_by_name(larger_pack: Path) -> None:
    with pytest.raises(ValueError, match="budget_bytes: needs remote"):
        PackedData.open(larger_pack, batch_size=8, budget_bytes=1 << 30)
    with pytest.raises(ValueError, match="batch_size: must be a positive integer"):
        PackedData.open(larger_pack, batch_size=0, placement=Placement())
    with pytest.raises(ValueError, match="workers: must be an integer >= 0"):
        LoaderSettings(workers=-1)


@pytest.mark.slow  # two epochs of the example behind a stager; test_cache/test_mixed keep the stager in make test
def test_example_script_trains_through_the_staging_cache(
    larger_pack: Path, s3_url: str, bucket: str, tmp_path: Path
) -> None:
    """examples/train_plain.py on CPU: the API starts a stager with a budget under half the dataset, the script's
    two epochs read every sample each, and the stager is told when reading is done."""
    remote = _upload(larger_pack, s3_url, bucket)
    dest = tmp_path / "cache"
    budget = 1 << 20
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ML_CLUSTER_SHM_BYTES": str(1 << 30)}

    def run(workers: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(EXAMPLE), "--data", str(dest), "--remote", remote, "--endpoint-url", s3_url,
             "--budget", "1MiB", "--shuffle-shards", "1", "--epochs", "2", "--batch-size", "50", "--workers",
             str(workers), "--checkpoint-dir", str(tmp_path / "ckpt")],
            capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    result = run(workers=2)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    print("\n".join(result.stdout.splitlines()))
    epochs = [line for line in lines if "epoch" in line and "event" not in line]  # not the step events
    assert [(line["epoch"], line["samples"]) for line in epochs] == [(0, 1000), (1, 1000)]
    (stager,) = [line["stager"] for line in lines if "stager" in line]
    assert "evicted" in stager and "evicted 0" not in stager  # the budget really was smaller than the dataset
    assert read_plan(dest) == ReadPlan(order=[], done=True)
    assert sum(path.stat().st_size for path in dest.glob("shard-*.h5")) <= budget
    assert (tmp_path / "ckpt" / "checkpoint.pt").is_file()
    # Run again: the checkpoint says both epochs are done; nothing is trained again.
    again = run(workers=0)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not [line for line in again.stdout.splitlines() if '"epoch"' in line]
