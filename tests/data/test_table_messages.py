"""Tables of records whose trouble the error must name (each failed before): a byte-order mark in the first column's
name (a CSV saved as Excel's "CSV UTF-8", a Parquet file converted from one), a table in UTF-16 ("no rows" before),
and a pack that found nothing usable ("no usable records (3 skipped)" before, with no report written to say why).
The shared reader (workloads/data/writing/text.py) and the one "no usable records" line
(records_pack.no_usable_records) serve pack-captions, pack-tables and the file lists of `pack s3://...`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.helpers import write_corpus
from workloads.data.__main__ import main
from workloads.data.format.manifest import load_manifest
from workloads.data.moving.s3 import make_client
from workloads.data.writing.records_pack import no_usable_records
from workloads.data.writing.text import table_text, wide_encoding

FIELDS = '[{"name": "key", "type": "text"}, {"name": "n", "type": "int"}]'


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main([*argv, "--no-progress"] + (["--workers", "1"] if argv[0] == "pack-captions" else []))
    return code, capsys.readouterr().err


def images(folder: Path, count: int = 3) -> list[str]:
    write_corpus(folder, per_class=count)
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))[:count]


def caption_lines(keys: list[str]) -> list[dict[str, str]]:
    return [{"key": key, "caption": f"picture {number}", "tag": "x"} for number, key in enumerate(keys)]


def write_csv(path: Path, rows: list[dict[str, str]], encoding: str) -> None:
    lines = [",".join(rows[0])] + [",".join(row.values()) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding=encoding)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_caption_table_with_a_byte_order_mark_packs_every_row_with_clean_names(
        suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: CSV: `error: \\ufeffkey: a column name must be letters...` (the mark invisible in the line); JSONL:
    the first row skipped as "not JSON"."""
    keys = images(tmp_path / "src")
    rows = caption_lines(keys)
    table = tmp_path / "src" / f"captions{suffix}"
    if suffix == ".csv":
        write_csv(table, rows, "utf-8-sig")
    else:
        table.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8-sig")
    code, err = cli(["pack-captions", str(table), str(tmp_path / "out")], capsys)
    assert code == 0, err
    manifest = load_manifest(tmp_path / "out" / "manifest.json")
    assert manifest.num_samples == 3 and manifest.skipped == 0
    assert [field.name for field in manifest.fields] == ["image", "caption", "tag"]


def test_a_parquet_column_named_with_a_byte_order_mark_is_read_by_its_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A Parquet file converted from a CSV with a mark keeps it in the first column's name: before, every row was
    left out ("key: missing") and the pack failed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "tables").mkdir()
    pq.write_table(pa.table({"\ufeffkey": ["a", "b"], "n": [1, 2]}), tmp_path / "tables" / "t.parquet")
    code, err = cli(["pack-tables", str(tmp_path / "tables"), str(tmp_path / "out"), "--fields", FIELDS], capsys)
    assert code == 0, err
    assert load_manifest(tmp_path / "out" / "manifest.json").num_samples == 2


@pytest.mark.parametrize(("suffix", "encoding", "named"), [
    (".csv", "utf-16", "UTF-16 (little-endian)"),
    (".jsonl", "utf-16", "UTF-16 (little-endian)"),
    (".jsonl", "utf-16-be", "UTF-16 (big-endian, without a byte-order mark)"),
    (".csv", "utf-32", "UTF-32 (little-endian)"),
])
def test_a_utf16_caption_table_is_named_with_the_encoding_expected(
        suffix: str, encoding: str, named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `no rows` (JSONL) or a column named `\\udcff\\udcfek e y` (CSV)."""
    keys = images(tmp_path / "src")
    table = tmp_path / "src" / f"captions{suffix}"
    if suffix == ".csv":
        write_csv(table, caption_lines(keys), encoding)
    else:
        table.write_text("\n".join(json.dumps(row) for row in caption_lines(keys)) + "\n", encoding=encoding)
    code, err = cli(["pack-captions", str(table), str(tmp_path / "out")], capsys)
    assert code == 2, err
    assert err == (f"error: {table}: {named} text; tables are read as UTF-8: convert it (e.g. `iconv -f "
                   f"{named.split(' ')[0]} -t UTF-8 FILE > NEW`, or save it as \"CSV UTF-8\")\n")
    assert not (tmp_path / "out").exists()


def test_a_utf16_table_of_pack_tables_is_named_in_the_no_usable_records_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tables").mkdir()
    text = "\n".join(json.dumps({"key": "a", "n": n}) for n in range(3)) + "\n"
    (tmp_path / "tables" / "t.jsonl").write_text(text, encoding="utf-16")
    code, err = cli(["pack-tables", str(tmp_path / "tables"), str(tmp_path / "out"), "--fields", FIELDS], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {tmp_path / 'tables'}: no usable records (1 left out): t.jsonl: not a readable "
                          "jsonl table: UTF-16 (little-endian) text; tables are read as UTF-8"), err


def test_a_utf16_file_list_is_named(tmp_path: Path, s3_url: str, bucket: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """`pack s3://.../list.csv`: before, "not UTF-8 text (byte 0)"."""
    client = make_client(s3_url, 2)
    client.put_object(Bucket=bucket, Key="list.csv", Body="key,label\na.jpg,ants\n".encode("utf-16"))
    code, err = cli(["pack", f"s3://{bucket}/list.csv", str(tmp_path / "out"), "--endpoint-url", s3_url], capsys)
    assert code == 2, err
    assert err.startswith(f"error: s3://{bucket}/list.csv: UTF-16 (little-endian) text; tables are read as UTF-8"), err


def test_no_usable_records_says_how_many_for_what(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `no usable records (3 skipped)` and nothing else (no report is written for a pack that fails)."""
    (tmp_path / "src").mkdir()
    table = tmp_path / "src" / "captions.jsonl"
    rows = [{"key": "missing.jpg", "caption": "c"}, {"key": "x.jpg"}, {"key": "y.jpg"}]
    table.write_text("\n".join(json.dumps(row) for row in rows) + "\nnot json\n")
    code, err = cli(["pack-captions", str(table), str(tmp_path / "out")], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {table}: no usable records (4 left out): 2 x caption: missing; "), err
    assert err.endswith("; line 4: not JSON: Expecting value\n"), err
    assert "; line 1 ('missing.jpg'): image missing.jpg: unreadable: No such file or directory" in err, err
    many = [{"path": f"row {n}", "reason": f"reason {n}"} for n in range(5)]
    assert str(no_usable_records("t", many)) == ("t: no usable records (5 left out): row 0: reason 0; row 1: reason 1; "
                                                 "row 2: reason 2; and 2 other reasons")


def test_no_usable_records_of_pack_tables_counts_the_filtered_rows(tmp_path: Path) -> None:
    error = no_usable_records("tables", [{"path": "t.jsonl#0", "reason": "n: not an integer"}] * 2, filtered=5)
    assert str(error) == "tables: no usable records (2 left out, 5 filtered by the map hook): 2 x n: not an integer"
    assert str(no_usable_records("t.csv", [])) == "t.csv: no usable records: the input has no rows"


def test_the_sniff_leaves_utf8_and_binary_alone() -> None:
    assert wide_encoding("key,caption\nä,ö\n".encode()) is None
    assert wide_encoding(b"\x00\x01\x02\x03\xff\xfe\x00\x00") is None  # not text: for its own reader to refuse
    assert table_text("\ufeffkey\n".encode()) == "key\n"
    with pytest.raises(ValueError, match="UTF-16 \\(big-endian\\)"):
        table_text(b"\xfe\xff" + "key".encode("utf-16-be"))
