from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from tests.train.conftest import IMAGE_SIZE
from workloads.data.format.jpeg import decode_file
from workloads.data.reading.dataset import (
    DatasetError,
    HDF5Dataset,
    JpegFolderDataset,
    contiguous_runs,
    make_loader,
    to_tensors,
)
from workloads.data.reading.sampler import ElasticBatchSampler


def _epoch(dataset, workers: int, context: str | None = None, transport: str = "shm") -> tuple[np.ndarray, np.ndarray]:
    sampler = ElasticBatchSampler([len(dataset)], 8, block_size=4, seed=3)
    loader = make_loader(dataset, sampler, workers=workers, multiprocessing_context=context, transport=transport)
    images, labels = zip(*(to_tensors(batch) for batch in loader), strict=True)
    order = sampler.epoch_order()
    return torch.cat(images).numpy(), torch.cat(labels).numpy(), order


def test_decoded_samples_are_the_stored_pixels(tiny_data: dict[str, Path]) -> None:
    dataset = HDF5Dataset(tiny_data["decoded"])
    images, labels = dataset.__getitems__([40, 41, 3, 15, 16, 17, 18])  # crosses the shard boundary at 17
    with (
        h5py.File(tiny_data["decoded"] / "shard-00000.h5") as first,
        h5py.File(tiny_data["decoded"] / "shard-00001.h5") as second,
    ):
        stored = np.concatenate([first["images"][:], second["images"][:]])
        stored_labels = np.concatenate([first["labels"][:], second["labels"][:]])
    expected = [40, 41, 3, 15, 16, 17, 18]
    assert images.dtype == torch.uint8 and tuple(images.shape) == (7, IMAGE_SIZE, IMAGE_SIZE, 3)
    assert np.array_equal(images.numpy(), stored[expected])
    assert np.array_equal(labels.numpy(), stored_labels[expected])


def test_encoded_samples_decode_like_the_source_files(tiny_data: dict[str, Path]) -> None:
    dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE)
    folder = JpegFolderDataset(tiny_data["folder"], image_size=IMAGE_SIZE, draft=True)
    indices = [0, 1, 2, 30, 16, 17]
    images, labels = dataset.__getitems__(indices)
    for row, index in enumerate(indices):
        path, label = folder.samples[index]
        assert np.array_equal(images[row].numpy(), decode_file(path, IMAGE_SIZE, draft=True))
        assert labels[row] == label


@pytest.mark.parametrize("layout", ["decoded", "encoded"])
def test_each_contiguous_run_is_one_read(
    tiny_data: dict[str, Path], monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    reads: list[int] = []
    original = os.preadv

    def counting(fd: int, buffers: list, offset: int) -> int:
        reads.append(offset)
        return original(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", counting)
    dataset = HDF5Dataset(tiny_data[layout], image_size=IMAGE_SIZE)
    batch = [4, 5, 6, 7, 30, 31, 32, 10]
    dataset.__getitems__(batch)
    assert len(reads) == 3
    assert contiguous_runs(batch) == [(0, 4, 4), (4, 30, 3), (7, 10, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["decoded", "encoded"])
def test_batches_identical_across_workers_and_start_methods(tiny_data: dict[str, Path], layout: str) -> None:
    dataset = HDF5Dataset(tiny_data[layout], image_size=IMAGE_SIZE)
    dataset.__getitems__([0, 20])  # the main process now holds open handles that fork will copy
    reference = _epoch(dataset, workers=0)
    for context in ("fork", "spawn", "forkserver"):
        images, labels, _ = _epoch(dataset, workers=2, context=context)
        assert np.array_equal(images, reference[0]), context
        assert np.array_equal(labels, reference[1]), context
    pipe_images, pipe_labels, _ = _epoch(dataset, workers=2, context="fork", transport="pipe")
    assert np.array_equal(pipe_images, reference[0]) and np.array_equal(pipe_labels, reference[1])


def test_folder_baseline_matches_encoded_shards_with_the_same_decode(tiny_data: dict[str, Path]) -> None:
    folder = JpegFolderDataset(tiny_data["folder"], image_size=IMAGE_SIZE, draft=True)
    encoded = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, draft=True)
    folder_epoch = _epoch(folder, workers=2, context="fork")
    encoded_epoch = _epoch(encoded, workers=0)
    assert np.array_equal(folder_epoch[0], encoded_epoch[0])
    assert np.array_equal(folder_epoch[1], encoded_epoch[1])


def test_shm_transport_shares_and_pipe_transport_does_not(tiny_data: dict[str, Path]) -> None:
    dataset = HDF5Dataset(tiny_data["decoded"])
    sampler = ElasticBatchSampler([len(dataset)], 8)
    shm_batch = next(iter(make_loader(dataset, sampler, workers=1, multiprocessing_context="fork")))
    assert isinstance(shm_batch[0], torch.Tensor) and shm_batch[0].is_shared()
    pipe_batch = next(iter(make_loader(dataset, sampler, workers=1, multiprocessing_context="fork", transport="pipe")))
    assert isinstance(pipe_batch[0], np.ndarray)
    assert np.array_equal(pipe_batch[0], shm_batch[0].numpy())


def test_close_releases_handles_and_reads_reopen(tiny_data: dict[str, Path]) -> None:
    dataset = HDF5Dataset(tiny_data["decoded"])
    before, _ = dataset.__getitems__([1, 2, 20])
    dataset.close()
    after, _ = dataset.__getitems__([1, 2, 20])
    assert torch.equal(before, after)
    dataset.close()


def test_shard_that_disagrees_with_the_manifest_is_named(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_data["decoded"], broken)
    with h5py.File(broken / "shard-00001.h5", "r+") as handle:
        del handle["labels"]
        handle["labels"] = np.zeros(3, dtype=np.int64)
    dataset = HDF5Dataset(broken)
    dataset.__getitems__([0, 1])  # the first shard is fine
    with pytest.raises(DatasetError, match="shard-00001.h5: 3 labels, the manifest says 25 samples"):
        dataset.__getitems__([20])


def test_missing_manifest_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="manifest.json: no manifest"):
        HDF5Dataset(tmp_path)


def test_broken_manifest_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(DatasetError, match="manifest.json: invalid manifest"):
        HDF5Dataset(tmp_path)


def test_decoded_layout_refuses_a_different_size(tiny_data: dict[str, Path]) -> None:
    with pytest.raises(DatasetError, match="32px"):
        HDF5Dataset(tiny_data["decoded"], image_size=64)


@pytest.mark.parametrize("layout", ["decoded", "encoded"])
def test_reads_what_the_real_packer_writes(tiny_data: dict[str, Path], tmp_path: Path, layout: str) -> None:
    """Contract check against workloads.data.writing.pack (the fixtures above use a minimal writer of their own)."""
    from workloads.data.writing.pack import PackOptions, pack

    out = tmp_path / layout
    options = PackOptions(layout=layout, image_size=IMAGE_SIZE, shard_bytes=20_000, workers=1, progress=False,
                          shuffle_seed=None)
    pack(tiny_data["folder"], out, options)
    dataset = HDF5Dataset(out, image_size=IMAGE_SIZE)
    folder = JpegFolderDataset(tiny_data["folder"], image_size=IMAGE_SIZE, draft=True)
    assert len(dataset.manifest.shards) > 1 and len(dataset) == len(folder)
    images, labels = dataset.__getitems__(list(range(len(dataset))))
    assert labels.tolist() == [label for _, label in folder.samples]
    if layout == "encoded":  # original bytes: decoding them must give exactly what decoding the file gives
        for index in (0, 17, len(folder) - 1):
            assert np.array_equal(images[index].numpy(), decode_file(folder.samples[index][0], IMAGE_SIZE))


@pytest.mark.parametrize("layout", ["decoded", "encoded"])
def test_the_records_reader_reads_an_image_folder_pack_as_image_and_label(tiny_data: dict[str, Path],
                                                                          layout: str) -> None:
    """One reader: a format-version-1 pack read by RecordsDataset through the column adapter gives the fields
    records.image_folder_fields names, with HDF5Dataset's values (a run across the shard boundary included)."""
    from workloads.data.reading.records_dataset import RecordsDataset

    indices = [0, 1, 15, 16, 17, 18, 41, 3]
    images, labels = HDF5Dataset(tiny_data[layout], image_size=IMAGE_SIZE).__getitems__(indices)
    records = RecordsDataset(tiny_data[layout], image_size=IMAGE_SIZE)
    assert records.field_names == ["image", "label"] and records.reads_records
    batch = records.__getitems__(indices)
    assert torch.equal(batch["image"], images) and torch.equal(batch["label"], labels)
    assert batch["label"].tolist() == [0, 0, 1, 1, 1, 1, 2, 0]


def test_a_chunked_image_folder_shard_still_reads(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    """A version-1 shard another writer stored chunked and compressed is read through h5py, not at a byte offset."""
    chunked = tmp_path / "chunked"
    shutil.copytree(tiny_data["decoded"], chunked)
    path = chunked / "shard-00000.h5"
    with h5py.File(path, "r+") as handle:
        pixels = handle["images"][:]
        del handle["images"]
        handle.create_dataset("images", data=pixels, chunks=(4, IMAGE_SIZE, IMAGE_SIZE, 3), compression="gzip")
    manifest = json.loads((chunked / "manifest.json").read_text())
    manifest["shards"][0]["bytes"] = path.stat().st_size  # the reader checks counts and shapes, not the sha256
    (chunked / "manifest.json").write_text(json.dumps(manifest))
    expected, _ = HDF5Dataset(tiny_data["decoded"]).__getitems__([2, 3, 4, 16, 17])
    got, _ = HDF5Dataset(chunked).__getitems__([2, 3, 4, 16, 17])
    assert torch.equal(got, expected)
