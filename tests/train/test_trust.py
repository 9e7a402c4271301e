"""The trainer's identities by content, its waits with deadlines, and its exit codes: a config error exits with the
config code (the Job's podFailurePolicy fails the Job), everything else with 1 (the Job retries)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from tests.train.legacy import legacy_state, write_last_pt
from tests.train.test_train import TINY_RUN, _events, _train_here
from workloads.data.format.manifest import (
    FORMAT_NAME,
    FORMAT_VERSION,
    HEARTBEAT,
    Manifest,
    ShardInfo,
    load_manifest,
    shard_name,
    write_manifest,
)
from workloads.data.moving.cache import StagerState, cache_dir, touch_heartbeat, write_stager_state
from workloads.data.reading.dataset import DatasetError, HDF5Dataset
from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.train.__main__ import main
from workloads.train.checkpoint import CHECKPOINT_NAME, CheckpointError, load_checkpoint, sidecar_path
from workloads.train.checkpointer import latest_checkpoint
from workloads.train.loop import Distributed, check_resumable, dataset_identity

CONFIG = 42


def _run(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", str(CONFIG))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code = main([*TINY_RUN, "--workers", "0", *args])
    except SystemExit as exited:
        code = int(exited.code or 0)
    finally:
        torch.set_num_threads(threads)
    return code, capsys.readouterr().err


def repack(source: Path, out: Path, sizes: list[int], order: list[int] | None = None) -> Path:
    """The same decoded images and labels as `source`, in shards of `sizes` (optionally in another sample order)."""
    manifest = load_manifest(source)
    images, labels = [], []
    for shard in manifest.shards:
        with h5py.File(source / shard.path, "r") as handle:
            images.append(handle["images"][:])
            labels.append(handle["labels"][:])
    pixels, tags = np.concatenate(images), np.concatenate(labels)
    if order is not None:
        pixels, tags = pixels[order], tags[order]
    out.mkdir(parents=True)
    shards, first = [], 0
    for number, count in enumerate(sizes):
        path = out / shard_name(number)
        with h5py.File(path, "w") as handle:
            handle.attrs.update({"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "layout": "decoded"})
            handle["images"] = pixels[first : first + count]
            handle["labels"] = tags[first : first + count]
        shards.append(ShardInfo(path=path.name, num_samples=count, first_index=first, bytes=path.stat().st_size,
                                sha256=hashlib.sha256(path.read_bytes()).hexdigest()))
        first += count
    write_manifest(out, manifest.model_copy(update={"shards": shards, "num_samples": first}))
    return out


# -- the dataset a checkpoint resumes on is checked by content ---------------------------------------------------
def _saved(dataset: HDF5Dataset, **extra: Any) -> dict[str, Any]:
    return {"config": {"model": "resnet18", "width": 8}, "epoch": 0, "batch": 3, "loader": {},
            "dataset": dataset_identity(dataset), **extra}


def test_a_repack_in_another_shard_layout_is_refused(tiny_data: dict[str, Path], tmp_path: Path) -> None:
    """Same images, same classes, same count, another shard layout and order: a sample-exact resume would read
    other samples, so it is refused (it used to resume and exit 0)."""
    from workloads.train.__main__ import parse_args

    original = HDF5Dataset(tiny_data["decoded"])
    config = parse_args(["--data", "x", *TINY_RUN])
    where = tmp_path / CHECKPOINT_NAME
    for name, sizes, order in (("layout", [14, 14, 14], None), ("order", [17, 25], list(range(41, -1, -1)))):
        other = HDF5Dataset(repack(tiny_data["decoded"], tmp_path / name, sizes, order))
        assert other.classes == original.classes and len(other) == len(original)
        with pytest.raises(CheckpointError, match=f"^--data: {where} was trained on another dataset") as refused:
            check_resumable(_saved(original), config, Distributed(0, 1, 0), other, where)
        expected = "2 shards then, 3 now" if name == "layout" else "shard 0 differs"
        assert expected in str(refused.value), refused.value
    same = HDF5Dataset(repack(tiny_data["decoded"], tmp_path / "same", [17, 25]))
    check_resumable(_saved(original), config, Distributed(0, 4, 0, 2), same, where)  # elastic: any world size


@pytest.mark.parametrize("record", [None, {"classes": ["class0", "class1", "class2"], "num_samples": 42}])
def test_a_checkpoint_without_a_dataset_record_by_content_is_refused(record: Any, tiny_data: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    from workloads.train.__main__ import parse_args

    dataset = HDF5Dataset(tiny_data["decoded"])
    saved = _saved(dataset)
    saved.pop("dataset")
    if record is not None:
        saved["dataset"] = record
    with pytest.raises(CheckpointError, match=f"^--resume: {tmp_path}.*older trainer"):
        check_resumable(saved, parse_args(["--data", "x", *TINY_RUN]), Distributed(0, 1, 0), dataset,
                        tmp_path / CHECKPOINT_NAME)


def test_resuming_on_a_repack_is_a_config_error_end_to_end(tiny_data: dict[str, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = tmp_path / "ckpt"
    _train_here(["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0", "--checkpoint-dir",
                 str(checkpoints), "--checkpoint-every", "2"])
    saved = latest_checkpoint(checkpoints)
    first = load_manifest(tiny_data["decoded"]).shards[0]
    assert saved is not None and saved["dataset"]["shards"][0] == [first.sha256, first.num_samples]
    other = repack(tiny_data["decoded"], tmp_path / "repacked", [21, 21])
    code, err = _run(["--data", str(other), "--epochs", "2", "--checkpoint-dir", str(checkpoints), "--resume"],
                     capsys, monkeypatch)
    assert code == CONFIG and err.count("\n") == 1, err
    assert err.startswith(f"error: --data: {checkpoints / 'step-000000006'} was trained on another dataset"), err


# -- a manifest must describe its shards --------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "field"), [({"num_samples": 43}, "num_samples"),
                                               ({"num_samples": 1000}, "num_samples")])
def test_a_manifest_claiming_more_samples_than_its_shards_hold_is_refused(
        change: dict[str, int], field: str, tiny_data: dict[str, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for path in tiny_data["decoded"].iterdir():
        (data / path.name).symlink_to(path)
    (data / "manifest.json").unlink()
    raw = json.loads((tiny_data["decoded"] / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**raw, **change}))
    with pytest.raises(DatasetError, match=field):
        HDF5Dataset(data)
    code, err = _run(["--data", str(data)], capsys, monkeypatch)
    assert code == CONFIG and err.count("\n") == 1 and "num_samples" in err, err


def test_a_shard_whose_first_index_leaves_a_gap_is_refused(tiny_data: dict[str, Path]) -> None:
    manifest = load_manifest(tiny_data["decoded"])
    shards = [manifest.shards[0], manifest.shards[1].model_copy(update={"first_index": 20})]
    with pytest.raises(ValueError, match="first_index"):
        Manifest.model_validate({**manifest.model_dump(), "shards": [s.model_dump() for s in shards]})


# -- a final batch of one sample ----------------------------------------------------------------------------------
def test_no_rank_gets_a_batch_of_one_and_no_sample_is_lost() -> None:
    for world in (1, 2, 3):
        for batch in (2, 4, 5):
            sampler = ElasticBatchSampler([17, 25], batch, world_size=world, min_rank_batch=2, seed=1)
            pieces = [list(ElasticBatchSampler([17, 25], batch, world_size=world, rank=rank, min_rank_batch=2,
                                               seed=1)) for rank in range(world)]
            assert all(len(piece) >= 2 for rank in pieces for piece in rank), (world, batch)
            assert sorted(i for rank in pieces for piece in rank for i in piece) == list(range(42))
            assert len(sampler) == len(pieces[0])


def test_a_last_batch_of_one_sample_trains(tiny_data: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """42 samples in batches of 41: the last step would hold one sample, which BatchNorm cannot normalise (it
    crashed the run, with the config-error code)."""
    code, err = _run(["--data", str(tiny_data["decoded"]), "--batch-size", "41", "--epochs", "1"], capsys,
                     monkeypatch)
    assert code == 0, err


def test_a_lone_sample_after_an_elastic_resume_trains_in_batchnorm_eval(tiny_data: dict[str, Path],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """One sample is all that is left of the epoch (another batch size on resume can leave that): BatchNorm uses
    its running statistics for that step instead of failing."""
    sampler = ElasticBatchSampler([17, 25], 8, min_rank_batch=2)
    state = sampler.state_dict(0)
    state["offsets"] = [41]
    resumed = ElasticBatchSampler([17, 25], 8, min_rank_batch=2)
    resumed.load_state_dict(state)
    assert [len(batch) for batch in resumed] == [1]  # nothing to merge it into

    from workloads.train import inputs

    class Unmerged(ElasticBatchSampler):  # a sampler that leaves the tail of one: the trainer must cope
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "min_rank_batch": 1})

    monkeypatch.setattr(inputs, "ElasticBatchSampler", Unmerged)
    lines = _train_here(["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0",
                         "--batch-size", "41"])
    assert [batch["batch"] for batch in _events(lines, "batch")] == [0, 1]
    assert [epoch["samples"] for epoch in _events(lines, "epoch")] == [42]


# -- exit codes ---------------------------------------------------------------------------------------------------
def test_a_failure_inside_torch_is_a_runtime_error_not_a_config_error(
        tiny_data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads.train import models

    def broken(self: Any, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("Expected more than 1 value per channel when training")

    monkeypatch.setattr(models.ResNet, "forward", broken)
    code, err = _run(["--data", str(tiny_data["decoded"])], capsys, monkeypatch)
    assert code == 1, err
    assert err.strip().splitlines()[-1] == "error: ValueError: Expected more than 1 value per channel when training"


@pytest.mark.parametrize("value", ["1", "0", "130", "300", "x"])
def test_the_config_code_is_never_the_runtime_code(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from workloads.train.__main__ import RUNTIME_EXIT_CODE, config_error_exit_code

    monkeypatch.setenv("CONFIG_ERROR_EXIT_CODE", value)
    assert config_error_exit_code() == 2 != RUNTIME_EXIT_CODE


def test_the_jobs_fail_fast_only_on_the_config_code() -> None:
    """The rendered Job's podFailurePolicy fails the Job on the trainer's config code, which the Job passes in its
    environment; every other exit (the runtime code 1 included) is retried."""
    from tests.jobs.facts import dev_facts
    from workloads.jobspec import CONFIG_ERROR_EXIT_CODE, TRAIN_CONTAINER, load_job_file, render_job
    from workloads.train.__main__ import RUNTIME_EXIT_CODE

    (spec,) = load_job_file("workloads/jobs/resnet50-s3-copy.yaml")
    job = next(m for m in render_job(spec, dev_facts()) if m["kind"] == "Job")
    rules = job["spec"]["podFailurePolicy"]["rules"]
    fail = [rule for rule in rules if rule["action"] == "FailJob"]
    assert [rule["onExitCodes"] for rule in fail] == [
        {"containerName": TRAIN_CONTAINER, "operator": "In", "values": [CONFIG_ERROR_EXIT_CODE]}]
    container = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == TRAIN_CONTAINER)
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["CONFIG_ERROR_EXIT_CODE"] == str(CONFIG_ERROR_EXIT_CODE) != str(RUNTIME_EXIT_CODE)
    os.environ["CONFIG_ERROR_EXIT_CODE"] = env["CONFIG_ERROR_EXIT_CODE"]
    try:
        from workloads.train.__main__ import config_error_exit_code

        assert config_error_exit_code() == CONFIG_ERROR_EXIT_CODE
    finally:
        del os.environ["CONFIG_ERROR_EXIT_CODE"]


def _staging(tiny_data: dict[str, Path], tmp_path: Path) -> Path:
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "manifest.json").write_bytes((tiny_data["decoded"] / "manifest.json").read_bytes())
    return dest


def test_a_stager_that_died_is_a_runtime_error_within_the_stager_timeout(
        tiny_data: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    dest = _staging(tiny_data, tmp_path)
    write_stager_state(dest, StagerState(budget=None, ready=[]))
    touch_heartbeat(dest)
    old = time.time() - 600
    os.utime(cache_dir(dest) / HEARTBEAT, (old, old))
    code, err = _run(["--data", str(dest), "--stager-timeout", "0.2", "--shard-timeout", "30"], capsys, monkeypatch)
    # the heartbeat's deadline ended it: the 30 s shard deadline's error would be "not staged after 30s"
    assert code == 1 and err.count("\n") == 1 and "no stager is running" in err and "shard-0000" in err, err
    assert "not staged after" not in err, err


def test_a_manifest_that_never_comes_is_a_runtime_error_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    code, err = _run(["--data", str(dest), "--wait-for-data", "0.3"], capsys, monkeypatch)
    assert code == 1 and err == f"error: {dest / 'manifest.json'}: did not appear within 0.3s (--wait-for-data); " \
                                "is the staging sidecar running?\n", err
    write_stager_state(dest, StagerState(error="s3://b/p: access denied"))  # a stager that failed: at once
    code, err = _run(["--data", str(dest), "--wait-for-data", "30"], capsys, monkeypatch)
    # found while waiting (the deadline's own error says "did not appear within 30s")
    assert code == 1 and "the stager failed: s3://b/p: access denied" in err and "did not appear" not in err, err


# -- checkpoint sidecars read as untrusted ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["directory", "binary", "fifo", "link"])
def test_a_hostile_sidecar_is_a_one_line_error_naming_it(kind: str, tiny_data: dict[str, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = tmp_path / "ckpt"
    _train_here(["--data", str(tiny_data["decoded"]), "--epochs", "1", "--workers", "0", "--checkpoint-dir",
                 str(checkpoints)])
    write_last_pt(checkpoints, legacy_state(checkpoints))  # as an older trainer left it: no sharded checkpoint
    shutil.rmtree(checkpoints / "step-000000006")
    sidecar = sidecar_path(checkpoints / CHECKPOINT_NAME)
    sidecar.unlink()
    if kind == "directory":
        sidecar.mkdir()
    elif kind == "binary":
        sidecar.write_bytes(b"\xff\xfe" + os.urandom(64))
    elif kind == "fifo":
        os.mkfifo(sidecar)
    else:
        sidecar.symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match=f"^{sidecar}: not a sha256 sidecar"):
        load_checkpoint(checkpoints)
    code, err = _run(["--data", str(tiny_data["decoded"]), "--epochs", "2", "--checkpoint-dir", str(checkpoints),
                      "--resume"], capsys, monkeypatch)
    assert code == CONFIG and err.startswith(f"error: {sidecar}: ") and err.count("\n") == 1, err


def test_a_checkpoint_that_is_a_directory_or_fifo_is_an_error(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_NAME).mkdir()
    with pytest.raises(CheckpointError, match="a directory, not a checkpoint file"):
        load_checkpoint(tmp_path)
    (tmp_path / CHECKPOINT_NAME).rmdir()
    os.mkfifo(tmp_path / CHECKPOINT_NAME)
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_checkpoint(tmp_path)
