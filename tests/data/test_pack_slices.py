"""pack SRC s3://DEST in slices (an Indexed Job's pods, here processes) and the publish step, on a real moto server.

The bar: for any N, and after a slice killed and rerun, the objects at DEST are byte for byte what a one-machine
pack of the same images writes, and nothing else is left at DEST.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.netem import LatencyProxy
from tests.data.helpers import write_corpus
from tests.data.test_pack_s3 import put_tree, write_odd_corpus
from tests.data.test_pack_upload import cli, one_line
from workloads.data.format.manifest import MANIFEST_NAME, load_manifest
from workloads.data.moving.metrics import PackMetrics
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import ShardStream, StreamOptions
from workloads.data.writing.pack import REPORT_NAME, PackOptions, pack
from workloads.data.writing.shardplan import plan_shards
from workloads.data.writing.slices import RECORDS_DIR, make_plan, owned, pack_slice, publish

REPO = Path(__file__).resolve().parents[2]
OPTIONS = ["--size", "16", "--shard-size", "2500B", "--workers", "1", "--no-progress"]  # 3 images a shard


def objects(s3_url: str, bucket: str, prefix: str) -> dict[str, bytes]:
    """Every object under the prefix, by its name below it."""
    client = make_client(s3_url, 4)
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        for item in page.get("Contents", []):
            found[item["Key"][len(prefix) + 1:]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


def local_dataset(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if not p.name.startswith(".")}


def run_pack(args: list[str], s3_url: str, index: int | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if index is not None:
        env["JOB_COMPLETION_INDEX"] = str(index)
    return subprocess.Popen([sys.executable, "-m", "workloads.data", "pack", *args, "--endpoint-url", s3_url],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen[str]) -> str:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    return out


def test_plan_boundaries_do_not_depend_on_what_decodes() -> None:
    files = [(f"c/{i}.jpg", 0) for i in range(10)]
    assert plan_shards(files, {}, "decoded", 16, 2500) == [0, 3, 6, 9]
    sizes = {rel: 400 for rel, _ in files} | {"c/4.jpg": 5000}
    assert plan_shards(files, sizes, "encoded", 16, 1000) == [0, 2, 4, 5, 7, 9]
    assert [list(owned(4, i, 3)) for i in range(3)] == [[0], [1], [2, 3]]
    assert [list(owned(2, i, 3)) for i in range(3)] == [[], [0], [1]]


@pytest.mark.slow
def test_any_number_of_slice_processes_gives_the_one_machine_pack(tmp_path: Path, s3_url: str, bucket: str,
                                                                  aws_env: None) -> None:
    write_odd_corpus(tmp_path / "src")
    write_corpus(tmp_path / "src", per_class=5)
    put_tree(s3_url, bucket, "raw", tmp_path / "src")
    local = pack(tmp_path / "src", tmp_path / "local", PackOptions(image_size=16, shard_bytes=2500, workers=1,
                                                                   progress=False))
    expected = local_dataset(tmp_path / "local")
    assert len(local.manifest.shards) == 7 and len(local.skipped) == 4
    for count in (1, 2, 3):
        dest = f"s3://{bucket}/packed-{count}"
        slices = [run_pack([f"s3://{bucket}/raw", dest, *OPTIONS, "--shard-count", str(count)], s3_url, index)
                  for index in range(count)]
        outputs = [finished(process) for process in slices]
        assert all(f"slice {i} of {count}: shards " in out for i, out in enumerate(outputs)), outputs
        assert MANIFEST_NAME not in objects(s3_url, bucket, f"packed-{count}")  # nothing published yet
        out = finished(run_pack([f"s3://{bucket}/raw", dest, *OPTIONS, "--publish"], s3_url))
        assert out.startswith(f"published {local.manifest.num_samples} samples in 7 shards (decoded) at {dest}")
        assert objects(s3_url, bucket, f"packed-{count}") == expected, count


def test_slices_in_process_equal_a_local_pack_encoded(tmp_path: Path, s3_url: str, bucket: str) -> None:
    write_odd_corpus(tmp_path / "src")
    options = PackOptions(layout="encoded", shard_bytes=3000, workers=1, progress=False)
    pack(tmp_path / "src", tmp_path / "local", options)
    client = make_client(s3_url, 8)
    target = S3Uri(bucket, "enc")
    seen = 0
    for index in (2, 0, 1):
        metrics = PackMetrics()
        done = pack_slice(client, tmp_path / "src", target, options, index, 3, tmp_path,
                          ShardStream(client, target, StreamOptions(progress=False)), metrics)
        assert metrics.shards_done._value.get() == metrics.shards._value.get() == len(done.shards)
        seen += int(metrics.images._value.get())
    assert seen == len(make_plan(tmp_path / "src", options).files)
    publish(client, tmp_path / "src", target, options, ShardStream(client, target, StreamOptions(progress=False)))
    assert objects(s3_url, bucket, "enc") == local_dataset(tmp_path / "local")


def test_publish_waits_for_every_slice_and_keeps_the_old_dataset(tmp_path: Path, s3_url: str, bucket: str,
                                                                 capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "old", per_class=3, seed=1)
    write_corpus(tmp_path / "new", per_class=4, seed=2)
    dest = f"s3://{bucket}/set"
    common = [*OPTIONS, "--endpoint-url", s3_url]
    assert cli(["pack", tmp_path / "old", dest, *common], capsys)[0] == 0
    old = objects(s3_url, bucket, "set")
    code, out, err = cli(["pack", tmp_path / "new", dest, *common, "--shard-count", "2", "--shard-index", "1"],
                         capsys)
    assert code == 0 and out.startswith("slice 1 of 2: shards 1..2 into"), err
    # Slice 1's shards never take a name the published manifest uses for other bytes.
    now = objects(s3_url, bucket, "set")
    assert all(now[name] == data for name, data in old.items())
    assert {"shard-00001-r1.h5", "shard-00002.h5"} <= set(now)
    code, _, err = cli(["pack", tmp_path / "new", dest, *common, "--publish"], capsys)
    assert code == 1 and one_line(err), err
    assert err.startswith(f"error: {dest}: 1 of 3 shards are not packed yet (shard 0, from ")
    assert objects(s3_url, bucket, "set")[MANIFEST_NAME] == old[MANIFEST_NAME]
    assert cli(["pack", tmp_path / "new", dest, *common, "--shard-count", "2", "--shard-index", "0"], capsys)[0] == 0
    code, out, err = cli(["pack", tmp_path / "new", dest, *common, "--publish"], capsys)
    assert code == 0 and "removed 2 stale shards of a previous pack" in out, err
    pack(tmp_path / "new", tmp_path / "local", PackOptions(image_size=16, shard_bytes=2500, workers=1,
                                                           progress=False))
    final = objects(s3_url, bucket, "set")
    manifest = load_manifest(tmp_path / "local")
    assert [final[shard.path] for shard in load_manifest_bytes(final[MANIFEST_NAME]).shards] == \
        [(tmp_path / "local" / shard.path).read_bytes() for shard in manifest.shards]
    assert set(final) == {MANIFEST_NAME, REPORT_NAME, "shard-00000-r1.h5", "shard-00001-r1.h5", "shard-00002.h5"}


def load_manifest_bytes(payload: bytes):  # noqa: ANN201
    from workloads.data.format.manifest import Manifest

    return Manifest.model_validate_json(payload)


def test_a_slice_killed_mid_shard_and_rerun_gives_the_same_bytes_and_no_orphans(
        tmp_path: Path, s3_url: str, bucket: str, moto_port: int, aws_env: None) -> None:
    write_corpus(tmp_path / "src", per_class=9)
    options = PackOptions(image_size=16, shard_bytes=2500, workers=1, progress=False)
    pack(tmp_path / "src", tmp_path / "local", options)
    dest = S3Uri(bucket, "killed")
    plan = make_plan(tmp_path / "src", options)
    with LatencyProxy(moto_port, latency_ms=150) as proxy:  # every request slow: the kill lands mid-slice
        process = run_pack([str(tmp_path / "src"), str(dest), *OPTIONS, "--shard-count", "1"],
                           f"http://127.0.0.1:{proxy.port}", index=0)
        client = make_client(s3_url, 4)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            records = client.list_objects_v2(Bucket=bucket, Prefix=dest.key(RECORDS_DIR)).get("KeyCount", 0)
            if records >= 2:
                break
            time.sleep(0.05)
        assert process.poll() is None, "the slice finished before it could be killed"
        process.send_signal(signal.SIGKILL)
        process.communicate()
    before = objects(s3_url, bucket, "killed")
    assert MANIFEST_NAME not in before and 2 <= sum(name.startswith(RECORDS_DIR) for name in before) < 6
    # What a kill during a multipart upload leaves (these shards are too small for one): an upload left open.
    client.create_multipart_upload(Bucket=bucket, Key=dest.key("shard-00005.h5"))
    stream = ShardStream(client, dest, StreamOptions(progress=False))
    again = pack_slice(client, tmp_path / "src", dest, options, 0, 1, tmp_path, stream)
    assert again.reused and again.packed and sorted(again.reused + again.packed) == list(range(len(plan.starts)))
    assert again.aborted_uploads == 1
    publish(client, tmp_path / "src", dest, options, ShardStream(client, dest, StreamOptions(progress=False)))
    assert objects(s3_url, bucket, "killed") == local_dataset(tmp_path / "local")
    assert client.list_multipart_uploads(Bucket=bucket, Prefix="killed/").get("Uploads", []) == []


@pytest.mark.parametrize(("flags", "where", "why"), [
    (["--shard-count", "2", "--shard-index", "2"], "--shard-index", "2 is not in 0..1 (--shard-count 2)"),
    (["--shard-count", "2"], "--shard-index", "not given and $JOB_COMPLETION_INDEX is not set"),
    (["--shard-index", "0"], "--shard-index", "only meaningful with --shard-count"),
    (["--publish", "--shard-count", "2"], "--publish", "a step of its own"),
    (["--upload", "s3://b/p"], "--upload", "only for a local OUT"),
])
def test_bad_slice_arguments_are_one_line(flags: list[str], where: str, why: str, tmp_path: Path, s3_url: str,
                                          bucket: str, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv("JOB_COMPLETION_INDEX", raising=False)
    write_corpus(tmp_path / "src", per_class=2)
    code, _, err = cli(["pack", tmp_path / "src", f"s3://{bucket}/x", *OPTIONS, "--endpoint-url", s3_url, *flags],
                       capsys)
    assert code == 2 and one_line(err) and err.startswith(f"error: {where}: ") and why in err, err
    code, _, err = cli(["pack", tmp_path / "src", tmp_path / "out", *OPTIONS, "--shard-count", "2"], capsys)
    assert (code, err) == (2, "error: --shard-count: only meaningful with an s3:// OUT\n")
    code, _, err = cli(["pack", tmp_path / "src", tmp_path / "out", *OPTIONS, "--metrics-port", "9449"], capsys)
    assert (code, err) == (2, "error: --metrics-port: only meaningful with an s3:// OUT\n")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "one")
    code, _, err = cli(["pack", tmp_path / "src", f"s3://{bucket}/x", *OPTIONS, "--endpoint-url", s3_url,
                        "--shard-count", "2"], capsys)
    assert (code, err) == (2, "error: JOB_COMPLETION_INDEX: not an integer: 'one'\n")
    assert objects(s3_url, bucket, "x") == {}


def test_a_failing_slice_names_its_shards_and_inputs(tmp_path: Path, s3_url: str, bucket: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    write_corpus(tmp_path / "src", per_class=3)
    (tmp_path / "src" / "bees" / "001.jpg").write_bytes((tmp_path / "src" / "bees" / "001.jpg").read_bytes()[:300])
    plan = make_plan(tmp_path / "src", PackOptions(image_size=16, shard_bytes=2500, workers=1, strict=True))
    [index] = [i for i in range(2) if any(rel == "bees/001.jpg" for shard in owned(len(plan.starts), i, 2)
                                          for rel, _ in plan.inputs(shard))]
    code, _, err = cli(["pack", tmp_path / "src", f"s3://{bucket}/x", *OPTIONS, "--endpoint-url", s3_url,
                        "--strict", "--shard-count", "2", "--shard-index", str(index)], capsys)
    mine = owned(len(plan.starts), index, 2)
    first, last = plan.inputs(mine[0])[0][0], plan.inputs(mine[-1])[-1][0]
    assert code == 2 and one_line(err), err
    assert err.startswith(f"error: {tmp_path / 'src' / 'bees' / '001.jpg'}: corrupt image"), err
    assert err.endswith(f" [slice {index} of 2: shards {mine[0]}..{mine[-1]}, inputs {first} .. {last}]\n"), err
