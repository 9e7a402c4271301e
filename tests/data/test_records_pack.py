"""The records packers: image + caption tables (JSONL, CSV, Parquet; local and s3:// against moto) and pre-tokenized
corpora (the packing rule, exactly), through the CLI; every bad row or file is counted and named."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from workloads.data.__main__ import main
from workloads.data.api import open_dataset
from workloads.data.format.jpeg import decode_bytes
from workloads.data.format.manifest import load_manifest
from workloads.data.moving.s3 import make_client


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (24, 30, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


GOOD = [(f"img/{index:02d}.jpg", f"a photo of thing {index} — naïve", str(index * 7)) for index in range(6)]


def write_pairs(root: Path) -> list[bytes]:
    """Six good images and the bad rows of a caption table; returns the good images' bytes."""
    (root / "img").mkdir(parents=True)
    images = [_jpeg(index) for index in range(len(GOOD))]
    for (key, _, _), payload in zip(GOOD, images, strict=True):
        (root / key).write_bytes(payload)
    (root / "img" / "broken.jpg").write_bytes(images[0][:100])
    (root / "outside.jpg").write_bytes(images[0])
    (root / "img" / "link.jpg").symlink_to("/etc/hostname")
    return images


LATIN_1 = "caption: text is not UTF-8 (an undecodable byte or a lone surrogate at character 3)"
BAD_KEYS = {"img/missing.jpg": "image img/missing.jpg: unreadable", "img/broken.jpg": "image img/broken.jpg: corrupt",
            "../outside.jpg": "key: must be a path relative", "img/link.jpg": "key: a link out of the table's folder"}


def write_jsonl(root: Path) -> Path:
    lines = [json.dumps({"key": key, "caption": caption, "source": "web", "likes": int(likes)}).encode()
             for key, caption, likes in GOOD]
    lines += [json.dumps({"key": key, "caption": "x", "source": "web", "likes": 1}).encode() for key in BAD_KEYS]
    lines.append(b'{"key": "img/00.jpg", "caption": "caf\xe9", "source": "web", "likes": 1}')  # Latin-1, not UTF-8
    lines.append(b'{"key": "img/01.jpg", "source": "web", "likes": 1}')
    lines.append(b'["not", "an", "object"]')
    lines.append(b'{"key": "img/02.jpg", "caption": "x", "source": "web", "likes": "many"}')
    table = root / "pairs.jsonl"
    table.write_bytes(b"\n".join(lines) + b"\n")
    return table


def write_csv(root: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["key", "caption", "source", "likes"])
    for key, caption, likes in GOOD:
        writer.writerow([key, caption, "web", likes])
    for key in BAD_KEYS:
        writer.writerow([key, "x", "web", "1"])
    table = root / "pairs.csv"
    table.write_bytes(buffer.getvalue().encode() + b"img/00.jpg,caf\xe9,web,1\nimg/01.jpg,too,few\n")
    return table


def check_pairs(out: Path, images: list[bytes]) -> None:
    manifest = load_manifest(out)
    assert [(spec.name, spec.type) for spec in manifest.fields or []] == [
        ("image", "image"), ("caption", "text"), ("source", "text"), ("likes", "int")]
    dataset = open_dataset(out, image_size=16)
    batch = dataset.__getitems__(list(range(len(dataset))))
    got = sorted(zip(batch["caption"], batch["likes"].tolist(), batch["source"], batch["image"].numpy(),
                     strict=True), key=lambda row: row[1])
    assert [(caption, likes, source) for caption, likes, source, _ in got] == [
        (caption, int(likes), "web") for _, caption, likes in GOOD]
    for (_, _, _, pixels), payload in zip(got, images, strict=True):
        np.testing.assert_array_equal(pixels, decode_bytes(payload, 16))


def test_captions_from_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    images = write_pairs(tmp_path / "src")
    table = write_jsonl(tmp_path / "src")
    out = tmp_path / "out"
    code, stdout, err = cli(["pack-captions", str(table), str(out), "--int", "likes", "--workers", "2",
                             "--shard-size", "2KiB", "--no-progress"], capsys)
    assert (code, err) == (0, "")
    assert stdout.startswith("packed 6 records (image:image, caption:text, source:text, likes:int) in ")
    assert "skipped 8" in stdout
    check_pairs(out, images)
    manifest = load_manifest(out)
    assert manifest.skipped == 8 and len(manifest.shards) > 1
    skipped = json.loads((out / "pack-report.json").read_text())["skipped"]
    reasons = {item["path"]: item["reason"] for item in skipped}
    for key, why in BAD_KEYS.items():
        assert any(path.endswith(f"({key!r})") and reason.startswith(why) for path, reason in reasons.items()), key
    assert reasons["line 11 ('img/00.jpg')"] == LATIN_1
    assert reasons["line 12 ('img/01.jpg')"] == "caption: missing"
    assert reasons["line 13"] == "not a JSON object"
    assert reasons["line 14 ('img/02.jpg')"] == "likes: not an integer: 'many'"
    code, _, _ = cli(["verify", str(out)], capsys)
    assert code == 0


def test_captions_from_csv_and_strict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    images = write_pairs(tmp_path / "src")
    table = write_csv(tmp_path / "src")
    out = tmp_path / "out"
    code, stdout, err = cli(["pack-captions", str(table), str(out), "--int", "likes", "--workers", "1",
                             "--no-progress"], capsys)
    assert (code, err) == (0, "") and "skipped 6" in stdout
    check_pairs(out, images)
    reasons = {item["path"]: item["reason"] for item in json.loads((out / "pack-report.json").read_text())["skipped"]}
    assert reasons["line 13"] == "3 columns, the header has 4"
    assert reasons["line 12 ('img/00.jpg')"] == LATIN_1
    code, _, err = cli(["pack-captions", str(table), str(tmp_path / "strict"), "--int", "likes", "--strict",
                        "--no-shuffle", "--no-progress"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {table}: line 8 ('img/missing.jpg'): image img/missing.jpg: unreadable")
    assert not (tmp_path / "strict" / "manifest.json").exists()
    code, _, err = cli(["pack-captions", str(table), str(tmp_path / "x"), "--int", "nope"], capsys)
    assert (code, err) == (2, "error: --int: nope: not an extra column of the table (source, likes)\n")
    code, _, err = cli(["pack-captions", str(table), str(tmp_path / "x"), "--fetch-workers", "4"], capsys)
    assert (code, err) == (2, "error: --fetch-workers: only meaningful with an s3:// TABLE\n")


def test_captions_from_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa = pytest.importorskip("pyarrow")  # a dependency of the train extra (make setup installs it)
    pq = pytest.importorskip("pyarrow.parquet")
    images = write_pairs(tmp_path / "src")
    table = tmp_path / "src" / "pairs.parquet"
    pq.write_table(pa.table({"key": [key for key, _, _ in GOOD], "caption": [c for _, c, _ in GOOD],
                             "source": ["web"] * len(GOOD), "likes": [int(n) for _, _, n in GOOD]}), table)
    code, _, err = cli(["pack-captions", str(table), str(tmp_path / "out"), "--int", "likes", "--no-progress"],
                       capsys)
    assert (code, err) == (0, "")
    check_pairs(tmp_path / "out", images)


def test_parquet_without_pyarrow_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    write_pairs(tmp_path / "src")
    table = tmp_path / "src" / "pairs.parquet"
    table.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError, as where it is missing
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    code, _, err = cli(["pack-captions", str(table), str(tmp_path / "out")], capsys)
    assert (code, err) == (2, f"error: {table}: reading Parquet needs pyarrow (pip install pyarrow), or give "
                              "JSONL or CSV\n")


def test_captions_from_a_bucket_pack_like_the_local_table(tmp_path: Path, s3_url: str, bucket: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    write_pairs(src)
    (src / "img" / "link.jpg").unlink()  # a bucket has no links; the row is then a missing object
    table = write_jsonl(src)
    client = make_client(s3_url, 4)
    for path in [table, *sorted((src / "img").iterdir())]:
        client.put_object(Bucket=bucket, Key=f"sets/pairs/{path.relative_to(src).as_posix()}", Body=path.read_bytes())
    common = ["--int", "likes", "--workers", "1", "--shard-size", "2KiB", "--no-progress"]
    code, _, err = cli(["pack-captions", f"s3://{bucket}/sets/pairs/pairs.jsonl", str(tmp_path / "remote"),
                        "--endpoint-url", s3_url, "--fetch-workers", "4", *common], capsys)
    assert (code, err) == (0, "")
    code, _, err = cli(["pack-captions", str(table), str(tmp_path / "local"), *common], capsys)
    assert (code, err) == (0, "")
    remote, local = load_manifest(tmp_path / "remote"), load_manifest(tmp_path / "local")
    assert [shard.sha256 for shard in remote.shards] == [shard.sha256 for shard in local.shards]
    reasons = {item["path"]: item["reason"]
               for item in json.loads((tmp_path / "remote" / "pack-report.json").read_text())["skipped"]}
    assert reasons["line 10 ('img/link.jpg')"] == "image img/link.jpg: unreadable: object not found"
    code, _, err = cli(["pack-captions", f"s3://{bucket}/sets/nothing.jsonl", str(tmp_path / "none"),
                        "--endpoint-url", s3_url], capsys)
    assert (code, err) == (2, f"error: s3://{bucket}/sets/nothing.jsonl: caption table not found\n")


# -- tokens -------------------------------------------------------------------------------------------------------

def test_tokens_packing_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "corpus"
    (src / "b").mkdir(parents=True)
    documents = {"a.npy": np.arange(0, 7, dtype=np.int64), "b/c.npy": np.arange(100, 111, dtype=np.uint16),
                 "b/d.npy": np.arange(200, 205, dtype=np.int32), "e.npy": np.array([], dtype=np.int32)}
    for name, ids in documents.items():
        np.save(src / name, ids)
    np.save(src / "float.npy", np.ones(4, dtype=np.float32))
    np.save(src / "matrix.npy", np.ones((2, 2), dtype=np.int32))
    np.save(src / "huge.npy", np.array([1, 70_000], dtype=np.int64))
    np.save(src / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (src / "garbage.npy").write_bytes(b"\x93NUMPY nonsense")
    out = tmp_path / "out"
    code, stdout, err = cli(["pack-tokens", str(src), str(out), "--seq-len", "4", "--eos", "9", "--shard-size",
                             "1KiB", "--no-progress"], capsys)
    assert (code, err) == (0, "")
    # The rule: documents in sorted path order (a, b/c, b/d, e), each followed by eos 9, concatenated, cut into
    # sequences of 4; the tail that does not fill one is dropped.
    stream = np.concatenate([np.append(documents[name], 9) for name in ("a.npy", "b/c.npy", "b/d.npy", "e.npy")])
    expected = stream[: len(stream) // 4 * 4].reshape(-1, 4)
    assert stdout.endswith(f"; {len(stream)} tokens of 4 documents, dropped tail {len(stream) % 4}\n")
    dataset = open_dataset(out)
    got = dataset.__getitems__(list(range(len(dataset))))["tokens"].numpy()
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, expected.tolist()))
    assert got.tolist() != expected.tolist()  # stored in the seeded permutation
    report = json.loads((out / "pack-report.json").read_text())
    assert (report["sequences"], report["dropped_tail_tokens"], report["stream_tokens"]) == (
        len(expected), len(stream) % 4, len(stream))
    reasons = {item["path"]: item["reason"] for item in report["skipped"]}
    assert sorted(reasons) == ["float.npy", "garbage.npy", "huge.npy", "matrix.npy", "objects.npy"]
    assert reasons["float.npy"] == "float32 array of shape [4], expected 1-D integer token ids"
    assert reasons["huge.npy"] == "token ids 1..70000 do not fit uint16"
    assert reasons["objects.npy"].startswith("not a readable .npy array")
    assert load_manifest(out).skipped == 5
    code, _, err = cli(["pack-tokens", str(src), str(tmp_path / "strict"), "--seq-len", "4", "--strict"], capsys)
    assert (code, err) == (2, f"error: {src / 'float.npy'}: float32 array of shape [4], expected 1-D integer token "
                              "ids\n")
    code, _, err = cli(["pack-tokens", str(src), str(tmp_path / "x"), "--seq-len", "4", "--eos", "70000"], capsys)
    assert (code, err) == (2, "error: --eos: 70000 does not fit uint16\n")
    code, _, err = cli(["pack-tokens", str(src), str(tmp_path / "x"), "--seq-len", "1000"], capsys)
    assert code == 2 and err == (f"error: {src}: 23 usable token ids, fewer than one sequence of 1000 (5 files left "
                                 "out)\n")
    code, _, err = cli(["pack-tokens", str(src), str(tmp_path / "x")], capsys)
    assert code == 2 and "--seq-len" in err and err.count("\n") == 1


def test_the_peer_benchmark_gives_every_contender_the_sequences_pack_tokens_cuts(tmp_path: Path) -> None:
    from benchmarks.peers_records import SEQ_LEN, token_sequences, write_token_corpus
    from workloads.data.writing.records_pack import RecordPackOptions
    from workloads.data.writing.tokens import pack_tokens

    write_token_corpus(tmp_path / "corpus", 20_000)
    expected = token_sequences(tmp_path / "corpus")
    pack_tokens(tmp_path / "corpus", tmp_path / "out", RecordPackOptions(progress=False, shuffle_seed=None),
                seq_len=SEQ_LEN, dtype="uint16", eos=0)
    dataset = open_dataset(tmp_path / "out")
    got = dataset.__getitems__(list(range(len(dataset))))["tokens"].numpy()
    np.testing.assert_array_equal(got, expected.astype(np.int32))


def test_tokens_from_arrow_files_beside_npy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pa = pytest.importorskip("pyarrow")
    ipc = pytest.importorskip("pyarrow.ipc")
    src = tmp_path / "corpus"
    src.mkdir()
    np.save(src / "a.npy", np.arange(0, 5, dtype=np.int32))
    rows = [[10, 11, 12], None, [], [13, 14, 15, 16, 17]]  # a null row is a document of no ids
    table = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32())), "text": ["x", "y", "z", "w"]})
    with ipc.new_file(str(src / "b.arrow"), table.schema) as writer:  # the IPC file format
        writer.write_table(table)
    stream_rows = [[20, 21], [22, 23, 24]]
    streamed = pa.table({"input_ids": pa.array(stream_rows, type=pa.large_list(pa.uint16()))})
    with ipc.new_stream(str(src / "c.arrow"), streamed.schema) as writer:  # the stream format (HF datasets' cache)
        writer.write_table(streamed)
    with ipc.new_file(str(src / "floats.arrow"), pa.schema([("input_ids", pa.list_(pa.float32()))])) as writer:
        writer.write_table(pa.table({"input_ids": pa.array([[1.0]], type=pa.list_(pa.float32()))}))
    with ipc.new_file(str(src / "other.arrow"), pa.schema([("ids", pa.list_(pa.int64()))])) as writer:
        writer.write_table(pa.table({"ids": pa.array([[1, 2]], type=pa.list_(pa.int64()))}))
    with ipc.new_file(str(src / "wide.arrow"), pa.schema([("input_ids", pa.list_(pa.int64()))])) as writer:
        writer.write_table(pa.table({"input_ids": pa.array([[1], [70_000]], type=pa.list_(pa.int64()))}))
    (src / "garbage.arrow").write_bytes(b"ARROW1 not really")
    out = tmp_path / "out"
    code, stdout, err = cli(["pack-tokens", str(src), str(out), "--seq-len", "3", "--eos", "9", "--no-progress"],
                            capsys)
    assert (code, err) == (0, "")
    # sorted paths (a.npy, b.arrow, c.arrow, ...), an Arrow file's rows in order, each document then eos 9
    documents = [list(range(5)), *[row or [] for row in rows], *stream_rows, [1]]  # wide.arrow#0 fits, #1 not
    stream = np.concatenate([np.asarray(doc + [9], dtype=np.int64) for doc in documents])
    expected = stream[: len(stream) // 3 * 3].reshape(-1, 3)
    assert stdout.endswith(f"; {len(stream)} tokens of {len(documents)} documents, dropped tail {len(stream) % 3}\n")
    dataset = open_dataset(out)
    got = dataset.__getitems__(list(range(len(dataset))))["tokens"].numpy()
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, expected.tolist()))
    reasons = {item["path"]: item["reason"] for item in json.loads((out / "pack-report.json").read_text())["skipped"]}
    assert reasons["floats.arrow"] == "column 'input_ids' is list<item: float>, expected a list of integer token ids " \
                                      "per row"
    assert reasons["other.arrow"] == "no column 'input_ids' (columns: ids); name it with --arrow-column"
    assert reasons["wide.arrow#1"] == "token ids 70000..70000 do not fit uint16"
    assert reasons["garbage.arrow"].startswith("not a readable Arrow IPC file")
    code, stdout, err = cli(["pack-tokens", str(src), str(tmp_path / "named"), "--seq-len", "2", "--arrow-column",
                             "ids", "--no-shuffle", "--no-progress"], capsys)
    assert code == 0 and "other.arrow" not in {
        item["path"] for item in json.loads((tmp_path / "named" / "pack-report.json").read_text())["skipped"]}
