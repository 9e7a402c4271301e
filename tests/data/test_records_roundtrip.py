"""Every field type through the whole data path against moto S3: pack -> upload -> the staging cache (a budget
under half the dataset, so shards are evicted and fetched again) -> PackedData with DataLoader workers and the
decode cache -> exact values, every sample once per epoch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.data.test_records import FIELDS, assert_same, make_records
from workloads.data.api import LoaderSettings, PackedData, Placement
from workloads.data.format.manifest import load_manifest
from workloads.data.moving.cache import ReadPlan, read_plan
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import UploadOptions, upload
from workloads.data.writing.records_pack import RecordPackOptions, pack_records

SAMPLES = 24
RAW_BYTES = 120_000  # each sample's `raw` field: shards of 2 samples, 12 of them, ~2.9 MB against a 1 MiB budget


@pytest.fixture(scope="module")
def records_pack(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    records = make_records(SAMPLES, seed=3)
    rng = np.random.default_rng(4)
    for index, record in enumerate(records):
        record["raw"] = rng.integers(0, 256, RAW_BYTES, dtype=np.uint8).tobytes()
        record["label"] = index  # the sample's identity in a batch
    out = tmp_path_factory.mktemp("records")
    items = ((f"r{index}", record, "") for index, record in enumerate(records))
    pack_records(items, FIELDS, out, RecordPackOptions(shard_bytes=250_000, progress=False))
    return out, records


def test_every_field_type_round_trips_through_the_staging_cache(
        records_pack: tuple[Path, list[dict[str, Any]]], s3_url: str, bucket: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    packed, records = records_pack
    assert len(load_manifest(packed).shards) >= 10
    upload(make_client(s3_url, 4, botocore_attempts=3), packed, S3Uri(bucket, "sets/records"),
           UploadOptions(workers=4, progress=False))
    monkeypatch.setenv("ML_CLUSTER_SHM_BYTES", str(1 << 30))
    dest = tmp_path / "cache"
    data = PackedData.open(dest, batch_size=5, remote=f"s3://{bucket}/sets/records", endpoint_url=s3_url,
                           budget_bytes=1 << 20, placement=Placement(), shuffle_shards=1, image_size=16,
                           decode_cache=tmp_path / "decoded", decode_cache_bytes=1 << 20)
    with data:
        data.loader(LoaderSettings(workers=2, persistent_workers=True))
        for epoch in range(2):
            seen: list[int] = []
            for batch in data.batches(epoch, last_epoch=epoch == 1):
                assert list(batch) == [spec.name for spec in FIELDS]
                assert str(batch["image"].dtype) == "torch.uint8" and batch["emb"].dtype.is_floating_point
                for position, index in enumerate(batch["label"].tolist()):
                    assert_same(FIELDS, records[index], {name: value[position] for name, value in batch.items()},
                                16)
                    seen.append(index)
            assert sorted(seen) == list(range(SAMPLES)), epoch
    assert data.stager_summary is not None and "evicted 0" not in data.stager_summary
    assert read_plan(dest) == ReadPlan(order=[], done=True)
    assert sum(path.stat().st_size for path in dest.glob("shard-*.h5")) <= 1 << 20
    assert list((tmp_path / "decoded").glob("*.rows"))  # the image field was decoded once and kept


@pytest.mark.slow
def test_a_tuple_of_some_fields_from_a_staged_copy(
        records_pack: tuple[Path, list[dict[str, Any]]], s3_url: str, bucket: str, tmp_path: Path) -> None:
    """The whole-copy stager (no budget) and a reader asking for two fields in its own order."""
    packed, records = records_pack
    upload(make_client(s3_url, 4, botocore_attempts=3), packed, S3Uri(bucket, "sets/records"),
           UploadOptions(workers=4, progress=False))
    with PackedData.open(tmp_path / "copy", batch_size=7, remote=f"s3://{bucket}/sets/records",
                         endpoint_url=s3_url, placement=Placement(), fields=["doc", "label"], as_tuple=True) as data:
        data.loader(LoaderSettings(workers=0, transport="pipe"))
        seen = 0
        for doc, label in data.batches(0, last_epoch=True):
            for ids, index in zip(doc, label.tolist(), strict=True):
                np.testing.assert_array_equal(ids, records[index]["doc"])
                seen += 1
    assert seen == SAMPLES
