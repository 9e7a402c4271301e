"""MixedData: a mixture of packed datasets read through the data API, locally and through one shared staging cache."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.data.helpers import write_corpus
from workloads.data.api import LoaderSettings, Placement, open_dataset
from workloads.data.format.records import FieldSpec
from workloads.data.mixed import MixedData, MixtureSource
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import UploadOptions, upload
from workloads.data.reading.dataset import DatasetError
from workloads.data.writing.pack import PackOptions, pack
from workloads.data.writing.records_pack import RecordPackOptions, pack_records
from workloads.data.writing.tokens import pack_tokens

SHARD_BYTES = 60_000  # about 19 decoded 32px samples per shard


def _pack(tmp: Path, name: str, per_class: int, seed: int, size: int = 32, shard_bytes: int = SHARD_BYTES) -> Path:
    source, out = tmp / f"{name}-src", tmp / name
    write_corpus(source, per_class=per_class, seed=seed)
    pack(source, out, PackOptions(layout="decoded", image_size=size, shard_bytes=shard_bytes, workers=1,
                                  progress=False))
    return out


@pytest.fixture(scope="module")
def two_packs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("mix")
    return _pack(tmp, "web", 40, 1), _pack(tmp, "code", 15, 2)


def _epoch(data: MixedData, epoch: int) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    images, labels, sources = [], [], []
    for batch_images, batch_labels, batch_sources in data.batches(epoch):
        images.append(batch_images.numpy())
        labels.append(batch_labels.numpy())
        sources.append(batch_sources.numpy())
    return images, labels, sources


def test_batches_say_the_source_and_read_its_samples(two_packs: tuple[Path, Path]) -> None:
    web, code = two_packs
    sources = [MixtureSource(str(web), weight=0.7), MixtureSource(str(code), weight=0.3)]
    direct = [open_dataset(web), open_dataset(code)]
    with MixedData.open(sources, batch_size=10, placement=Placement(), shuffle_shards=2) as data:
        data.loader(LoaderSettings(workers=2, transport="pipe"))
        assert data.epoch_samples == [77, 33]  # 0.7 / 0.3 of the 110 samples the two hold
        images, labels, batch_sources = _epoch(data, 0)
        order = data.sampler.epoch_order()
    assert Counter(np.concatenate(batch_sources).tolist()) == {0: 77, 1: 33}
    for batch in batch_sources[:-1]:
        assert sorted(Counter(batch.tolist()).values()) in ([3, 7], [4, 6])  # 7 or 8 of 10, and 3 or 2... within one
    flat = np.concatenate(images)
    for position in (0, 5, 50, 109):
        global_index = int(order[position])
        source = int(np.searchsorted(data.dataset.starts, global_index, side="right") - 1)
        expected, label = direct[source].__getitems__([global_index - int(data.dataset.starts[source])])
        assert np.array_equal(flat[position], np.asarray(expected)[0])
        assert np.concatenate(labels)[position] == int(np.asarray(label)[0])
        assert np.concatenate(batch_sources)[position] == source


def test_resumes_on_another_world_size_where_it_stopped(two_packs: tuple[Path, Path]) -> None:
    web, code = two_packs
    sources = [MixtureSource(str(web), weight=0.7), MixtureSource(str(code), repeat=2)]
    with MixedData.open(sources, batch_size=12, placement=Placement(), shuffle_shards=2) as data:
        data.loader(LoaderSettings(workers=0))
        whole = np.concatenate(_epoch(data, 1)[2])
        order = data.sampler.epoch_order()
    with MixedData.open(sources, batch_size=12, placement=Placement(), shuffle_shards=2) as data:
        data.loader(LoaderSettings(workers=0))
        for number, _ in enumerate(data.batches(1)):
            if number == 3:
                state = data.state_dict()
                break
    ranks = []
    for rank in range(2):
        with MixedData.open(sources, batch_size=6, placement=Placement(rank=rank, world_size=2),
                            shuffle_shards=2) as data:
            data.loader(LoaderSettings(workers=0))
            data.load_state_dict(state)
            assert data.start_epoch == 1
            ranks.append([list(batch) for batch in data.sampler])
    rest = [i for step in zip(*ranks, strict=True) for piece in step for i in piece]
    assert rest == order[4 * 12 :].tolist()
    assert len(whole) == len(order)


def _records(tmp: Path, name: str, fields: list[FieldSpec], rows: list[dict]) -> Path:
    out = tmp / name
    pack_records(((f"{name}-{i:04d}", row, "") for i, row in enumerate(rows)), fields, out,
                 RecordPackOptions(shard_bytes=2_000, workers=1, progress=False))
    return out


def test_records_mixture_carries_the_source_field_and_refuses_fields_that_differ(tmp_path: Path) -> None:
    fields = [FieldSpec(name="text", type="text"), FieldSpec(name="n", type="int")]
    one = _records(tmp_path, "one", fields, [{"text": f"a{i}", "n": i} for i in range(30)])
    two = _records(tmp_path, "two", fields, [{"text": f"b{i}", "n": 1000 + i} for i in range(20)])
    with MixedData.open([MixtureSource(str(one), samples=10), MixtureSource(str(two), samples=5)], batch_size=3,
                        placement=Placement()) as data:
        data.loader(LoaderSettings(workers=0))
        batches = list(data.batches(0))
    assert all(set(batch) == {"text", "n", "source"} for batch in batches)
    for batch in batches:
        for text, n, source in zip(batch["text"], batch["n"].tolist(), batch["source"].tolist(), strict=True):
            assert text[0] == "ab"[source] and (n >= 1000) == (source == 1)
    assert Counter(s for batch in batches for s in batch["source"].tolist()) == {0: 10, 1: 5}
    (tmp_path / "docs").mkdir()
    np.save(tmp_path / "docs" / "a.npy", np.arange(400, dtype=np.uint16))
    pack_tokens(tmp_path / "docs", tmp_path / "tokens", RecordPackOptions(shard_bytes=1 << 20, progress=False),
                seq_len=16)
    with pytest.raises(DatasetError, match=r"^sources\[1\]: .*tokens: its fields differ from sources\[0\]'s"):
        MixedData.open([MixtureSource(str(one)), MixtureSource(str(tmp_path / "tokens"))], batch_size=2,
                       placement=Placement())


def test_image_packs_and_records_do_not_mix(two_packs: tuple[Path, Path], tmp_path: Path) -> None:
    one = _records(tmp_path, "one", [FieldSpec(name="n", type="int")], [{"n": i} for i in range(5)])
    with pytest.raises(DatasetError, match=r"^sources\[1\]: .* is a records dataset, sources\[0\] a images"):
        MixedData.open([MixtureSource(str(two_packs[0])), MixtureSource(str(one))], batch_size=2,
                       placement=Placement())
    with pytest.raises(ValueError, match=r"^sources\[0\]: give path .* or remote"):
        MixedData.open([MixtureSource()], batch_size=2, placement=Placement())
    with pytest.raises(ValueError, match="^sources: every source has a remote"):
        MixedData.open([MixtureSource(str(two_packs[0])), MixtureSource(remote="s3://b/x")], batch_size=2,
                       placement=Placement(), staging_dir=tmp_path / "s")


def _size_if_there(path: Path) -> int:
    """A shard's size, 0 when the stager evicted it between the listing and the stat (it runs beside the reader)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def test_two_sources_train_through_one_staging_cache_on_a_shared_budget(
        s3_url: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_url)
    # 64 px decoded samples (12 KiB) in shards of 16: 2.5 MB in all, the budget 1 MiB (the stager's floor).
    two_packs = (_pack(tmp_path, "web", 75, 3, 64, 200_000), _pack(tmp_path, "code", 30, 4, 64, 200_000))
    client = make_client(s3_url, 4, botocore_attempts=3)
    remotes = []
    for path in two_packs:
        upload(client, path, S3Uri(bucket, f"sets/{path.name}"), UploadOptions(workers=4, progress=False))
        remotes.append(f"s3://{bucket}/sets/{path.name}")
    shard_bytes = [[s.stat().st_size for s in sorted(path.glob("shard-*.h5"))] for path in two_packs]
    total = sum(map(sum, shard_bytes))
    budget = 1 << 20  # the stager's floor; the shards of both sources are several times that
    assert total > 2 * budget, total
    staging = tmp_path / "mix"
    sources = [MixtureSource(remote=remotes[0], weight=0.7), MixtureSource(remote=remotes[1], weight=0.3)]
    counts: Counter[int] = Counter()
    with MixedData.open(sources, batch_size=10, placement=Placement(), staging_dir=staging, budget_bytes=budget,
                        endpoint_url=s3_url, shuffle_shards=1, stager_workers=4) as data:
        data.loader(LoaderSettings(workers=2, transport="pipe"))
        for epoch in range(2):
            for _, _, batch_sources in data.batches(epoch, last_epoch=epoch == 1):
                counts.update(batch_sources.tolist())
                held = sum(_size_if_there(p) for k in (0, 1) for p in (staging / str(k)).glob("shard-*.h5"))
                assert held <= budget
        expected = data.epoch_samples
    assert counts == {0: 2 * expected[0], 1: 2 * expected[1]}
    assert data.stager_summary is not None and "evicted 0" not in data.stager_summary, data.stager_summary
    assert {p.parent.name for p in staging.glob("*/manifest.json")} == {"0", "1"}


def test_from_env_reads_what_the_pods_staging_sidecar_stages(
        two_packs: tuple[Path, Path], s3_url: str, bucket: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a Job with dataset.mixture: the sidecar (`stage URI0 URI1 DATA_DIR --budget --linger`) runs beside the
    reader, which MixedData.from_env opens from DATA_DIR and DATA_MIXTURE without starting a stager of its own."""
    import json
    import subprocess
    import sys

    client = make_client(s3_url, 4, botocore_attempts=3)
    uris = []
    for path in two_packs:
        upload(client, path, S3Uri(bucket, f"env/{path.name}"), UploadOptions(workers=4, progress=False))
        uris.append(f"s3://{bucket}/env/{path.name}")
    dest = tmp_path / "data"
    sidecar = subprocess.Popen([sys.executable, "-m", "workloads.data", "stage", *uris, str(dest), "--budget", "1",
                                "--linger", "--endpoint-url", s3_url, "--no-progress"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        monkeypatch.setenv("DATA_DIR", str(dest))
        monkeypatch.setenv("DATA_MIXTURE", json.dumps([{"uri": uris[0], "weight": 0.7},
                                                       {"uri": uris[1], "samples": 20}]))
        counts: Counter[int] = Counter()
        with MixedData.from_env(batch_size=8, placement=Placement(), wait_for_data_s=120) as data:
            assert data._stager is None and data.feeder is not None
            data.loader(LoaderSettings(workers=0))
            for _, _, sources in data.batches(0, last_epoch=True):
                counts.update(sources.tolist())
        assert counts == {0: 80, 1: 20}  # the weighted source its own 80 samples (the default epoch), the fixed one 20
    finally:
        sidecar.terminate()
        sidecar.wait(timeout=60)
