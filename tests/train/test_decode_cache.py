"""The decode cache: later epochs read back exactly what the first decoded, every worker process shares it, and a
killed writer, a full file system, a budget and stale files are all handled without a wrong pixel."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.train.conftest import IMAGE_SIZE
from workloads.data.reading import records_dataset as reader_module  # where the one reader decodes
from workloads.data.reading.dataset import DatasetError, HDF5Dataset, make_loader, to_tensors
from workloads.data.reading.decode_cache import CHECKSUMS, KEPT, SUFFIX, DecodeCache, DecodeKey, bytes_needed
from workloads.data.reading.sampler import ElasticBatchSampler

ROW = IMAGE_SIZE * IMAGE_SIZE * 3


def _epoch(dataset: HDF5Dataset, workers: int, epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    sampler = ElasticBatchSampler(dataset.shard_sizes, 8, seed=3)
    sampler.set_epoch(epoch)
    loader = make_loader(dataset, sampler, workers=workers, multiprocessing_context="fork" if workers else None)
    images, labels = zip(*(to_tensors(batch) for batch in loader), strict=True)
    order = np.asarray(sampler.epoch_order())
    inverse = np.argsort(order)  # back to sample order, so epochs of different orders compare
    return torch.cat(images).numpy()[inverse], torch.cat(labels).numpy()[inverse]


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = reader_module.decode_into

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(reader_module, "decode_into", counting)
    return calls


def test_later_epochs_read_back_exactly_what_the_first_decoded(tiny_data: dict[str, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    reference = _epoch(HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE), workers=0)
    calls = _count_decodes(monkeypatch)
    cached = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "rows",
                         decode_cache_bytes=1 << 30)
    first = _epoch(cached, workers=0, epoch=0)
    assert len(calls) == len(cached)
    second = _epoch(cached, workers=0, epoch=1)  # another order: every sample comes from the cache
    assert len(calls) == len(cached)
    for epoch in (first, second):
        assert np.array_equal(epoch[0], reference[0]) and np.array_equal(epoch[1], reference[1])
    assert len(list((tmp_path / "rows").glob(f"*{SUFFIX}"))) == len(cached.shard_sizes)


def test_worker_processes_share_the_cache(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    reference = _epoch(HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE), workers=0)
    cached = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "rows",
                         decode_cache_bytes=1 << 30)
    first = _epoch(cached, workers=2, epoch=0)
    # A fresh dataset object (a new rank, or a restarted process) finds every row the workers kept.
    again = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "rows",
                        decode_cache_bytes=1 << 30)
    again.__getitems__([0])  # opens this process's descriptors
    assert all(rows is not None for rows in again._rows.values())
    kept = [again._shard_rows(index) for index in range(len(again.shard_sizes))]
    flags = [int.from_bytes(os.pread(rows.fd, 8, rows._entry_offset(k))[4:], "little") == KEPT
             for rows in kept if rows is not None for k in range(rows.num_samples)]
    assert flags == [True] * len(again)
    second = _epoch(again, workers=2, epoch=1)
    for epoch in (first, second):
        assert np.array_equal(epoch[0], reference[0]) and np.array_equal(epoch[1], reference[1])


def test_a_writer_killed_mid_row_leaves_the_sample_to_decode_again(tiny_data: dict[str, Path],
                                                                   tmp_path: Path) -> None:
    reference = _epoch(HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE), workers=0)
    cache_dir = tmp_path / "rows"
    dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=cache_dir,
                          decode_cache_bytes=1 << 30)
    pid = os.fork()
    if pid == 0:  # the child writes half of sample 3's row, then dies without a word
        try:
            rows = dataset._shard_rows(0)
            assert rows is not None
            os.pwrite(rows.fd, b"\xff" * (ROW // 2), rows._row_offset(3))
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    images, labels = _epoch(dataset, workers=0)
    assert np.array_equal(images, reference[0]) and np.array_equal(labels, reference[1])


def test_a_full_file_system_stops_writes_not_reads(tiny_data: dict[str, Path], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    reference = _epoch(HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE), workers=0)
    dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "rows",
                          decode_cache_bytes=1 << 30)
    dataset.__getitems__(list(range(5)))  # five rows kept before the disk fills
    original = os.pwrite

    def full(fd: int, data, offset: int) -> int:  # noqa: ANN001
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    images, labels = _epoch(dataset, workers=0)
    assert np.array_equal(images, reference[0]) and np.array_equal(labels, reference[1])
    assert dataset.decoded is not None and not dataset.decoded.writable
    monkeypatch.setattr(os, "pwrite", original)
    rows = dataset._shard_rows(0)
    assert rows is not None
    kept = [int.from_bytes(os.pread(rows.fd, 8, rows._entry_offset(k))[4:], "little") == KEPT for k in range(6)]
    assert kept == [True] * 5 + [False]


def test_the_budget_bounds_the_files_first_come_first_served(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    small, large = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE).shard_sizes
    budget = DecodeCache(tmp_path, 1, DecodeKey(IMAGE_SIZE, True, "pil")).file_bytes(small)  # the first shard's only
    dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "rows",
                          decode_cache_bytes=budget)
    _epoch(dataset, workers=0)
    files = list((tmp_path / "rows").glob(f"*{SUFFIX}"))
    assert len(files) == 1 and sum(f.stat().st_size for f in files) <= budget
    assert files[0].name.startswith(dataset.manifest.shards[0].sha256)


def test_bytes_needed_is_the_budget_that_keeps_every_shard(tiny_data: dict[str, Path], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget bytes_needed names holds every shard's file (header and table included); one byte less leaves a
    shard without one, decoded every epoch."""
    sizes = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE).shard_sizes
    budget = bytes_needed(IMAGE_SIZE, sizes)
    assert budget > sum(sizes) * (ROW + 1)  # more than the rows and a byte each (the format before the header)
    for room, files in ((budget, len(sizes)), (budget - 1, len(sizes) - 1)):
        dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / f"rows{room}",
                              decode_cache_bytes=room)
        _epoch(dataset, workers=0)
        calls = _count_decodes(monkeypatch)
        _epoch(dataset, workers=0, epoch=1)
        assert len(list((tmp_path / f"rows{room}").glob(f"*{SUFFIX}"))) == files
        assert (calls == []) == (files == len(sizes))
        monkeypatch.undo()


def test_stale_files_are_removed_and_others_left_alone(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    """Only files this code provably wrote (its header) before this boot are removed: never the user's own `.rows`
    files, nor another dataset's or setting's cache of this boot (another Job sharing the directory)."""
    cache_dir = tmp_path / "rows"
    cache_dir.mkdir()
    sha = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE).manifest.shards[0].sha256
    earlier = DecodeCache(cache_dir, 1 << 30, DecodeKey(IMAGE_SIZE, True, "simplejpeg", boot="0" * 16))
    earlier.prepare([sha])
    assert earlier.open_shard(sha, 4) is not None  # a file this code wrote, before this boot
    other_job = DecodeCache(cache_dir, 1 << 30, DecodeKey(IMAGE_SIZE * 2, True, "simplejpeg"))
    other_job.prepare(["cd" * 32])
    other_rows = other_job.open_shard("cd" * 32, 4)
    assert other_rows is not None
    other_rows.write(0, np.full((IMAGE_SIZE * 2, IMAGE_SIZE * 2, 3), 7, dtype=np.uint8))
    users = {"mine.rows": b"\x01" * 64, DecodeKey(IMAGE_SIZE, True, "simplejpeg").file_name(sha): b"\x01" * 64,
             "notes.txt": b"text"}
    for name, payload in users.items():
        (cache_dir / name).write_bytes(payload)
    HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=cache_dir, decode_cache_bytes=1 << 30)
    left = sorted(p.name for p in cache_dir.iterdir())
    assert left == sorted([*users, other_job.key.file_name("cd" * 32)])
    assert all((cache_dir / name).read_bytes() == payload for name, payload in users.items())
    out = np.zeros((1, IMAGE_SIZE * 2, IMAGE_SIZE * 2, 3), dtype=np.uint8)
    assert other_rows.read(0, out) == [] and (out == 7).all()  # the other Job's rows are intact


def test_a_file_not_written_by_the_cache_is_never_used(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    """A file at a cache file's name without the cache's header (the user's, or an older format) is neither read as
    rows nor written: the shard is decoded every epoch instead."""
    reference = _epoch(HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE), workers=0)
    cache_dir = tmp_path / "rows"
    dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=cache_dir,
                          decode_cache_bytes=1 << 30)
    assert dataset.decoded is not None
    squatter = cache_dir / dataset.decoded.key.file_name(dataset.manifest.shards[0].sha256)
    squatter.write_bytes(b"\x01" * (1 << 16))
    images, labels = _epoch(dataset, workers=0)
    assert np.array_equal(images, reference[0]) and np.array_equal(labels, reference[1])
    assert squatter.read_bytes() == b"\x01" * (1 << 16)


def test_an_overwritten_row_is_decoded_again_not_trained_on(tiny_data: dict[str, Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows carry a checksum: a row whose bytes changed after it was kept (another writer, a bad disk) is noticed
    when it is read back, decoded again and rewritten."""
    reference = _epoch(HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE), workers=0)
    dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "rows",
                          decode_cache_bytes=1 << 30)
    _epoch(dataset, workers=0)  # every row kept
    rows = dataset._shard_rows(0)
    assert rows is not None
    os.pwrite(rows.fd, b"\x00" * 100, rows._row_offset(2) + 50)  # rows 2 and 3 damaged, their entries untouched
    os.pwrite(rows.fd, b"\xff" * ROW, rows._row_offset(3))
    calls = _count_decodes(monkeypatch)
    images, labels = _epoch(dataset, workers=0, epoch=1)
    assert np.array_equal(images, reference[0]) and np.array_equal(labels, reference[1])
    assert len(calls) == 2  # exactly the damaged rows
    calls.clear()
    _epoch(dataset, workers=0, epoch=2)
    assert calls == []  # and they were kept again


def test_bad_settings_are_one_line(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="budget"):
        HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "rows")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(DatasetError, match="a-file.*cannot use as the decode cache"):
        HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=tmp_path / "a-file",
                    decode_cache_bytes=1 << 30)
    decoded = HDF5Dataset(tiny_data["decoded"], decode_cache=tmp_path / "rows", decode_cache_bytes=1 << 30)
    assert decoded.decoded is None  # stored pixels: nothing to keep


def test_a_row_is_kept_only_whole(tmp_path: Path) -> None:
    cache = DecodeCache(tmp_path, 1 << 20, DecodeKey(4, True, "pil"))
    cache.prepare([])
    rows = cache.open_shard("ab" * 32, 3)
    assert rows is not None
    out = np.zeros((3, 4, 4, 3), dtype=np.uint8)
    assert rows.read(0, out) == [0, 1, 2]
    pixels = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    rows.write(1, pixels)
    assert rows.read(0, out) == [0, 2] and np.array_equal(out[1], pixels)
    assert rows.read(1, out[:1]) == [] and np.array_equal(out[0], pixels)
    rows.close()


@pytest.mark.parametrize("checksum", sorted(CHECKSUMS))
def test_every_read_checks_the_row_with_either_checksum(tmp_path: Path, checksum: str) -> None:
    """Whichever checksum the process has (hardware CRC-32C, or zlib's crc32 without the package), a row changed
    after it was kept is refused on every read, not only the first; the two kinds never share a file."""
    key = DecodeKey(4, True, "pil", checksum=checksum)
    assert checksum in key.file_name("ab" * 32)
    if "crc32c" in CHECKSUMS:
        assert DecodeKey(4, True, "pil", checksum="crc32").file_name("ab" * 32) != DecodeKey(
            4, True, "pil", checksum="crc32c").file_name("ab" * 32)
    cache = DecodeCache(tmp_path, 1 << 20, key)
    cache.prepare(["ab" * 32])
    rows = cache.open_shard("ab" * 32, 3)
    assert rows is not None
    pixels = [np.full((4, 4, 3), value, dtype=np.uint8) for value in (1, 2, 3)]
    for local, row in enumerate(pixels):
        rows.write(local, row)
    out = np.zeros((3, 4, 4, 3), dtype=np.uint8)
    for _ in range(2):  # read (and checked) twice: still whole
        assert rows.read(0, out) == [] and all(np.array_equal(out[k], pixels[k]) for k in range(3))
    os.pwrite(rows.fd, b"\x09", rows._row_offset(1) + 7)  # one byte of row 1 changes after two good reads
    assert rows.read(0, out) == [1]
    os.truncate(cache.directory / key.file_name("ab" * 32), rows._row_offset(2) + 5)  # row 2 cut short
    assert rows.read(0, out) == [1, 2]
    rows.close()
    with pytest.raises(ValueError, match="checksum 'md5'"):
        DecodeKey(4, True, "pil", checksum="md5")


def test_the_trainer_decodes_each_sample_once_over_epochs(tiny_data: dict[str, Path], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.train.test_train import _events, _train_here

    calls = _count_decodes(monkeypatch)
    lines = _train_here(["--data", str(tiny_data["encoded"]), "--image-size", str(IMAGE_SIZE), "--epochs", "3",
                         "--workers", "0", "--decode-cache", str(tmp_path / "rows"), "--decode-cache-size", "1Gi"])
    assert [epoch["samples"] for epoch in _events(lines, "epoch")] == [42, 42, 42]
    assert len(calls) == 42


@pytest.mark.parametrize(("flags", "message"), [
    (["--decode-cache", "DIR"], "--decode-cache and --decode-cache-size: give both or neither"),
    (["--decode-cache", "DIR", "--decode-cache-size", "lots"], "argument --decode-cache-size: not a size"),
    (["--decode-cache", "DIR", "--decode-cache-size", "0"], "argument --decode-cache-size: '0' is 0 bytes, below"),
])
def test_trainer_decode_cache_flags_are_checked(flags: list[str], message: str, tiny_data: dict[str, Path],
                                                tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from workloads.train.__main__ import main

    args = ["--data", str(tiny_data["encoded"]), *[str(tmp_path / "rows") if f == "DIR" else f for f in flags]]
    try:
        code = main(args)
    except SystemExit as exited:
        code = exited.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.strip().splitlines()[-1].startswith("error: ")


def test_a_link_in_place_of_a_cache_file_is_not_followed(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    reference = _epoch(HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE), workers=0)
    cache_dir = tmp_path / "rows"
    dataset = HDF5Dataset(tiny_data["encoded"], image_size=IMAGE_SIZE, decode_cache=cache_dir,
                          decode_cache_bytes=1 << 30)
    assert dataset.decoded is not None
    victim = tmp_path / "elsewhere"
    victim.write_bytes(b"keep me")
    (cache_dir / dataset.decoded.key.file_name(dataset.manifest.shards[0].sha256)).symlink_to(victim)
    images, labels = _epoch(dataset, workers=0)  # the first shard is decoded every time instead
    assert np.array_equal(images, reference[0]) and np.array_equal(labels, reference[1])
    assert victim.read_bytes() == b"keep me"


@pytest.mark.parametrize(("text", "expected"), [("100", 100 << 30), ("20Gi", 20 << 30), ("20GiB", 20 << 30),
                                                ("512MiB", 512 << 20), ("500MB", 500 * 10**6), ("4096B", 4096)])
def test_decode_cache_size_follows_the_one_size_rule(text: str, expected: int) -> None:
    """A bare number is GiB, as for every other size flag (stage --budget, pack --shard-size), not bytes."""
    from workloads.cli import parse_size
    from workloads.train.__main__ import parse_args

    config = parse_args(["--data", "d", "--decode-cache", "c", "--decode-cache-size", text])
    assert config.decode_cache_bytes == expected == parse_size(text)
