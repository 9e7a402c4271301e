"""Tables of records under a prefix (local, or s3://): Parquet, Arrow IPC, JSONL and npy files, read in pieces.

A table's rows are counted from what the format keeps about itself, and read back a piece at a time, so no table is
ever held whole in memory (nor, for Parquet and npy, read at all to be counted):

    .parquet   the footer: rows per row group; a range of rows reads only the row groups it overlaps
    .arrow     an Arrow IPC file (or stream): rows per record batch (its footer lacks row counts: each batch's
               message is read, one at a time; a local file is memory-mapped, so the bodies are not read, while
               an s3:// file's batches are fetched to be counted); a range reads the batches it overlaps
    .jsonl     one JSON object per non-blank line, UTF-8 (a UTF-16/32 file is named as such, text.py): counted by one
               streaming pass, read by streaming
    .npy       the header: shape[0] rows, each a record {"value": row}; a range reads only its bytes

An s3:// file is read through ranged GETs (`RangedFile`), so the footer of a 10 GiB Parquet file costs a few
requests. Files are taken in sorted relative-path order; a file of another suffix is not a table.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads.data.format.errors import DataToolError
from workloads.data.moving.s3 import RetryPolicy, describe, parse_s3_uri, with_retries
from workloads.data.writing.text import SNIFF_BYTES, column_name, wide_encoding, wide_text_why

TABLE_SUFFIXES = (".parquet", ".arrow", ".jsonl", ".npy")
NPY_FIELD = "value"
_READ_BLOCK = 1 << 20


class RangedFile(io.RawIOBase):
    """A read-only, seekable view of an S3 object: each read is one ranged GET (buffer it: io.BufferedReader)."""

    def __init__(self, client: Any, bucket: str, key: str, size: int, retry: RetryPolicy | None = None) -> None:
        super().__init__()
        self.client, self.bucket, self.key, self.size = client, bucket, key, size
        self.retry = retry or RetryPolicy()
        self.position = 0
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        end = min(self.size, self.position + len(view))
        if end <= self.position:
            return 0

        def get() -> bytes:
            response = self.client.get_object(Bucket=self.bucket, Key=self.key,
                                              Range=f"bytes={self.position}-{end - 1}")
            return bytes(response["Body"].read())

        data = with_retries(get, f"s3://{self.bucket}/{self.key}", self.retry)
        self.requests += 1
        view[: len(data)] = data
        self.position += len(data)
        return len(data)


@dataclass(frozen=True)
class TableFile:
    relpath: str
    size: int

    @property
    def kind(self) -> str:
        return Path(self.relpath).suffix


class TableSource:
    """The table files under a local folder or an s3:// prefix."""

    def __init__(self, root: str, client: Any = None) -> None:
        self.root = root
        self.client = client
        self.uri = parse_s3_uri(root) if root.startswith("s3://") else None
        if self.uri is None and not Path(root).is_dir():
            raise DataToolError(root, "not a readable directory (or an s3://bucket/prefix)")

    def where(self, relpath: str) -> str:
        return f"{self.root.rstrip('/')}/{relpath}"

    def list(self) -> list[TableFile]:
        if self.uri is None:
            base = Path(self.root)
            found = [TableFile(p.relative_to(base).as_posix(), p.stat().st_size) for p in base.rglob("*")
                     if p.suffix in TABLE_SUFFIXES and p.is_file()
                     and not any(part.startswith(".") for part in p.relative_to(base).parts)]
        else:
            prefix = self.uri.key("")
            found = []
            try:
                for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.uri.bucket,
                                                                                   Prefix=prefix):
                    for item in page.get("Contents", []):
                        relpath = item["Key"][len(prefix):]
                        if Path(relpath).suffix in TABLE_SUFFIXES and not any(
                                part.startswith(".") for part in relpath.split("/")):
                            found.append(TableFile(relpath, int(item["Size"])))
            except Exception as exc:
                raise describe(self.root, exc) from exc
        return sorted(found, key=lambda table: table.relpath)

    def open(self, table: TableFile) -> Any:
        if self.uri is None:
            if table.kind == ".arrow":  # mapped: counting a batch's rows reads its message, not its body
                return _pyarrow().memory_map(str(Path(self.root) / table.relpath))
            return open(Path(self.root) / table.relpath, "rb")
        raw = RangedFile(self.client, self.uri.bucket, self.uri.key(table.relpath), table.size)
        return io.BufferedReader(raw, buffer_size=_READ_BLOCK)


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise DataToolError("pyarrow", "reading Parquet and Arrow needs pyarrow (pip install pyarrow)") from None
    return pa


def _arrow_reader(handle: Any) -> Any:
    pa = _pyarrow()
    try:
        return pa.ipc.open_file(handle)
    except pa.ArrowInvalid:
        handle.seek(0)
        return pa.ipc.open_stream(handle)


def _npy_header(handle: Any) -> tuple[tuple[int, ...], np.dtype[Any], int]:
    version = np.lib.format.read_magic(handle)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read(handle)
    if fortran or dtype.hasobject or not shape:
        raise ValueError("expected a C-ordered array of at least one dimension, without Python objects")
    return tuple(shape), dtype, handle.tell()


def table_units(source: TableSource, table: TableFile) -> list[int]:
    """Rows in each piece of a table (row groups, record batches; one piece for JSONL and npy). ValueError names
    why a file is not a readable table of its suffix."""
    pa: Any = _pyarrow() if table.kind in (".parquet", ".arrow") else None
    with source.open(table) as handle:
        try:
            if table.kind == ".parquet":
                metadata = pa.parquet.ParquetFile(handle).metadata
                return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
            if table.kind == ".arrow":
                reader = _arrow_reader(handle)
                if hasattr(reader, "num_record_batches"):
                    return [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
                return [batch.num_rows for batch in reader]
            if table.kind == ".npy":
                return [_npy_header(handle)[0][0]]
            wide = wide_encoding(handle.read(SNIFF_BYTES))
            if wide is not None:
                raise ValueError(wide_text_why(wide))
            handle.seek(0)
            return [sum(1 for line in handle if line.strip())]
        except (OSError, ValueError, EOFError) as exc:
            raise ValueError(f"not a readable {table.kind[1:]} table: {exc}") from None
        except Exception as exc:
            if pa is not None and isinstance(exc, pa.ArrowException):
                raise ValueError(f"not a readable {table.kind[1:]} table: {exc}") from None
            raise


def read_rows(source: TableSource, table: TableFile, units: list[int], begin: int, end: int
              ) -> Iterator[dict[str, Any] | ValueError]:
    """Rows [begin, end) of a table as dicts (a row that is not one: a ValueError saying why), one piece in memory
    at a time."""
    with source.open(table) as handle:
        if table.kind == ".jsonl":
            yield from _jsonl_rows(handle, begin, end)
            return
        if table.kind == ".npy":
            shape, dtype, offset = _npy_header(handle)
            row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
            handle.seek(offset + begin * row_bytes)
            data = np.frombuffer(handle.read((end - begin) * row_bytes), dtype=dtype).reshape(end - begin,
                                                                                              *shape[1:])
            for row in data:
                yield {NPY_FIELD: row.copy() if row.ndim else row.item()}
            return
        pa = _pyarrow()
        stream = False
        if table.kind == ".parquet":
            parquet = pa.parquet.ParquetFile(handle)
            piece_at: Any = parquet.read_row_group  # only the row groups asked for are read
        else:
            reader = _arrow_reader(handle)
            if hasattr(reader, "num_record_batches"):
                piece_at = reader.get_batch
            else:  # a stream has no index: its batches are read in order
                stream, batches = True, iter(reader)
                piece_at = lambda _: next(batches)  # noqa: E731
        first = 0
        for number, rows in enumerate(units):
            if first >= end:
                return
            if first + rows > begin:
                lo, hi = max(begin, first) - first, min(end, first + rows) - first
                yield from _named(piece_at(number).slice(lo, hi - lo)).to_pylist()
            elif stream:
                piece_at(number)  # read past
            first += rows


def _named(piece: Any) -> Any:
    """A row group or record batch whose column names carry no byte-order mark (text.column_name)."""
    names = piece.schema.names
    clean = [column_name(name) for name in names]
    return piece if clean == names else piece.rename_columns(clean)


def _jsonl_rows(handle: Any, begin: int, end: int) -> Iterator[dict[str, Any] | ValueError]:
    row = 0
    for line in handle:
        if not line.strip():
            continue
        if row >= end:
            return
        if row >= begin:
            try:
                value = json.loads(line)
                yield value if isinstance(value, dict) else ValueError(f"a JSON {type(value).__name__}, not an "
                                                                       "object")
            except (ValueError, UnicodeDecodeError) as exc:
                yield ValueError(f"not JSON: {exc}")
        row += 1

