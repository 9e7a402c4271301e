"""Hostile inputs for the data tools (issue 11): each test failed on the code before the fix.

Real files, a real moto server over HTTP, real subprocesses; ENOSPC comes from a real 1 MiB tmpfs (root only).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.data.helpers import write_corpus
from workloads.data.__main__ import main
from workloads.data.format import load_manifest
from workloads.data.pack import PackOptions, pack
from workloads.data.s3 import S3Uri, make_client
from workloads.data.upload import UploadOptions, upload
from workloads.data.verify import sha256_file, verify

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0


def cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse refusing a flag
        code = int(exc.code or 0)
    err = capsys.readouterr().err
    return code, err


def one_line(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err


def copy_dataset(packed: Path, to: Path) -> Path:
    shutil.copytree(packed, to)
    return to


def small_pack(src: Path, out: Path, per_class: int = 3, **options: object) -> None:
    if not src.exists():
        write_corpus(src, per_class=per_class)
    values: dict = {"image_size": 16, "shard_bytes": 2000, "workers": 1, "progress": False}
    values.update(options)
    pack(src, out, PackOptions(**values))


def put_manifest(client: object, uri: S3Uri, manifest: dict) -> None:
    client.put_object(Bucket=uri.bucket, Key=uri.key("manifest.json"),  # type: ignore[attr-defined]
                      Body=json.dumps(manifest).encode())


# -- manifest paths are untrusted -------------------------------------------------------------------------------
HOSTILE_PATHS = ["../victim.h5", "../../victim.h5", "/tmp/victim.h5", "sub/shard.h5", "..", ".", "",
                 "manifest.json", ".window", "shard\\..\\x.h5", "shard-00000.h5\x00", ".shard-00000.h5.part"]


@pytest.mark.parametrize("bad", HOSTILE_PATHS)
def test_stage_refuses_manifest_paths_outside_dest(bad: str, tmp_path: Path, packed: Path, s3_url: str,
                                                   bucket: str, capsys: pytest.CaptureFixture) -> None:
    victim = tmp_path / "victim.h5"
    victim.write_bytes(b"precious")
    dest = tmp_path / "a" / "dest"
    manifest = json.loads((packed / "manifest.json").read_text())
    manifest["shards"][0]["path"] = bad.replace("/tmp/victim.h5", str(victim))
    uri = S3Uri(bucket, "evil")
    client = make_client(s3_url, 4)
    put_manifest(client, uri, manifest)
    if manifest["shards"][0]["path"] != "manifest.json":
        client.put_object(Bucket=bucket, Key=uri.key(manifest["shards"][0]["path"].lstrip("/")), Body=b"x")
    code, err = cli(["stage", f"s3://{bucket}/evil", str(dest), "--endpoint-url", s3_url, "--no-progress"], capsys)
    assert code == 2 and one_line(err) and "shards.0.path" in err, err
    assert victim.read_bytes() == b"precious"
    assert not dest.exists() or not any(dest.iterdir())


def test_duplicate_shard_paths_are_refused(tmp_path: Path, packed: Path, capsys: pytest.CaptureFixture) -> None:
    copy = copy_dataset(packed, tmp_path / "copy")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][1]["path"] = manifest["shards"][0]["path"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, err = cli(["verify", str(copy)], capsys)
    assert code == 2 and one_line(err) and "shards" in err


@pytest.mark.parametrize("bad", ["../victim.h5", "/tmp/victim.h5"])
def test_verify_and_dataset_refuse_escaping_paths(bad: str, tmp_path: Path, packed: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    from workloads.data.dataset import DatasetError, HDF5Dataset

    copy = copy_dataset(packed, tmp_path / "d" / "copy")
    victim = tmp_path / "d" / "victim.h5"
    shutil.copy(copy / "shard-00000.h5", victim)  # a valid shard outside the dataset
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0]["path"] = bad.replace("/tmp/victim.h5", str(victim))
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, err = cli(["verify", str(copy)], capsys)
    assert code == 2 and one_line(err) and "shards.0.path" in err
    with pytest.raises(DatasetError, match="path"):
        HDF5Dataset(copy)


def test_upload_refuses_escaping_paths(tmp_path: Path, packed: Path, s3_url: str, bucket: str,
                                       capsys: pytest.CaptureFixture) -> None:
    copy = copy_dataset(packed, tmp_path / "d" / "copy")
    secret = tmp_path / "d" / "secret.h5"
    secret.write_bytes(b"ssh key")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0].update(path="../secret.h5", bytes=7, sha256=sha256_file(secret))
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, err = cli(["upload", str(copy), f"s3://{bucket}/x", "--endpoint-url", s3_url, "--no-progress"], capsys)
    assert code == 2 and one_line(err) and "shards.0.path" in err
    assert make_client(s3_url, 4).list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_window_reader_state_cannot_delete_outside_dest(tmp_path: Path, packed: Path, s3_url: str,
                                                        bucket: str) -> None:
    from tests.data.helpers import stage_options, uploaded
    from workloads.data.stage import stage

    target = uploaded(packed, s3_url, bucket)
    victim = tmp_path / "victim.h5"
    victim.write_bytes(b"precious")
    dest = tmp_path / "dest"
    (dest / ".window").mkdir(parents=True)
    (dest / ".window" / "reader.json").write_text(json.dumps({"consumed": ["../victim.h5", str(victim)]}))
    stage(make_client(s3_url, 4), target, dest, stage_options(window_bytes=1 << 30))
    assert victim.read_bytes() == b"precious"


def test_symlinked_shard_in_dest_is_replaced_not_written_through(tmp_path: Path, packed: Path, s3_url: str,
                                                                  bucket: str) -> None:
    from tests.data.helpers import stage_options, uploaded
    from workloads.data.stage import stage

    target = uploaded(packed, s3_url, bucket)
    victim = tmp_path / "victim.h5"
    victim.write_bytes(b"precious")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "shard-00000.h5").symlink_to(victim)
    stage(make_client(s3_url, 4), target, dest, stage_options())
    assert victim.read_bytes() == b"precious"
    assert not (dest / "shard-00000.h5").is_symlink()
    assert verify(dest).num_samples == 24


# -- pack only deletes what it wrote; --force keeps the old dataset until the new one is complete ----------------
def test_pack_keeps_files_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-00015-backup.h5").write_bytes(b"user's backup")
    (out / "shard-00000.h5").write_bytes(b"orphan from somewhere else")
    small_pack(tmp_path / "src", out)
    assert (out / "shard-00015-backup.h5").read_bytes() == b"user's backup"
    assert (out / "shard-00000.h5").read_bytes() == b"orphan from somewhere else"
    assert verify(out).num_samples == 6


def test_force_repack_that_fails_leaves_old_dataset_valid(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    small_pack(tmp_path / "src", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    junk = tmp_path / "junk" / "cls"
    junk.mkdir(parents=True)
    (junk / "notes.txt").write_text("no image here")
    code, err = cli(["pack", str(tmp_path / "junk"), str(out), "--force", "--no-progress", "--size", "16"], capsys)
    assert code == 2 and one_line(err)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert verify(out).num_samples == 6


def test_force_repack_replaces_old_files_and_only_those(tmp_path: Path) -> None:
    out = tmp_path / "out"
    small_pack(tmp_path / "big", out, per_class=8)
    old = set(load_manifest(out).shards)
    (out / "shard-00015-backup.h5").write_bytes(b"keep me")
    small_pack(tmp_path / "small", out, per_class=2, force=True, image_size=12)
    new = load_manifest(out)
    assert verify(out).num_samples == 4 and new.image_size == 12
    names = {p.name for p in out.iterdir()}
    assert names == {s.path for s in new.shards} | {"manifest.json", "pack-report.json", "shard-00015-backup.h5"}
    assert not {s.path for s in old} - {s.path for s in new.shards} & names


def test_sigkill_during_force_repack_leaves_old_dataset_valid(tmp_path: Path) -> None:
    out = tmp_path / "out"
    small_pack(tmp_path / "small", out, per_class=2)
    write_corpus(tmp_path / "src", per_class=150)
    command = [sys.executable, "-m", "workloads.data", "pack", str(tmp_path / "src"), str(out), "--size", "48",
               "--shard-size", "7KiB", "--workers", "1", "--no-progress", "--force"]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while process.poll() is None and len(list(out.glob(".shard-*"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process.poll() is None, "pack finished before it could be interrupted"
        process.send_signal(signal.SIGKILL)
        process.wait()
    finally:
        if process.poll() is None:
            process.kill()
    assert verify(out).num_samples == 4


# -- ENOSPC on a real 1 MiB tmpfs ---------------------------------------------------------------------------------
@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_pack_enospc_is_one_line_and_keeps_old_dataset(tmp_path: Path, tiny_fs: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    out = tiny_fs / "out"
    small_pack(tmp_path / "small", out, per_class=2)
    write_corpus(tmp_path / "src", per_class=40)
    code, err = cli(["pack", str(tmp_path / "src"), str(out), "--size", "96", "--force", "--no-progress",
                     "--workers", "1"], capsys)
    assert code == 2 and one_line(err) and "No space left" in err, err
    assert verify(out).num_samples == 4
    assert not list(out.glob(".*"))


def test_pack_enospc_exactly_while_writing_the_manifest(tmp_path: Path, tiny_fs: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tiny_fs / "out"
    small_pack(tmp_path / "small", out, per_class=2)
    shards = sum(s.bytes for s in load_manifest(out).shards)
    free = shutil.disk_usage(tiny_fs).free
    # Fill the disk so that the new shards (the same size as the old) fit, but a manifest no longer does.
    (tiny_fs / "filler").write_bytes(b"\0" * (free - shards - 4096 * 4))
    code, err = cli(["pack", str(tmp_path / "small"), str(out), "--size", "16", "--force", "--no-progress",
                     "--shard-size", "2000B", "--workers", "1", "--shuffle-seed", "7"], capsys)
    if code == 0:
        pytest.skip("the filler left room for the manifest on this file system")
    assert code == 2 and one_line(err), err
    assert verify(out).num_samples == 4


def test_stage_enospc_is_one_line(tmp_path: Path, tiny_fs: Path, s3_url: str, bucket: str,
                                  capsys: pytest.CaptureFixture) -> None:
    src = tmp_path / "src"
    write_corpus(src, per_class=30)
    out = tmp_path / "out"
    pack(src, out, PackOptions(image_size=96, shard_bytes=200_000, workers=1, progress=False))
    upload(make_client(s3_url, 4), out, S3Uri(bucket, "big"), UploadOptions(workers=2, progress=False))
    code, err = cli(["stage", f"s3://{bucket}/big", str(tiny_fs / "dest"), "--endpoint-url", s3_url,
                     "--no-progress"], capsys)
    assert code == 2 and one_line(err) and "No space left" in err, err


# -- output paths that cannot be written ----------------------------------------------------------------------------
def test_output_is_a_file_or_under_a_file(tmp_path: Path, packed: Path, s3_url: str, bucket: str,
                                          capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=1)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker, blocker / "under"):
        code, err = cli(["pack", str(tmp_path / "src"), str(out), "--no-progress", "--size", "8"], capsys)
        assert code == 2 and one_line(err) and str(blocker) in err, err
    upload(make_client(s3_url, 4), packed, S3Uri(bucket, "p"), UploadOptions(workers=2, progress=False))
    for dest in (blocker, blocker / "under"):
        code, err = cli(["stage", f"s3://{bucket}/p", str(dest), "--endpoint-url", s3_url, "--no-progress"], capsys)
        assert code == 2 and one_line(err) and str(blocker) in err, err
    assert blocker.read_text() == "x"


def test_read_only_output(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=1)
    locked = tmp_path / "locked"
    locked.mkdir()
    if ROOT:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(locked)], check=True)
    else:
        locked.chmod(0o555)
    try:
        code, err = cli(["pack", str(tmp_path / "src"), str(locked / "out"), "--no-progress", "--size", "8"], capsys)
    finally:
        if ROOT:
            subprocess.run(["umount", "-l", str(locked)], check=False)
    assert code == 2 and one_line(err) and str(locked) in err, err


@pytest.mark.parametrize("endpoint", ["notaurl", "http://", "ftp://127.0.0.1:1", "http://[::1"])
def test_bad_endpoint_url_is_one_line(endpoint: str, packed: Path, aws_env: None, tmp_path: Path,
                                      capsys: pytest.CaptureFixture) -> None:
    for argv in (["upload", str(packed), "s3://b/p"], ["stage", "s3://b/p", str(tmp_path / "d")]):
        code, err = cli([*argv, "--endpoint-url", endpoint, "--no-progress", "--attempts" if argv[0] == "stage"
                         else "--workers", "1"], capsys)
        assert code == 2 and one_line(err) and "--endpoint-url" in err, err


def test_manifest_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "ds" / "manifest.json").mkdir(parents=True)
    for argv in (["verify", str(tmp_path / "ds")], ["upload", str(tmp_path / "ds"), "s3://b/p"]):
        code, err = cli(argv, capsys)
        assert code == 2 and one_line(err) and "manifest.json" in err, err


@pytest.mark.parametrize("payload", [b"\xff\xfe\x00garbage", b"[]", b"null", b"{\"format\": 1}", b"7" * 5000])
def test_garbage_manifest_is_one_line(payload: bytes, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_bytes(payload)
    code, err = cli(["verify", str(tmp_path / "ds")], capsys)
    assert code == 2 and one_line(err), err


def test_fewer_classes_than_labels(tmp_path: Path, packed: Path, capsys: pytest.CaptureFixture) -> None:
    copy = copy_dataset(packed, tmp_path / "copy")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["classes"] = manifest["classes"][:1]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, err = cli(["verify", str(copy)], capsys)
    assert code == 1 and one_line(err) and "labels" in err, err
    manifest["classes"] = []
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, err = cli(["verify", str(copy)], capsys)
    assert code == 2 and one_line(err) and "classes" in err, err


# -- workloads.submit with hostile YAML/facts ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["binary", "deep-list", "deep-map", "alias-bomb", "nul"])
@pytest.mark.parametrize("which", ["job", "facts"])
def test_submit_hostile_files(kind: str, which: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from workloads.submit import main as submit_main

    payloads = {
        "binary": bytes(range(256)) * 4,
        "deep-list": b"[" * 5000 + b"]" * 5000,
        "deep-map": b"{a: " * 5000 + b"1" + b"}" * 5000,
        "alias-bomb": b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
            f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
            f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n".encode()
            for i in range(8)),
        "nul": b"name: x\x00y\n",
    }
    good_job = REPO / "workloads" / "jobs"
    job = next(iter(sorted(good_job.glob("*.yaml"))))
    hostile = tmp_path / "hostile.yaml"
    hostile.write_bytes(payloads[kind])
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps({"stack": "dev", "label_prefix": "ml-cluster.io", "pools": []}))
    argv = ["render", str(hostile), "--facts", str(facts)] if which == "job" else \
        ["render", str(job), "--facts", str(hostile)]
    capsys.readouterr()
    code = submit_main(argv)
    err = capsys.readouterr().err
    assert code == 2 and one_line(err) and str(hostile) in err, err
