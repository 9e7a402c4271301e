"""Typed records: the schema, the packer's checks, the column-wise reader, datasets packed by earlier versions, and
hostile manifests and shards (each refused in one line naming the field)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from PIL import Image

from workloads.data.api import open_dataset
from workloads.data.format.errors import DataToolError
from workloads.data.format.jpeg import decode_bytes
from workloads.data.format.manifest import load_manifest, manifest_error
from workloads.data.format.records import FieldSpec, RecordError, encode_value
from workloads.data.format.verify import VerifyError, verify
from workloads.data.reading.dataset import DatasetError, HDF5Dataset
from workloads.data.reading.records_dataset import RecordsDataset, pad_sequences, records_to_tensors
from workloads.data.writing.records_pack import RecordPackOptions, pack_records
from workloads.train.loop import TrainConfig
from workloads.train.loop import open_dataset as train_dataset

FIXTURES = Path(__file__).parent / "fixtures"

FIELDS = [
    FieldSpec(name="image", type="image"),
    FieldSpec(name="caption", type="text"),
    FieldSpec(name="raw", type="bytes"),
    FieldSpec(name="label", type="int"),
    FieldSpec(name="emb", type="ndarray", dtype="float32", shape=(2, 3)),
    FieldSpec(name="seq", type="tokens", dtype="uint16", length=5),
    FieldSpec(name="doc", type="tokens", dtype="int32"),
]


def _jpeg(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def make_records(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Records with every field type; values chosen to catch truncation, sign and byte-order mistakes."""
    rng = np.random.default_rng(seed)
    return [{
        "image": _jpeg(rng.integers(0, 256, (16 + index, 20, 3), dtype=np.uint8)),
        "caption": f"sample {index}: café ☕ " + "x" * index,
        "raw": bytes(rng.integers(0, 256, index * 3, dtype=np.uint8)),
        "label": (-1) ** index * (1 << 40) + index,
        "emb": rng.standard_normal((2, 3)).astype(np.float32),
        "seq": rng.integers(0, 65536, 5).astype(np.uint16),
        "doc": rng.integers(-(1 << 31), (1 << 31) - 1, index, dtype=np.int64).astype(np.int32),
    } for index in range(count)]


def assert_same(fields: list[FieldSpec], record: dict[str, Any], sample: dict[str, Any], size: int) -> None:
    for spec in fields:
        got, want = sample[spec.name], record[spec.name]
        if spec.type == "image":
            np.testing.assert_array_equal(np.asarray(got), decode_bytes(want, size))
        elif spec.type in ("text", "bytes"):
            assert got == want
        elif spec.type == "int":
            assert int(got) == want
        else:
            np.testing.assert_array_equal(np.asarray(got).astype(np.int64 if spec.type == "tokens" else want.dtype),
                                          np.asarray(want).astype(np.int64 if spec.type == "tokens" else want.dtype))


def pack_all(out: Path, records: list[dict[str, Any]], fields: list[FieldSpec] = FIELDS, **options: Any) -> Any:
    values = {"shard_bytes": 3000, "progress": False, "workers": 1}
    values.update(options)
    items = ((f"r{index}", record, "") for index, record in enumerate(records))
    return pack_records(items, fields, out, RecordPackOptions(**values))


@pytest.fixture(scope="module")
def packed_records(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    records = make_records(12)
    out = tmp_path_factory.mktemp("records")
    pack_all(out, records)
    return out, records


# -- datasets packed before typed records ------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["decoded", "encoded"])
def test_datasets_packed_by_version_1_read_as_before(layout: str) -> None:
    root = FIXTURES / f"v1-{layout}"
    expected = np.load(FIXTURES / f"v1-{layout}-expected.npz")
    dataset = HDF5Dataset(root, image_size=8, fast_decode=False)
    images, labels = dataset.__getitems__(list(range(len(dataset))))
    np.testing.assert_array_equal(np.asarray(images), expected["images"])
    np.testing.assert_array_equal(np.asarray(labels), expected["labels"])
    assert type(open_dataset(root, image_size=8)) is HDF5Dataset
    manifest = load_manifest(root)
    assert manifest.version == 1 and manifest.fields is None
    # Written back, a version-1 manifest is the same bytes (no "fields" key an older reader would refuse).
    assert json.dumps(manifest.model_dump(), indent=2, sort_keys=True) + "\n" == (root / "manifest.json").read_text()
    verify(root)


# -- round trip of every field type, locally ---------------------------------------------------------------------

def test_every_field_type_reads_back_exactly(packed_records: tuple[Path, list[dict[str, Any]]]) -> None:
    root, records = packed_records
    manifest = load_manifest(root)
    assert manifest.version == 2 and manifest.layout == "records" and manifest.num_samples == 12
    assert [spec.name for spec in manifest.fields or []] == [spec.name for spec in FIELDS]
    assert len(manifest.shards) > 2  # samples cross shard boundaries below
    verify(root)
    dataset = open_dataset(root, image_size=12)
    assert isinstance(dataset, RecordsDataset)
    order = [11, 0, 1, 2, 7, 3, 4, 5, 6, 10, 9, 8]
    batch = dataset.__getitems__(order)
    assert list(batch) == [spec.name for spec in FIELDS]
    assert batch["image"].shape == (12, 12, 12, 3) and batch["label"].dtype.is_signed
    for position, index in enumerate(order):
        sample = {name: value[position] for name, value in batch.items()}
        assert_same(FIELDS, records[index], sample, 12)
        assert_same(FIELDS, records[index], dataset[index], 12)


def test_a_reader_asks_for_fields_and_touches_only_their_columns(
        packed_records: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    source, records = packed_records
    root = tmp_path / "copy"
    shutil.copytree(source, root)
    for shard in load_manifest(root).shards:  # the image column gone from every shard
        with h5py.File(root / shard.path, "r+") as handle:
            del handle["fields/image"]
    captions = open_dataset(root, fields=["seq", "caption"], as_tuple=True)
    seq, caption = captions.__getitems__([3, 4])
    assert caption == [records[3]["caption"], records[4]["caption"]]
    np.testing.assert_array_equal(seq.numpy(), np.stack([records[3]["seq"], records[4]["seq"]]).astype(np.int32))
    with pytest.raises(DatasetError, match=r"shard-00000.h5: field image: missing from the shard$"):
        open_dataset(root, fields=["image"]).__getitems__([0])
    with pytest.raises(ValueError, match=r"^fields: 'text' is not a field of .*\(image, caption, raw"):
        open_dataset(root, fields=["text"])


def test_decode_cache_keeps_image_fields(packed_records: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    source, records = packed_records
    root, cache = tmp_path / "copy", tmp_path / "decoded"
    shutil.copytree(source, root)
    first = open_dataset(root, fields=["image"], image_size=12, decode_cache=cache, decode_cache_bytes=1 << 20)
    cold = first.__getitems__(list(range(12)))["image"].clone()
    first.close()
    assert len(list(cache.glob("*.rows"))) == len(load_manifest(root).shards)
    for shard in load_manifest(root).shards:  # no JPEG left: only the kept rows can give the pixels now
        with h5py.File(root / shard.path, "r+") as handle:
            handle["fields/image/data"][...] = 0
    warm = open_dataset(root, fields=["image"], image_size=12, decode_cache=cache, decode_cache_bytes=1 << 20)
    np.testing.assert_array_equal(warm.__getitems__(list(range(12)))["image"].numpy(), cold.numpy())
    for index in range(12):
        np.testing.assert_array_equal(cold[index].numpy(), decode_bytes(records[index]["image"], 12))
    with pytest.raises(DatasetError, match=r"field image, sample 0 does not decode"):
        open_dataset(root, fields=["image"], image_size=12).__getitems__([0])


def test_pipe_transport_and_tensors(packed_records: tuple[Path, list[dict[str, Any]]]) -> None:
    root, records = packed_records
    dataset = open_dataset(root, fields=["label", "seq", "doc"])
    dataset.transport = "pipe"
    batch = dataset.__getitems__([1, 2])
    assert isinstance(batch["seq"], np.ndarray) and batch["seq"].dtype == np.uint16
    tensors = records_to_tensors(batch)
    assert tensors["seq"].dtype.is_signed and tensors["seq"].dtype.itemsize == 4
    assert tensors["label"].tolist() == [records[1]["label"], records[2]["label"]]
    padded, lengths = pad_sequences(tensors["doc"], pad_value=-7)
    assert lengths.tolist() == [1, 2] and padded.tolist() == [[int(records[1]["doc"][0]), -7],
                                                              [int(v) for v in records[2]["doc"]]]



@pytest.mark.parametrize("length", [-1, -30, 2.5, True, "4"])
def test_pad_sequences_refuses_a_bad_length(length: Any) -> None:
    with pytest.raises(ValueError, match=r"^pad_sequences: length must be a whole number of 0 or more, got "):
        pad_sequences([[1, 2, 3], [4]], length=length)


def test_pad_sequences_length_zero_and_cut() -> None:
    padded, lengths = pad_sequences([[1, 2, 3], [4]], length=0)
    assert tuple(padded.shape) == (2, 0) and lengths.tolist() == [0, 0]
    padded, lengths = pad_sequences([[1, 2, 3], [4]], pad_value=9, length=2)
    assert padded.tolist() == [[1, 2], [4, 9]] and lengths.tolist() == [2, 1]

def test_image_folder_readers_and_trainer_refuse_records(packed_records: tuple[Path, list[dict[str, Any]]]) -> None:
    root, _ = packed_records
    with pytest.raises(DatasetError, match=r"a records dataset \(fields image, caption, raw, label, emb, seq, doc\)"):
        HDF5Dataset(root)
    with pytest.raises(ValueError, match=r"^fields, as_tuple: .* is an image-folder pack"):
        open_dataset(FIXTURES / "v1-decoded", fields=["image"])
    with pytest.raises(DatasetError, match=r"the bundled trainer trains image classification on image-folder packs"):
        train_dataset(TrainConfig(data=str(root)))


# -- the packer's checks -----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "value", "message"), [
    (FieldSpec(name="t", type="text"), b"caf\xe9", r"^t: text is not UTF-8 \(byte 3\)$"),
    (FieldSpec(name="t", type="text"), "half \ud800",
     r"^t: text is not UTF-8 \(an undecodable byte or a lone surrogate at character 5\)$"),
    (FieldSpec(name="e", type="ndarray", dtype="float32", shape=(2,)), np.zeros(2, np.float64),
     r"^e: dtype float64 does not convert to float32 without loss$"),
    (FieldSpec(name="e", type="ndarray", dtype="float32", shape=(2,)), np.zeros(3, np.float32),
     r"^e: shape \[3\], the field declares \[2\]$"),
    (FieldSpec(name="s", type="tokens", dtype="uint16", length=2), [1, 70000], r"^s: token ids 1..70000 do not fit"),
    (FieldSpec(name="s", type="tokens", dtype="uint16", length=2), [1, 2, 3],
     r"^s: 3 tokens, the field declares length 2$"),
    (FieldSpec(name="s", type="tokens", dtype="int32"), [1.5], r"^s: token ids must be integers"),
    (FieldSpec(name="n", type="int"), True, r"^n: expected an integer, got bool$"),
    (FieldSpec(name="n", type="int"), 1 << 63, r"^n: 9223372036854775808 does not fit int64$"),
])
def test_values_that_do_not_fit_their_field(spec: FieldSpec, value: Any, message: str) -> None:
    with pytest.raises(RecordError, match=message):
        encode_value(spec, value)


def test_bad_records_are_counted_and_named(tmp_path: Path) -> None:
    records = make_records(3)
    records[1] = {**records[1], "caption": b"\xff\xfe"}
    records[2] = {**records[2], "image": b"GIF89a not really"}
    records.append({**records[0], "extra": 1})
    result = pack_all(tmp_path / "out", records)
    assert result.manifest.num_samples == 1 and result.manifest.skipped == 3
    assert [(item["path"], item["reason"].split(":")[0]) for item in result.skipped] == [
        ("r1", "caption"), ("r2", "image"), ("r3", "extra")]
    report = json.loads((tmp_path / "out" / "pack-report.json").read_text())
    assert report["skipped"][1]["reason"].startswith("image: corrupt image") or \
        report["skipped"][1]["reason"].startswith("image: not an image")
    with pytest.raises(DataToolError, match=r"^records: r1: caption: text is not UTF-8"):
        pack_all(tmp_path / "strict", records, strict=True)
    assert not (tmp_path / "strict" / "manifest.json").exists()
    assert not [path for path in (tmp_path / "strict").iterdir() if path.suffix in (".h5", ".partial")]


def test_an_interrupted_pack_leaves_the_old_dataset(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pack_all(out, make_records(4))
    before = {path.name: path.read_bytes() for path in out.iterdir()}

    def failing() -> Any:
        for index, record in enumerate(make_records(6, seed=1)):
            if index == 5:
                raise KeyboardInterrupt
            yield f"r{index}", record, ""
    with pytest.raises(KeyboardInterrupt):
        pack_records(failing(), FIELDS, out, RecordPackOptions(shard_bytes=3000, progress=False, force=True))
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    with pytest.raises(DataToolError, match=r"already holds a packed dataset"):
        pack_all(out, make_records(2))


def test_same_input_same_shards(tmp_path: Path) -> None:
    pack_all(tmp_path / "a", make_records(5))
    pack_all(tmp_path / "b", make_records(5))
    assert [shard.sha256 for shard in load_manifest(tmp_path / "a").shards] == \
        [shard.sha256 for shard in load_manifest(tmp_path / "b").shards]


# -- hostile manifests and shards --------------------------------------------------------------------------------

def _rewrite_manifest(root: Path, change: Any) -> None:
    data = json.loads((root / "manifest.json").read_text())
    change(data)
    (root / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m["fields"][4].update(dtype="object"), r"fields\.4: dtype: 'object' is not one of bool, uint8"),
    (lambda m: m["fields"][4].update(shape=[1 << 20, 1 << 20]),
     r"fields\.4: shape: 4398046511104 bytes per sample, more than 268435456 \(256 MiB\)$"),
    (lambda m: m["fields"][5].update(length=1 << 40), r"fields\.5: length: .* bytes per sample, more than"),
    (lambda m: m["fields"][1].update(dtype="uint8"), r"fields\.1: dtype: only for ndarray and tokens fields, not text"),
    (lambda m: m["fields"][0].update(name="../x"), r"fields\.0\.name: String should match pattern"),
    (lambda m: m["fields"].append(dict(m["fields"][0])), r"manifest: fields\.7\.name: 'image' is declared twice$"),
    (lambda m: m.update(version=3), r"manifest: version: 3 is not a format version this tool reads \(1, 2\)"),
    (lambda m: m.update(version=1), r"manifest: version: layout records is format version 2, not 1"),
    (lambda m: m.pop("fields"), r"manifest: fields: a records dataset declares its fields"),
])
def test_hostile_manifests_are_one_line(packed_records: tuple[Path, list[dict[str, Any]]], tmp_path: Path,
                                        change: Any, message: str) -> None:
    root = tmp_path / "copy"
    shutil.copytree(packed_records[0], root)
    _rewrite_manifest(root, change)
    with pytest.raises(DatasetError) as caught:
        open_dataset(root)
    text = str(caught.value)
    assert "\n" not in text and text.startswith(f"{root / 'manifest.json'}: invalid manifest: ")
    assert caught.match(message)
    with pytest.raises(ValueError) as direct:
        load_manifest(root)
    assert "\n" not in manifest_error(direct.value)


@pytest.mark.parametrize(("field", "change", "message"), [
    ("emb", lambda m: m["fields"][4].update(dtype="float64"),
     r"field emb: stored as float32, the manifest declares float64$"),
    ("emb", lambda m: m["fields"][4].update(shape=[3, 2]), r"field emb: shape \[\d+, 2, 3\], the manifest implies"),
    ("seq", lambda m: m["fields"][5].update(length=6), r"field seq: shape \[\d+, 5\], the manifest implies \[\d+, 6\]"),
    ("doc", lambda m: m["fields"][6].update(dtype="int64"), r"field doc: stored as int32, the manifest declares int64"),
    ("label", lambda m: m["fields"][3].update(type="text"), r"field label: no data array$"),
])
def test_manifest_that_does_not_match_its_shards(packed_records: tuple[Path, list[dict[str, Any]]], tmp_path: Path,
                                                  field: str, change: Any, message: str) -> None:
    root = tmp_path / "copy"
    shutil.copytree(packed_records[0], root)
    _rewrite_manifest(root, change)
    dataset = open_dataset(root, fields=[field])
    with pytest.raises(DatasetError, match=message) as caught:
        dataset.__getitems__([0])
    assert "\n" not in str(caught.value) and str(caught.value).startswith(str(root / "shard-00000.h5"))
    with pytest.raises(VerifyError, match=message):
        verify(root)


def test_hostile_shards(packed_records: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(packed_records[0], root)
    shard = root / load_manifest(root).shards[0].path
    with h5py.File(shard, "r+") as handle:
        data = handle["fields/caption/data"]
        data[0] = 0xFF  # the first caption is no longer UTF-8
        offsets = handle["fields/raw/offsets"]
        offsets[1] = 1 << 40  # a sample that claims a terabyte
    with pytest.raises(DatasetError, match=r"field caption, sample 0: text is not UTF-8 \(byte 0\)$"):
        open_dataset(root, fields=["caption"]).__getitems__([0])
    with pytest.raises(DatasetError, match=r"field raw: offsets do not describe \d+ samples of the data array$"):
        open_dataset(root, fields=["raw"]).__getitems__([0])
    with pytest.raises(VerifyError):
        verify(root)
