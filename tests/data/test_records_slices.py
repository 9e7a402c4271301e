"""Records packed from tables in slices (pack-tables): the same bytes for any slice count, a killed slice rerun,
the map hook, bounded memory."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from workloads.data.format.records import FieldSpec
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.upload import ShardStream, StreamOptions
from workloads.data.writing.maphook import load_map
from workloads.data.writing.records_slices import TablePackOptions, pack_table_slice, pack_tables, publish_tables
from workloads.data.writing.tables import TableSource

ROOT = Path(__file__).resolve().parents[2]
FIELDS = (FieldSpec(name="image", type="image"), FieldSpec(name="caption", type="text"),
          FieldSpec(name="n", type="int"))
HOOK = '''
import os, time

def upper(record):
    if record["n"] % 11 == 0:
        return None                      # filtered
    if record["n"] % 13 == 5:
        raise ValueError(f"no thirteens ({record['n']})")
    if record["n"] == int(os.environ.get("HOOK_STALL_AT", "-1")):
        open(os.environ["HOOK_MARK"], "w").close()
        time.sleep(60)                   # the test kills the slice here, mid-shard
    return {"image": record["image"], "caption": record["caption"].upper(), "n": record["n"]}
'''


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=85)
    return out.getvalue()


def _rows(table: int, count: int) -> dict[str, list]:
    keys, captions, numbers = [], [], []
    for row in range(count):
        n = table * 1000 + row
        # Most rows name an image in the bucket; some a missing one, some one that is not an image.
        key = f"img/{n % 9}.jpg" if row % 10 not in (3, 7) else ("img/missing.jpg" if row % 10 == 3 else "img/bad.jpg")
        keys.append(key)
        captions.append(f"caption {n}")
        numbers.append(n)
    return {"image": keys, "caption": captions, "n": numbers}


@pytest.fixture
def corpus(s3_url: str, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    client = make_client(s3_url, 8, botocore_attempts=3)
    for k in range(9):
        client.put_object(Bucket=bucket, Key=f"data/img/{k}.jpg", Body=_jpeg(k))
    client.put_object(Bucket=bucket, Key="data/img/bad.jpg", Body=b"not a jpeg at all")
    for table in range(12):  # 12 Parquet files of 13-25 rows in row groups of 6
        buffer = io.BytesIO()
        pq.write_table(pa.table(_rows(table, 13 + table)), buffer, row_group_size=6)
        client.put_object(Bucket=bucket, Key=f"data/t{table:02d}.parquet", Body=buffer.getvalue())
    for table in range(2):  # and Arrow IPC, file and stream format
        buffer = io.BytesIO()
        data = pa.table(_rows(20 + table, 17))
        writer = (pa.ipc.new_file if table == 0 else pa.ipc.new_stream)(buffer, data.schema)
        for batch in data.to_batches(max_chunksize=5):
            writer.write_batch(batch)
        writer.close()
        client.put_object(Bucket=bucket, Key=f"data/z{table}.arrow", Body=buffer.getvalue())
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "mixhook.py").write_text(HOOK)
    monkeypatch.syspath_prepend(str(hooks))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(hooks), str(ROOT)]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_url)
    return {"client": client, "bucket": bucket, "src": f"s3://{bucket}/data", "url": s3_url, "hooks": hooks}


def _objects(client, bucket: str, prefix: str) -> dict[str, bytes]:
    found = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for item in page.get("Contents", []):
            name = item["Key"][len(prefix) + 1:]
            if name.startswith("shard-") or name == "manifest.json":
                found[name] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


def _stream(url: str, target: S3Uri) -> ShardStream:
    return ShardStream(make_client(url, 8, botocore_attempts=3), target, StreamOptions(progress=False))


@pytest.mark.slow  # 1, 2 and 3 slices against moto; test_pack_slices keeps sliced == local in make test
def test_any_slice_count_gives_the_same_shards_and_manifest_as_a_local_pack(corpus: dict, tmp_path: Path) -> None:
    client, bucket, url = corpus["client"], corpus["bucket"], corpus["url"]
    hook = load_map("mixhook:upper")
    options = TablePackOptions(fields=FIELDS, shard_rows=40, image_columns=("image",), workers=4)
    source = TableSource(corpus["src"], client)
    local = pack_tables(source, tmp_path / "local", options, hook, client)
    expected = {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir() if p.name != "pack-report.json"}
    manifest = json.loads(expected["manifest.json"])
    assert manifest["map_hook"] == {"name": "mixhook:upper", "sha256": hook.sha256}
    reasons = [item["reason"] for item in local.skipped]
    assert any("not found" in r for r in reasons) and any(r.startswith("image:") for r in reasons)
    assert any(r.startswith("map: ValueError: no thirteens") for r in reasons) and local.filtered > 0
    total_rows = sum(13 + t for t in range(12)) + 2 * 17
    assert manifest["num_samples"] + len(local.skipped) + local.filtered == total_rows
    for count in (1, 2, 3):
        target = S3Uri(bucket, f"out/n{count}")
        for index in range(count):
            pack_table_slice(client, source, target, options, hook, index, count, tmp_path, _stream(url, target))
        publish_tables(client, source, target, options, hook, _stream(url, target))
        assert _objects(client, bucket, f"out/n{count}") == expected, count
    captions = [json.loads(expected["manifest.json"])["num_samples"]]
    assert captions[0] > 0


@pytest.mark.slow  # three CLI runs against moto; test_pack_slices keeps the killed-slice rerun in make test
def test_a_slice_killed_mid_shard_and_rerun_changes_nothing(corpus: dict, tmp_path: Path) -> None:
    client, bucket, url = corpus["client"], corpus["bucket"], corpus["url"]
    fields = tmp_path / "fields.json"
    fields.write_text(json.dumps([spec.model_dump(exclude_none=True) for spec in FIELDS]))
    command = [sys.executable, "-m", "workloads.data", "pack-tables", corpus["src"], f"s3://{bucket}/out/killed",
               "--fields", str(fields), "--map", "mixhook:upper", "--image-column", "image", "--shard-rows", "40",
               "--endpoint-url", url, "--no-progress", "--shard-count", "1", "--shard-index", "0",
               "--scratch", str(tmp_path)]
    mark = tmp_path / "stalled"
    env = {**os.environ, "HOOK_STALL_AT": "6004", "HOOK_MARK": str(mark)}  # table 6 lies in shard 2 of 7
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not mark.exists():
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    before = _objects(client, bucket, "out/killed")
    assert "manifest.json" not in before and before  # shards done before the kill are in; nothing published
    rerun = subprocess.run(command, env=dict(os.environ), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "already complete" in rerun.stdout and " 0 already complete" not in rerun.stdout
    publish = subprocess.run(command[:-6] + ["--publish"], capture_output=True, text=True, timeout=300)
    assert publish.returncode == 0, publish.stdout + publish.stderr
    source = TableSource(corpus["src"], client)
    reference = S3Uri(bucket, "out/reference")
    options = TablePackOptions(fields=FIELDS, shard_rows=40, image_columns=("image",), workers=4)
    hook = load_map("mixhook:upper")
    pack_table_slice(client, source, reference, options, hook, 0, 1, tmp_path, _stream(url, reference))
    publish_tables(client, source, reference, options, hook, _stream(url, reference))
    assert _objects(client, bucket, "out/killed") == _objects(client, bucket, "out/reference")


def test_jsonl_npy_and_local_arrow_tables_and_strict(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.jsonl").write_text('{"text": "one", "n": 1}\n\n{"text": "two", "n": 2}\n[1, 2]\n{"text": "x"')
    np.save(src / "b.npy", np.arange(12, dtype=np.int32).reshape(4, 3))
    rows = pa.table({"text": ["x", "y", "z"], "n": [7, 8, 9]})
    with pa.ipc.new_file(str(src / "c.arrow"), rows.schema) as writer:  # local: memory-mapped, batches of 2
        for batch in rows.to_batches(max_chunksize=2):
            writer.write_batch(batch)
    options = TablePackOptions(fields=(FieldSpec(name="text", type="text"), FieldSpec(name="n", type="int")),
                               shard_rows=2)
    hook_dir = tmp_path / "hooks"
    hook_dir.mkdir()
    (hook_dir / "npyhook.py").write_text("def rows(record):\n    if 'value' in record:\n"
                                         "        return {'text': 'row', 'n': int(record['value'].sum())}\n"
                                         "    return record\n")
    sys.path.insert(0, str(hook_dir))
    try:
        result = pack_tables(TableSource(str(src)), tmp_path / "out", options, load_map("npyhook:rows"))
    finally:
        sys.path.remove(str(hook_dir))
    assert result.manifest.num_samples == 2 + 4 + 3
    assert sorted(item["reason"].split(":")[0] for item in result.skipped) == ["a JSON list, not an object",
                                                                                "not JSON"]
    from workloads.data.format.errors import DataToolError
    with pytest.raises(DataToolError, match=r"a\.jsonl#2: a JSON list, not an object"):
        pack_tables(TableSource(str(src)), tmp_path / "strict", TablePackOptions(
            fields=options.fields, shard_rows=2, strict=True), None)


@pytest.mark.slow
def test_peak_memory_of_a_slice_stays_bounded_when_one_table_is_ten_times_larger(tmp_path: Path) -> None:
    """Prints the figures: the packer's peak RSS (a local pack: the row path of every slice) with 12 equal tables
    and with one of them 10x larger."""
    peaks = {}
    fields = tmp_path / "fields.json"
    fields.write_text(json.dumps([{"name": "text", "type": "text"}, {"name": "n", "type": "int"}]))
    for case, big in (("equal", 1), ("one 10x", 10)):
        src = tmp_path / case.replace(" ", "")
        src.mkdir()
        rng = np.random.default_rng(0)
        for table in range(12):
            rows = 4000 * (big if table == 5 else 1)
            text = [rng.bytes(500).hex() for _ in range(rows)]  # 1000 distinct characters a row: no dictionary
            pq.write_table(pa.table({"text": text, "n": list(range(rows))}), src / f"t{table:02d}.parquet",
                           row_group_size=1000, compression="none")
        # VmHWM, the peak of this process's own memory: ru_maxrss would carry the forking parent's peak over exec.
        command = [sys.executable, "-c", "import sys; sys.argv = sys.argv[1:]; "
                   "from workloads.data.__main__ import main; code = main(); "
                   "print('peak', next(line.split()[1] for line in open('/proc/self/status') "
                   "if line.startswith('VmHWM'))); sys.exit(code)",
                   "x", "pack-tables", str(src), str(tmp_path / f"out-{case}"), "--fields", str(fields),
                   "--shard-rows", "2000", "--no-progress"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, done.stderr
        peaks[case] = int(done.stdout.split("peak")[-1]) >> 10
        size = sum(p.stat().st_size for p in src.iterdir()) >> 20
        print(f"{case}: tables {size} MiB, largest {max(p.stat().st_size for p in src.iterdir()) >> 20} MiB, "
              f"peak RSS {peaks[case]} MiB")
    assert peaks["one 10x"] < 1.15 * peaks["equal"]  # the big table is read a row group at a time
