"""What a text table's bytes are: UTF-8, with the byte-order mark some writers put first (Excel's "CSV UTF-8",
Notepad) dropped, so it never becomes part of the first column's name or the first row; UTF-16 and UTF-32 (by their
byte-order mark, or by the NUL bytes ASCII text in UTF-16 has in every other byte) are named, with the encoding that
is expected, instead of being read as rows of garbage. Columnar tables (Parquet, Arrow) keep a mark their writer
read from such a CSV in the first column's name: `column_name` drops it there too. `json_lines`: the rows of a
JSON Lines table, each with its line number, or why it is not JSON.

Used by every reader of a table of records: the caption tables (captions.py), the tables of pack-tables (tables.py)
and the file lists of `pack s3://.../list.csv` (sources.py).
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import Any

BYTE_ORDER_MARK = "\ufeff"
SNIFF_BYTES = 64  # what wide_encoding looks at: the first bytes of a table
# UTF-32 LE first: its mark starts with UTF-16 LE's.
_WIDE_MARKS = ((codecs.BOM_UTF32_LE, "UTF-32 (little-endian)"), (codecs.BOM_UTF32_BE, "UTF-32 (big-endian)"),
               (codecs.BOM_UTF16_LE, "UTF-16 (little-endian)"), (codecs.BOM_UTF16_BE, "UTF-16 (big-endian)"))


def wide_encoding(head: bytes) -> str | None:
    """The UTF-16 or UTF-32 encoding of text that starts with `head` (its first SNIFF_BYTES), or None (UTF-8 or
    anything else a byte-oriented reader reads)."""
    for mark, name in _WIDE_MARKS:
        if head.startswith(mark):
            return name
    sample = head[:SNIFF_BYTES]
    sample = sample[: len(sample) - len(sample) % 2]
    if len(sample) < 4:
        return None
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    if odd * 2 >= len(sample) // 2 and even == 0:  # "k\0e\0y\0": ASCII in UTF-16 LE
        return "UTF-16 (little-endian, without a byte-order mark)"
    if even * 2 >= len(sample) // 2 and odd == 0:
        return "UTF-16 (big-endian, without a byte-order mark)"
    return None


def wide_text_why(encoding: str) -> str:
    """The one line for a table in UTF-16/32: what it is, what is expected, how to convert it."""
    family = encoding.split(" ")[0]
    return (f"{encoding} text; tables are read as UTF-8: convert it (e.g. `iconv -f {family} -t UTF-8 FILE > "
            "NEW`, or save it as \"CSV UTF-8\")")


def table_text(raw: bytes) -> str:
    """A text table's bytes as text: UTF-8 without a leading byte-order mark. Bytes that are not UTF-8 are kept
    visible (surrogateescape), so the row holding them is refused by its field, not the whole table. ValueError
    (wide_text_why) for UTF-16/32 text."""
    wide = wide_encoding(raw[:SNIFF_BYTES])
    if wide is not None:
        raise ValueError(wide_text_why(wide))
    return raw.decode("utf-8", errors="surrogateescape").removeprefix(BYTE_ORDER_MARK)


def column_name(name: str) -> str:
    """A column's name without the byte-order mark a CSV-to-Parquet conversion may have kept in the first one."""
    return name.removeprefix(BYTE_ORDER_MARK)


def shown_name(name: str) -> str:
    """A name from a table, safe and visible in a one-line message: as written when printable, else its escapes."""
    return name if name.isprintable() else ascii(name)


def json_lines(text: str) -> Iterator[tuple[int, Any, str]]:
    """(line number, value, "") for each non-blank line of JSON Lines text; (line number, None, why) for a line that
    is not JSON."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line), ""
        except json.JSONDecodeError as exc:
            yield number, None, f"not JSON: {exc.msg}"
