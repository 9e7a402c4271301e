"""Hostile inputs for the data tools: each test failed on the code before the fix.

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
from typing import Any

import pytest

from tests.data.helpers import alive, kill_pack_mid_shards, write_corpus
from workloads.data.__main__ import main
from workloads.data.format.manifest import load_manifest
from workloads.data.format.verify import sha256_file, verify
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import UploadOptions, upload
from workloads.data.writing.pack import PackOptions, pack

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
                 "manifest.json", ".cache", "shard\\..\\x.h5", "shard-00000.h5\x00", ".shard-00000.h5.part"]


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
    from workloads.data.reading.dataset import DatasetError, HDF5Dataset

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


def test_symlinked_shard_in_dest_is_replaced_not_written_through(tmp_path: Path, packed: Path, s3_url: str,
                                                                  bucket: str) -> None:
    from tests.data.helpers import stage_options, uploaded
    from workloads.data.moving.stage import stage

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
    kill_pack_mid_shards(tmp_path / "src", out, "--force", temporaries=3)
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
    assert code == 1 and one_line(err) and "No space left" in err, err  # runtime (retried), not config (2)
    assert verify(out).num_samples == 4
    assert not list(out.glob(".*"))


def test_pack_enospc_exactly_while_writing_the_manifest(tmp_path: Path, tiny_fs: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    out = tiny_fs / "out"
    small_pack(tmp_path / "small", out, per_class=2)
    pages = sum(-(-s.bytes // 4096) * 4096 for s in load_manifest(out).shards)
    free = shutil.disk_usage(tiny_fs).free
    # Fill the disk so that the new shards (the same pages as the old) fit exactly, and then the manifest does not.
    (tiny_fs / "filler").write_bytes(b"\0" * (free - pages))
    code, err = cli(["pack", str(tmp_path / "small"), str(out), "--size", "16", "--force", "--no-progress",
                     "--shard-size", "2000B", "--workers", "1", "--shuffle-seed", "7"], capsys)
    if code == 0:
        pytest.skip("the filler left room for the manifest on this file system")
    assert code == 1 and one_line(err) and "manifest.json" in err and "No space left" in err, err
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
    assert code == 1 and one_line(err) and "No space left" in err, err
    assert str(tiny_fs / "dest") in err  # the file that could not be written, not "I/O"


def test_stage_enospc_exactly_at_the_manifest_names_it(tmp_path: Path, tiny_fs: Path, packed: Path, s3_url: str,
                                                       bucket: str, capsys: pytest.CaptureFixture) -> None:
    """Every shard fits, the manifest written last does not: the error names manifest.json, never `I/O`."""
    upload(make_client(s3_url, 4), packed, S3Uri(bucket, "fits"), UploadOptions(workers=2, progress=False))
    dest = tiny_fs / "dest"
    dest.mkdir()
    pages = sum(-(-s.bytes // 4096) * 4096 for s in load_manifest(packed).shards)
    (tiny_fs / "filler").write_bytes(b"\0" * (shutil.disk_usage(tiny_fs).free - pages))
    code, err = cli(["stage", f"s3://{bucket}/fits", str(dest), "--endpoint-url", s3_url, "--no-progress"], capsys)
    if code == 0:
        pytest.skip("the filler left room for the manifest on this file system")
    assert code == 1 and one_line(err) and "No space left" in err, err
    assert err.startswith(f"error: {dest / 'manifest.json'}: "), err


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
    from workloads.submit.cli import main as submit_main

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


# -- upload sends only what matches the manifest; --force repairs; the prefix holds one dataset ---------------------
def _corrupt(path: Path) -> None:
    payload = bytearray(path.read_bytes())
    payload[len(payload) // 2] ^= 0xFF
    path.write_bytes(bytes(payload))


def test_upload_refuses_a_corrupt_local_shard(tmp_path: Path, packed: Path, s3_url: str, bucket: str,
                                              capsys: pytest.CaptureFixture) -> None:
    copy = copy_dataset(packed, tmp_path / "copy")
    _corrupt(copy / "shard-00001.h5")
    code, err = cli(["upload", str(copy), f"s3://{bucket}/p", "--endpoint-url", s3_url, "--no-progress"], capsys)
    assert code == 2 and one_line(err) and "shard-00001.h5" in err and "sha256" in err, err
    keys = [o["Key"] for o in make_client(s3_url, 4).list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert "p/manifest.json" not in keys


def _uploaded_with_a_bad_shard(packed: Path, s3_url: str, bucket: str) -> tuple[Any, bytes]:
    """`packed` uploaded to s3://bucket/p, then shard 1 overwritten with one flipped byte under the good sha256
    metadata; the client and the good bytes."""
    client = make_client(s3_url, 4)
    upload(client, packed, S3Uri(bucket, "p"), UploadOptions(workers=2, progress=False))
    good = (packed / "shard-00001.h5").read_bytes()
    bad = bytearray(good)
    bad[100] ^= 0xFF
    sha = load_manifest(packed).shards[1].sha256
    client.put_object(Bucket=bucket, Key="p/shard-00001.h5", Body=bytes(bad), Metadata={"sha256": sha})
    return client, good


def test_upload_force_repairs_a_remote_object_that_does_not_match(tmp_path: Path, packed: Path, s3_url: str,
                                                                  bucket: str, capsys: pytest.CaptureFixture) -> None:
    client, good = _uploaded_with_a_bad_shard(packed, s3_url, bucket)
    code, _ = cli(["upload", str(packed), f"s3://{bucket}/p", "--endpoint-url", s3_url, "--no-progress",
                   "--force"], capsys)
    assert code == 0
    assert client.get_object(Bucket=bucket, Key="p/shard-00001.h5")["Body"].read() == good


def test_upload_without_force_repairs_a_single_part_object_whose_etag_differs(
        tmp_path: Path, packed: Path, s3_url: str, bucket: str) -> None:
    client, good = _uploaded_with_a_bad_shard(packed, s3_url, bucket)
    upload(client, packed, S3Uri(bucket, "p"), UploadOptions(workers=2, progress=False))
    assert client.get_object(Bucket=bucket, Key="p/shard-00001.h5")["Body"].read() == good


def test_reupload_of_a_smaller_pack_leaves_exactly_one_dataset(tmp_path: Path, s3_url: str, bucket: str) -> None:
    client = make_client(s3_url, 4)
    small_pack(tmp_path / "big", tmp_path / "a", per_class=8)
    small_pack(tmp_path / "small", tmp_path / "b", per_class=1)
    client.put_object(Bucket=bucket, Key="p/README.txt", Body=b"the user's note")
    upload(client, tmp_path / "a", S3Uri(bucket, "p"), UploadOptions(workers=2, progress=False))
    upload(client, tmp_path / "b", S3Uri(bucket, "p"), UploadOptions(workers=2, progress=False))
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="p/")["Contents"]}
    expected = {f"p/{s.path}" for s in load_manifest(tmp_path / "b").shards} | {"p/manifest.json", "p/README.txt"}
    assert keys == expected


# -- pixels: every PIL mode an image folder can hold ------------------------------------------------------------------
def _reference(mode: str, values: object) -> object:
    import numpy as np

    a = np.asarray(values)
    if mode in ("I;16", "I;16B", "I;16L"):
        return np.repeat(np.round(a.astype(np.float64) / 257)[..., None], 3, axis=-1).astype(np.uint8)
    if mode == "I":
        return np.repeat(np.round(np.clip(a, 0, 65535) / 257)[..., None], 3, axis=-1).astype(np.uint8)
    if mode == "F":
        return np.repeat(np.round(np.clip(a, 0, 1) * 255)[..., None], 3, axis=-1).astype(np.uint8)
    raise AssertionError(mode)


@pytest.mark.parametrize("mode", ["I;16", "I;16B", "I", "F"])
def test_high_bit_depth_greyscale_keeps_its_values(mode: str) -> None:
    import numpy as np
    from PIL import Image

    from workloads.data.writing.samples import _to_rgb

    if mode == "F":
        values = np.array([[0.0, 0.25], [0.5, 1.0]], dtype=np.float32)
        image = Image.fromarray(values, mode="F")
    elif mode == "I":
        values = np.array([[0, 1000], [30000, 65535]], dtype=np.int32)
        image = Image.fromarray(values, mode="I")
    else:
        values = np.array([[0, 1000], [30000, 65535]], dtype=np.uint16)
        image = Image.new(mode, (2, 2))
        image.putdata(values.flatten().tolist())
    got = np.asarray(_to_rgb(image))
    assert got.tolist() == _reference(mode, values).tolist()


@pytest.mark.parametrize(("mode", "fill", "rgb"), [
    ("1", 1, (255, 255, 255)), ("L", 77, (77, 77, 77)), ("LA", (77, 255), (77, 77, 77)),
    ("LA", (0, 0), (255, 255, 255)), ("RGB", (10, 20, 30), (10, 20, 30)), ("RGBA", (10, 20, 30, 255), (10, 20, 30)),
    ("RGBA", (10, 20, 30, 0), (255, 255, 255)), ("RGBX", (10, 20, 30, 0), (10, 20, 30)),
    ("CMYK", (0, 255, 255, 0), (255, 0, 0)), ("YCbCr", (76, 85, 255), (254, 0, 0)),
    ("HSV", (0, 255, 255), (255, 0, 0)), ("HSV", (85, 255, 255), (0, 255, 0)),
    ("LAB", (255, 128, 128), (255, 255, 255)), ("LAB", (0, 128, 128), (0, 0, 0)),
    ("LAB", (138, 209, 198), (255, 0, 0)),  # sRGB red in Pillow's LAB (D50, L*2.55, a/b +128)
])
def test_every_mode_converts_to_the_right_rgb(mode: str, fill: object, rgb: tuple[int, int, int]) -> None:
    from PIL import Image

    from workloads.data.writing.samples import _to_rgb

    got = _to_rgb(Image.new(mode, (3, 3), fill)).getpixel((1, 1))
    assert all(abs(a - b) <= 5 for a, b in zip(got, rgb, strict=True)), (mode, fill, got, rgb)


def test_palette_modes_convert_through_their_palette() -> None:
    from PIL import Image

    from workloads.data.writing.samples import _to_rgb

    p = Image.new("P", (2, 2), 1)
    p.putpalette([0, 0, 0, 0, 200, 0] + [0] * 762)
    assert _to_rgb(p).getpixel((0, 0)) == (0, 200, 0)
    pa = p.convert("PA")
    assert _to_rgb(pa).getpixel((0, 0)) == (0, 200, 0)


def test_16_bit_png_is_packed_with_its_values_not_white(tmp_path: Path) -> None:
    import h5py
    import numpy as np
    from PIL import Image

    (tmp_path / "src" / "x").mkdir(parents=True)
    values = np.full((16, 16), 20000, dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "src" / "x" / "deep.png")
    with Image.open(tmp_path / "src" / "x" / "deep.png") as check:
        assert check.mode in ("I;16", "I")
    manifest = pack(tmp_path / "src", tmp_path / "out", PackOptions(image_size=16, workers=1, progress=False)).manifest
    with h5py.File(tmp_path / "out" / manifest.shards[0].path) as shard:
        assert shard["images"][0, 8, 8].tolist() == [round(20000 / 257)] * 3


# -- empty class folders --------------------------------------------------------------------------------------------
def test_empty_class_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=1)
    (tmp_path / "src" / "aaa-empty").mkdir()
    code, err = cli(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--no-progress", "--size", "8"], capsys)
    assert code == 2 and one_line(err) and "aaa-empty" in err, err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_class_of_only_unusable_files_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=1)
    (tmp_path / "src" / "junk").mkdir()
    (tmp_path / "src" / "junk" / "a.jpg").write_bytes(b"nope")
    code, err = cli(["pack", str(tmp_path / "src"), str(tmp_path / "out"), "--no-progress", "--size", "8"], capsys)
    assert code == 2 and one_line(err) and "junk" in err, err


# -- file modes ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_follow_the_umask(umask: int, tmp_path: Path, packed: Path, s3_url: str, bucket: str) -> None:
    from tests.data.helpers import stage_options, uploaded
    from workloads.data.moving.cache import ReadPlan, write_plan
    from workloads.data.moving.stage import stage

    target = uploaded(packed, s3_url, bucket)
    # the reader is done already: the stager only publishes
    write_plan(tmp_path / "dest", ReadPlan(order=[], done=True))
    old = os.umask(umask)
    try:
        small_pack(tmp_path / "src", tmp_path / "out")
        stage(make_client(s3_url, 4), target, tmp_path / "dest", stage_options(budget_bytes=1 << 30))
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    for path in [tmp_path / "out" / "manifest.json", tmp_path / "out" / "pack-report.json",
                 tmp_path / "dest" / "manifest.json", tmp_path / "dest" / ".cache" / "stager.json"]:
        assert path.stat().st_mode & 0o777 == want, path
    for shard in (tmp_path / "out").glob("shard-*.h5"):
        assert shard.stat().st_mode & 0o777 == want


# -- size and count flags: absurd values refused ---------------------------------------------------------------------
@pytest.mark.parametrize(("argv", "where"), [
    (["upload", "D", "s3://b/p", "--part-size", "16"], None),  # 16 GiB: above S3's 5 GiB part maximum
    (["upload", "D", "s3://b/p", "--part-size", "16B"], "--part-size"),
    (["upload", "D", "s3://b/p", "--part-size", "1MiB"], "--part-size"),
    (["stage", "s3://b/p", "D", "--part-size", "16B"], "--part-size"),
    (["stage", "s3://b/p", "D", "--budget", "100B"], "--budget"),
    (["stage", "s3://b/p", "D", "--budget", "-1GiB"], "--budget"),
    (["stage", "s3://b/p", "D", "--window", "100B"], "--window"),
    (["stage", "s3://b/p", "D", "--window", "-1GiB"], "--window"),
    (["pack", "S", "O", "--shard-size", "1000B"], None),
    (["pack", "S", "O", "--shard-size", "1e9"], "--shard-size"),
    (["pack", "S", "O", "--shard-size", "0"], "--shard-size"),
    (["pack", "S", "O", "--shard-size", "100TiB"], "--shard-size"),
    (["pack", "S", "O", "--workers", "100000"], "--workers"),
    (["pack", "S", "O", "--size", "100000"], "--size"),
    (["upload", "D", "s3://b/p", "--workers", "100000"], "--workers"),
    (["stage", "s3://b/p", "D", "--workers", "100000"], "--workers"),
    (["stage", "s3://b/p", "D", "--wait-timeout", "-1"], "--wait-timeout"),
    (["stage", "s3://b/p", "D", "--wait-timeout", "nan"], "--wait-timeout"),
])
def test_absurd_sizes_and_counts_are_refused(argv: list[str], where: str | None, capsys: pytest.CaptureFixture) -> None:
    code, err = cli(argv, capsys)
    assert code == 2 and one_line(err) and (where or argv[-2]) in err, err


def test_size_units_are_one_rule() -> None:
    from workloads.data.__main__ import parse_size

    assert parse_size("1") == 1 << 30 and parse_size("1GiB") == 1 << 30 and parse_size("1Gi") == 1 << 30
    assert parse_size("1GB") == 10**9 and parse_size("1G") == 10**9 and parse_size("512KiB") == 512 * 1024
    assert parse_size("4096B") == 4096 and parse_size("1.5MiB") == 3 << 19


# -- pack workers die with a SIGKILLed parent ------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")
def test_pack_workers_exit_when_the_parent_is_killed(tmp_path: Path) -> None:
    write_corpus(tmp_path / "src", per_class=300)
    command = [sys.executable, "-m", "workloads.data", "pack", str(tmp_path / "src"), str(tmp_path / "out"),
               "--size", "64", "--workers", "2", "--no-progress"]
    process = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            workers = _children(process.pid)
            if len(workers) >= 2:
                break
            time.sleep(0.02)
        assert process.poll() is None and len(workers) >= 2, "pack finished before its workers could be seen"
        time.sleep(0.3)
        process.send_signal(signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in workers), "pack workers outlived their parent"
    finally:
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()


# -- more hostile inputs -----------------------------------------------------------------------------------------------
def test_fifo_in_the_image_folder_is_skipped_not_waited_on(tmp_path: Path) -> None:
    write_corpus(tmp_path / "src", per_class=1)
    os.mkfifo(tmp_path / "src" / "ants" / "pipe.jpg")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "workloads.data", "pack", str(tmp_path / "src"), str(tmp_path / "o"),
                           "--size", "8", "--workers", "1", "--no-progress"], cwd=REPO, env=env, timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "o" / "pack-report.json").read_text())["skipped"]
    assert report == [{"path": "ants/pipe.jpg", "reason": "not a regular file"}]


@pytest.mark.parametrize(("field", "value"), [("image_size", -5), ("image_size", 0), ("num_samples", -1)])
def test_manifest_numbers_out_of_range(field: str, value: int, tmp_path: Path, packed: Path,
                                       capsys: pytest.CaptureFixture) -> None:
    copy = copy_dataset(packed, tmp_path / "copy")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest[field] = value
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, err = cli(["verify", str(copy)], capsys)
    assert code == 2 and one_line(err) and field in err, err


def test_two_packs_into_one_directory_do_not_mix(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import fcntl

    write_corpus(tmp_path / "src", per_class=1)
    out = tmp_path / "out"
    out.mkdir()
    lock = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running pack holds it
        code, err = cli(["pack", str(tmp_path / "src"), str(out), "--size", "8", "--no-progress"], capsys)
    finally:
        os.close(lock)
    assert code == 2 and one_line(err) and "another pack" in err, err
    assert main(["pack", str(tmp_path / "src"), str(out), "--size", "8", "--no-progress"]) == 0


def test_the_wait_for_a_manifest_ends_when_the_owned_stager_is_gone(tmp_path: Path) -> None:
    """The cheap sibling of the test below: no heartbeat file, a child already gone -> at once, with its reason."""
    from workloads.data.api import DataUnavailableError, wait_for_manifest

    looks: list[int] = []

    def gone() -> str:
        looks.append(1)
        return "the stager exited with 2 (x)"

    with pytest.raises(DataUnavailableError, match=r"manifest.json: not written: the stager exited with 2 \(x\)$"):
        wait_for_manifest(tmp_path, 300, owned=gone)
    assert len(looks) == 1  # at its first look, not after polling toward the 300 s deadline
    (tmp_path / "manifest.json").write_text("{}")  # written before it exited (a copy's last step): no error
    assert wait_for_manifest(tmp_path, 300, owned=lambda: "the stager exited with 0")


@pytest.mark.slow
def test_open_with_a_remote_whose_stager_exits_fails_within_seconds_with_its_error(tmp_path: Path,
                                                                                   s3_url: str) -> None:
    """PackedData.open watches the stager child it started, not a heartbeat file that child never writes: a bucket
    that does not exist ends the wait as soon as the stager exits, with the stager's own last line."""
    from workloads.data.api import DataUnavailableError, PackedData

    with pytest.raises(DataUnavailableError) as caught:  # the 300 s deadline's error says "did not appear"
        PackedData.open(tmp_path / "data", batch_size=2, remote="s3://nosuchbucket/x", endpoint_url=s3_url,
                        wait_for_data_s=300)
    text = str(caught.value)
    assert text.startswith(f"{tmp_path / 'data' / 'manifest.json'}: not written: the stager exited with "), text
    assert "nosuchbucket" in text or "NoSuchBucket" in text, text


def test_a_second_stager_into_one_folder_is_refused_with_one_line(tmp_path: Path, packed: Path, s3_url: str,
                                                                   bucket: str, capsys: pytest.CaptureFixture) -> None:
    """Two stagers sharing a cache folder raced (readers failed in 2 of 3 tries): the second is refused while the
    first holds the folder's lock (a flock: another process's, or another open of it as here), and runs after."""
    import fcntl

    upload(make_client(s3_url, 4), packed, S3Uri(bucket, "one"), UploadOptions(workers=2, progress=False))
    dest = tmp_path / "dest"
    dest.mkdir()
    argv = ["stage", f"s3://{bucket}/one", str(dest), "--endpoint-url", s3_url, "--no-progress"]
    first = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running stager holds
        code, err = cli(argv, capsys)
        assert code == 2 and one_line(err), err
        assert err == f"error: {dest}: another stager is staging into this folder (one stager per folder: two would " \
                      "evict and publish each other's shards)\n"
        assert list(dest.iterdir()) == []  # it wrote nothing
    finally:
        os.close(first)
    code, err = cli(argv, capsys)
    assert code == 0, err
    assert (dest / "manifest.json").is_file()
