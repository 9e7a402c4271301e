"""Pre-tokenized corpora as a records dataset (`pack-tokens`): .npy token-id arrays and Arrow IPC files,
concatenated and cut into fixed-length sequences, packed by records_pack.pack_records."""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from workloads.data.format.documents import DOC_OFFSETS_FIELD, sequence_offsets
from workloads.data.format.errors import DataToolError
from workloads.data.format.records import FieldSpec
from workloads.data.writing.records_pack import Item, RecordPackOptions, RecordPackResult, pack_records

TOKEN_SUFFIX = ".npy"
# Arrow IPC files (file or stream format, as Hugging Face datasets caches them): a list-of-integers column, one
# document per row.
ARROW_SUFFIX = ".arrow"
ARROW_COLUMN = "input_ids"


def _arrow_documents(path: Path, name: str, column: str) -> list[tuple[str, np.ndarray]]:
    """The rows of an Arrow IPC file's list-of-integers `column`, memory-mapped: (name#row, 1-D ids). Raises
    ValueError (the reason) for a file that is not one; a null row is a document of no ids."""
    try:
        import pyarrow as pa
    except ImportError:
        raise DataToolError(str(path), "reading Arrow needs pyarrow (pip install pyarrow), or give .npy files") \
            from None
    try:
        source = pa.memory_map(str(path))  # the arrays below keep it open; nothing is read until they are used
        try:
            table = pa.ipc.open_file(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"not a readable Arrow IPC file: {exc}") from None
    if column not in table.column_names:
        raise ValueError(f"no column {column!r} (columns: {', '.join(table.column_names) or 'none'}); "
                         "name it with --arrow-column")
    values = table.column(column).combine_chunks()
    kind = values.type
    if not ((pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_integer(kind.value_type)):
        raise ValueError(f"column {column!r} is {kind}, expected a list of integer token ids per row")
    if values.values.null_count:  # a null inside a row's list has no id to give
        raise ValueError(f"column {column!r} has null ids inside rows")
    ids = values.values.to_numpy()  # the child array, zero-copy from the map; offsets index into it as they are
    offsets = values.offsets.to_numpy()
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    return [(f"{name}#{row}", ids[offsets[row]:offsets[row + 1]] if valid[row] else ids[:0])
            for row in range(len(values))]


def _token_documents(source: Path, dtype: np.dtype[Any], arrow_column: str = ARROW_COLUMN,
                     ) -> tuple[list[tuple[str, np.ndarray]], list[dict[str, str]]]:
    """Every .npy file (one document) and .arrow file (a document per row of `arrow_column`) below SOURCE, in
    sorted relative-path order and an Arrow file's rows in order, memory-mapped: (name, 1-D ids); and the files or
    rows left out with why (not 1-D integers, ids outside the dtype, unreadable)."""
    if not source.is_dir():
        raise DataToolError(str(source), "not a readable directory")
    names = sorted(path.relative_to(source).as_posix() for path in source.rglob("*")
                   if path.suffix in (TOKEN_SUFFIX, ARROW_SUFFIX)
                   and not any(part.startswith(".") for part in path.relative_to(source).parts))
    documents: list[tuple[str, np.ndarray]] = []
    bad: list[dict[str, str]] = []
    info = np.iinfo(dtype)
    for name in names:
        path = source / name
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):
                bad.append({"path": name, "reason": "not a regular file"})
                continue
            if path.suffix == ARROW_SUFFIX:
                found = _arrow_documents(path, name, arrow_column)
            else:
                found = [(name, np.load(path, mmap_mode="r", allow_pickle=False))]
        except (OSError, ValueError, EOFError) as exc:
            reason = str(exc) if path.suffix == ARROW_SUFFIX else f"not a readable .npy array: {exc}"
            bad.append({"path": name, "reason": reason})
            continue
        for document, ids in found:
            if ids.dtype.kind not in "iu" or ids.ndim != 1:
                bad.append({"path": document, "reason": f"{ids.dtype} array of shape {list(ids.shape)}, expected "
                                                        "1-D integer token ids"})
            elif ids.size and (int(ids.min()) < info.min or int(ids.max()) > info.max):
                bad.append({"path": document,
                            "reason": f"token ids {int(ids.min())}..{int(ids.max())} do not fit {dtype}"})
            else:
                documents.append((document, ids))
    return documents, bad


def pack_tokens(source: Path, out: Path, options: RecordPackOptions, *, seq_len: int, dtype: str = "uint16",
                eos: int | None = None, arrow_column: str = ARROW_COLUMN, doc_offsets: bool = False,
                ) -> RecordPackResult:
    """Pre-tokenized documents as fixed-length sequences in field "tokens": SOURCE/**/*.npy (1-D integer ids, one
    document each) and SOURCE/**/*.arrow (Arrow IPC, a document per row of the list-of-integers `arrow_column`,
    e.g. a Hugging Face datasets cache file's input_ids).

    The packing rule: documents in sorted relative-path order (an Arrow file's rows in row order), each followed by
    `eos` when given, are concatenated
    into one stream, which is cut into consecutive sequences of exactly `seq_len` ids (a sequence may span
    documents; none overlaps another). The stream's tail of fewer than seq_len ids is dropped and its length is in
    the pack report (`dropped_tail_tokens`). The sequences are then stored in a seeded permutation (shuffle_seed).
    doc_offsets: also store each sequence's document segment starts (field "doc_offsets", documents.py)."""
    spec = FieldSpec(name="tokens", type="tokens", dtype=dtype, length=seq_len)
    fields = [spec, FieldSpec(name=DOC_OFFSETS_FIELD, type="tokens", dtype="uint32")] if doc_offsets else [spec]
    target = spec.numpy_dtype
    if eos is not None and not np.iinfo(target).min <= eos <= np.iinfo(target).max:
        raise DataToolError("--eos", f"{eos} does not fit {target}")
    documents, bad = _token_documents(source, target, arrow_column)
    if options.strict and bad:
        raise DataToolError(str(source / bad[0]["path"]), bad[0]["reason"])
    pieces = [ids for _, ids in documents]
    if eos is not None:
        pieces = [part for ids in pieces for part in (ids, np.asarray([eos], dtype=target))]
    ends = np.cumsum([len(part) for part in pieces], dtype=np.int64)
    document_ends = ends[1::2] if eos is not None else ends  # a document ends after its eos
    stream_tokens = int(ends[-1]) if len(ends) else 0
    count = stream_tokens // seq_len
    order = list(range(count))
    if options.shuffle_seed is not None:
        random.Random(options.shuffle_seed).shuffle(order)

    def sequence(index: int) -> np.ndarray:
        start, stop = index * seq_len, (index + 1) * seq_len
        out_ids = np.empty(seq_len, dtype=target)
        part = int(np.searchsorted(ends, start, side="right"))
        filled = 0
        while filled < seq_len:
            begin = int(ends[part - 1]) if part else 0
            take = min(stop - start - filled, int(ends[part]) - (start + filled))
            offset = start + filled - begin
            out_ids[filled:filled + take] = pieces[part][offset:offset + take]
            filled += take
            part += 1
        return out_ids

    def items() -> Iterator[Item]:
        for entry in bad:
            yield entry["path"], None, entry["reason"]
        for index in order:
            record = {"tokens": sequence(index)}
            if doc_offsets:
                record[DOC_OFFSETS_FIELD] = sequence_offsets(document_ends, index * seq_len, (index + 1) * seq_len)
            yield f"sequence {index}", record, ""

    report = {"seq_len": seq_len, "documents": len(documents), "stream_tokens": stream_tokens,
              "sequences": count, "dropped_tail_tokens": stream_tokens - count * seq_len, "eos": eos}
    if count == 0:
        raise DataToolError(str(source), f"{stream_tokens} usable token ids, fewer than one sequence of {seq_len} "
                                         f"({len(bad)} files left out)")
    return pack_records(items(), fields, out, options, source=str(source), total=count + len(bad), report=report)
