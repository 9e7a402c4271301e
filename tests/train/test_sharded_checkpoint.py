"""Sharded DCP checkpoints: verified, two-tier, partial ones never loaded, resumed on another world size.

The runs are tests/train/sharded_worker.py (FSDP2 on gloo, 127.0.0.1): one process without torchrun for the 1-rank
cases, real torchrun with 2, 3 and 4 ranks for the resharding ones. make test keeps the manifest and retention
units, a 1-rank stop/resume (bit-equal) and a truncated shard; the rest is marked slow (make test-slow).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.moto_server import free_port, moto_server
from workloads.train.tiers import (
    MANIFEST,
    CheckpointDamaged,
    DirectoryTier,
    Manifest,
    file_digest,
    read_local_manifest,
    step_dir_name,
    to_prune,
    verify_folder,
)

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "train" / "sharded_worker.py"
SAMPLES = 60  # the worker's dataset
STEPS_PER_EPOCH = 5  # 60 samples, global batch 12


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **extra}


def _run(out: Path, *args: str, ranks: int = 0, env: dict[str, str] | None = None, expect: int = 0,
         preexec_fn=None) -> subprocess.CompletedProcess[str]:  # noqa: ANN001
    """ranks=0: one process without torchrun (a 1-rank group from the environment); else torchrun."""
    out.mkdir(parents=True, exist_ok=True)
    if ranks:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(WORKER)]
        extra = {}
    else:
        command = [sys.executable, str(WORKER)]
        extra = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(free_port())}
    result = subprocess.run([*command, "--out", str(out), *args], capture_output=True, text=True,
                            env={**(env or _env()), **extra}, cwd=REPO, timeout=600, preexec_fn=preexec_fn)
    assert result.returncode == expect, result.stderr[-3000:]
    assert "Traceback" not in result.stderr or expect != 0, result.stderr[-3000:]
    return result


def _trained(out: Path) -> list[dict]:
    lines = []
    for path in sorted(out.glob("ids-*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def _assert_every_sample_once_per_epoch(out: Path, epochs: int = 2) -> None:
    for epoch in range(epochs):
        seen = Counter(i for line in _trained(out) if line["epoch"] == epoch for i in line["ids"])
        assert sorted(seen) == list(range(SAMPLES)), f"epoch {epoch}: missing {set(range(SAMPLES)) - set(seen)}"
        assert set(seen.values()) == {1}, f"epoch {epoch}: seen twice {[i for i, n in seen.items() if n > 1]}"


def _final(out: Path) -> dict:
    return torch.load(out / "final.pt", weights_only=True)


def _flat(state: dict) -> dict[str, torch.Tensor]:
    found: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, torch.Tensor):
            found[prefix] = value

    walk("", {"model": state["model"], "optim": state["optim"]})
    return found


def _compare(got: dict, want: dict, *, exact: bool) -> None:
    a, b = _flat(got), _flat(want)
    assert a.keys() == b.keys() and len(a) >= 8
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


# -- the manifest and retention, without a process group -------------------------------------------------------
def _folder_with_manifest(root: Path, step: int) -> tuple[Path, Manifest]:
    folder = root / step_dir_name(step)
    folder.mkdir(parents=True)
    files = {}
    for name, payload in (("__0_0.distcp", b"a" * 1000), (".metadata", b"meta")):
        (folder / name).write_bytes(payload)
        digest, size = file_digest(folder / name)
        files[name] = {"sha256": digest, "bytes": size}
    manifest = Manifest(step, 1, files, {"epoch": 0})
    (folder / MANIFEST).write_bytes(manifest.to_bytes())
    return folder, manifest


@pytest.mark.parametrize(("damage", "words"), [
    (lambda f: (f / "__0_0.distcp").write_bytes(b"a" * 10), "truncated"),
    (lambda f: (f / "__0_0.distcp").write_bytes(b"b" * 1000), "altered"),
    (lambda f: (f / ".metadata").unlink(), "missing"),
])
def test_a_damaged_folder_fails_verification_naming_the_file(tmp_path: Path, damage, words: str) -> None:  # noqa: ANN001
    folder, manifest = _folder_with_manifest(tmp_path, 7)
    verify_folder(folder, manifest)
    damage(folder)
    with pytest.raises(CheckpointDamaged, match=words):
        verify_folder(folder, read_local_manifest(folder))


def test_a_manifest_from_elsewhere_is_refused(tmp_path: Path) -> None:
    folder, _ = _folder_with_manifest(tmp_path, 7)
    (folder / MANIFEST).write_text(json.dumps({"format": "something else"}))
    with pytest.raises(CheckpointDamaged, match="not a checkpoint manifest"):
        read_local_manifest(folder)


def test_retention_keeps_the_newest_complete_ones_and_never_the_only_good_one() -> None:
    assert to_prune([30, 20, 10], [40, 30, 20, 10, 5], keep=2, in_flight=40) == [10, 5]
    assert to_prune([10], [40, 30, 10], keep=1, in_flight=None) == []  # newer partials may still be completing
    assert to_prune([], [3, 2], keep=1, in_flight=None) == []  # nothing good: nothing is deleted
    assert 30 not in to_prune([30], [30], keep=1, in_flight=None)


def test_the_directory_tier_round_trips_and_deletes_the_manifest_first(tmp_path: Path) -> None:
    folder, manifest = _folder_with_manifest(tmp_path / "local", 3)
    tier = DirectoryTier(tmp_path / "efs")
    for name in manifest.files:
        tier.put(folder / name, 3, name)
    assert tier.manifest(3) is None  # files without a manifest: partial
    tier.put_manifest(3, manifest.to_bytes())
    assert tier.steps() == [3] and tier.manifest(3) == manifest
    down = tmp_path / "down"
    down.mkdir()
    assert tier.get(3, "__0_0.distcp", down / "x") == manifest.files["__0_0.distcp"]["sha256"]
    tier.delete(3)
    assert tier.steps() == []


# -- one process: resume, damaged and partial checkpoints, a full disk ------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("uninterrupted")
    _run(out, "--local-dir", str(out / "ckpt"))
    return _final(out)


@pytest.mark.slow  # three FSDP runs; test_train's killed-then-resumed run keeps bit-equality (sharded checkpoints)
def test_one_rank_stopped_and_resumed_equals_an_uninterrupted_run_bit_for_bit(uninterrupted: dict,
                                                                              tmp_path: Path) -> None:
    local = tmp_path / "ckpt"
    _run(tmp_path / "out", "--local-dir", str(local), "--save-every", "2", "--stop-at", "7")
    assert sorted(os.listdir(local)) == [step_dir_name(6), step_dir_name(7)]  # keep=2
    resumed = _run(tmp_path / "out", "--local-dir", str(local))
    assert "resumed from step 7" in resumed.stderr
    _compare(_final(tmp_path / "out"), uninterrupted, exact=True)
    _assert_every_sample_once_per_epoch(tmp_path / "out")


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local tier holding complete checkpoints of steps 2 and 4 (one process, --save-every 2, stopped at 4)."""
    out = tmp_path_factory.mktemp("two-checkpoints")
    _run(out / "out", "--local-dir", str(out / "ckpt"), "--save-every", "2", "--stop-at", "4")
    assert sorted(os.listdir(out / "ckpt")) == [step_dir_name(2), step_dir_name(4)]
    return out / "ckpt"


def _damage(folder: Path, how: str) -> None:
    if how == "truncated shard":
        shard = folder / "__0_0.distcp"
        shard.write_bytes(shard.read_bytes()[:100])
    elif how == "missing manifest":
        (folder / MANIFEST).unlink()
    else:  # the same size, other bytes
        (folder / ".metadata").write_bytes(b"\0" * (folder / ".metadata").stat().st_size)


@pytest.mark.parametrize("damage", ["truncated shard", pytest.param("missing manifest", marks=pytest.mark.slow),
                                    pytest.param("altered metadata", marks=pytest.mark.slow)])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_good_one(two_checkpoints: Path, tmp_path: Path,
                                                                         damage: str) -> None:
    local = tmp_path / "ckpt"
    shutil.copytree(two_checkpoints, local)
    _damage(local / step_dir_name(4), damage)
    resumed = _run(tmp_path / "out", "--local-dir", str(local), "--stop-at", "3")
    assert "resumed from step 2" in resumed.stderr
    if damage != "missing manifest":  # without one it is not a candidate at all
        assert f"step 4 skipped: {local / step_dir_name(4)}/" in resumed.stderr
        assert {"truncated shard": "truncated", "altered metadata": "altered"}[damage] in resumed.stderr


@pytest.mark.slow
def test_nothing_good_anywhere_starts_fresh_with_a_clear_line(two_checkpoints: Path, tmp_path: Path) -> None:
    local = tmp_path / "ckpt"
    shutil.copytree(two_checkpoints, local)
    _damage(local / step_dir_name(4), "truncated shard")
    _damage(local / step_dir_name(2), "altered metadata")
    fresh = _run(tmp_path / "out", "--local-dir", str(local), "--stop-at", "1")
    assert "step 4 skipped" in fresh.stderr and "step 2 skipped" in fresh.stderr
    assert f"no complete checkpoint in {local}; starting fresh" in fresh.stderr


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_checkpoint(two_checkpoints: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE fails every write past 16 KiB (EFBIG, as ENOSPC would): the save reports one line, training
    goes on, and the next start loads the checkpoint written before."""
    local = tmp_path / "ckpt"
    shutil.copytree(two_checkpoints, local)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))

    full = _run(tmp_path / "out", "--local-dir", str(local), "--stop-at", "5", preexec_fn=limit)
    assert "resumed from step 4" in full.stderr
    assert ("checkpoint: step 5 not written (rank 0: OSError: [Errno 27] File too large); the previous complete "
            "checkpoint stands") in full.stderr
    assert not (local / step_dir_name(5) / MANIFEST).exists()
    after = _run(tmp_path / "out", "--local-dir", str(local), "--stop-at", "5")
    assert "resumed from step 4" in after.stderr


# -- the remote tier: S3 (moto), kill -9 in the middle of the upload --------------------------------------------
@pytest.fixture
def bucket_uri() -> Iterator[tuple[str, dict[str, str]]]:
    import boto3

    with moto_server() as url:
        env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ENDPOINT_URL_S3": url}
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="ckpt")
        yield "s3://ckpt/run-1", env


@pytest.mark.slow
def test_killed_during_the_upload_a_new_node_resumes_from_the_previous_complete_copy(
        bucket_uri: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    uri, aws = bucket_uri
    env = _env(**aws)
    _run(tmp_path / "out", "--local-dir", str(tmp_path / "node-a"), "--remote-dir", uri, "--save-every", "2",
         "--kill-in-upload", "4", "--stop-at", "6", env=env, expect=-9)
    # node a's disk is gone; node b starts with an empty local tier: step 4 reached S3 without its manifest
    resumed = _run(tmp_path / "out", "--local-dir", str(tmp_path / "node-b"), "--remote-dir", uri, "--stop-at", "5",
                   env=env)
    assert "resumed from step 2" in resumed.stderr, resumed.stderr
    assert "step 4 skipped" in resumed.stderr and "no manifest (partial)" in resumed.stderr
    assert (tmp_path / "node-b" / step_dir_name(2) / MANIFEST).exists()  # downloaded, verified, then used


# -- many ranks: resharding, sample-exact data position, tensor-parallel peers ----------------------------------
@pytest.fixture(scope="module")
def two_rank_reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("reference")
    _run(out, "--local-dir", str(out / "ckpt"), ranks=2)
    return _final(out)


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 3), (4, 2), (2, 2)])
def test_a_checkpoint_of_n_ranks_resumes_on_m_ranks_like_an_uninterrupted_run(
        two_rank_reference: dict, tmp_path: Path, before: int, after: int) -> None:
    """The global batch is fixed (12), so the math is the same on any world size: bit-equal on the same world size;
    on another one the gradient average sums over another number of ranks (another float order): equal to 1e-6."""
    local, out = tmp_path / "ckpt", tmp_path / "out"
    _run(out, "--local-dir", str(local), "--stop-at", "3", ranks=before)
    resumed = _run(out, "--local-dir", str(local), ranks=after)
    assert f"resumed from step 3 ({before} ranks then, {after} now)" in resumed.stderr
    _compare(_final(out), two_rank_reference, exact=before == after == 2)
    _assert_every_sample_once_per_epoch(out)
    assert max(line["step"] for line in _trained(out)) == 2 * STEPS_PER_EPOCH


@pytest.mark.slow
def test_tensor_parallel_peers_in_a_2x2_mesh_get_identical_batches(tmp_path: Path) -> None:
    _run(tmp_path, "--mesh-only", ranks=4)
    by_rank = {line["rank"]: line for line in _trained(tmp_path)}
    batches: dict[int, list[list[int]]] = {}
    for rank in range(4):
        batches.setdefault(rank, [])
    for line in _trained(tmp_path):
        batches[line["rank"]].append(line["ids"])
    assert by_rank[0]["dp"] == by_rank[1]["dp"] == 0 and by_rank[2]["dp"] == by_rank[3]["dp"] == 1
    assert batches[0] == batches[1] and batches[2] == batches[3]
    replicas = [i for rank in (0, 2) for batch in batches[rank] for i in batch]
    assert sorted(replicas) == list(range(SAMPLES))
