"""Where `pack` reads images from: an s3:// prefix of class folders, or a CSV/JSONL file list in a bucket.

    s3://bucket/prefix            prefix/<class>/<...>/<file>, as a local class-folder tree (torchvision's
                                  ImageFolder): classes are the first path component below the prefix, sorted; a
                                  folder marker object (`prefix/<class>/`, what consoles create) makes an empty
                                  class, which pack refuses as it refuses an empty local folder
    s3://bucket/path/list.csv     rows `key,label` (an optional header row `key,label`); keys are relative to the
    s3://bucket/path/list.jsonl   list's own directory (`path/`); a label is a class name, classes sorted by name

The listing is paginated (list_objects_v2, 1,000 keys a page) and each object is fetched by GETs of at most
`part_bytes` (ranged beyond that); every page and every GET is retried with backoff on throttling, 5xx answers and
dropped connections (workloads.data.moving.s3.with_retries) under the client's connect/read timeouts, many objects
at once on a thread pool; the decoding runs on pack's process pool with the same per-image rules as a local pack
(samples.decode_image). Relative paths in the listing (and so in the pack report)
are `<class>/<...>/<file>` for class folders and the listed key for a file list, so a local tree and its copy in a
bucket pack to the same shards and the same report.

An object that vanished between the listing and the GET is skipped (`unreadable: object not found`), as a local
file deleted mid-pack is; denied access or a missing bucket is an error for the whole pack.
"""

from __future__ import annotations

import csv
import functools
import io
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from workloads.data.format.errors import DataToolError
from workloads.data.moving.s3 import RetryPolicy, S3Uri, TransientError, with_retries
from workloads.data.writing.samples import Decoding, Sample, decode_fetched, worker_init
from workloads.data.writing.text import SNIFF_BYTES, json_lines, wide_encoding, wide_text_why

FILE_LIST_SUFFIXES = (".csv", ".jsonl")
FILE_LIST_MAX_BYTES = 4 << 30  # ~50 M rows of `key,label`; a larger "list" is not one
OBJECT_MAX_BYTES = 512 << 20  # an image object larger than this is skipped (Pillow's pixel guard is the other one)


@dataclass(frozen=True)
class Listing:
    """What a source holds: class names, and (relative path, label) for every file, sorted by (label, path)."""

    classes: list[str]
    files: list[tuple[str, int]]
    sizes: dict[str, int]  # listed bytes of each relative path


@dataclass(frozen=True)
class SourceOptions:
    fetch_workers: int = 32  # objects fetched at once
    part_bytes: int = 8 << 20  # an object larger than this is fetched in ranged GETs of this size
    retry: RetryPolicy = RetryPolicy()


def _quoted(text: str, limit: int = 120) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


class S3Source:
    """An s3:// image source: `list_images()` then `samples()`, as pack uses a local folder."""

    def __init__(self, client: Any, uri: S3Uri, options: SourceOptions = SourceOptions()) -> None:
        self.client = client
        self.uri = uri
        self.options = options
        self.file_list = uri.prefix.endswith(FILE_LIST_SUFFIXES)
        # A file list's keys are relative to its directory; class folders are below the prefix itself.
        self.base = str(PurePosixPath(uri.prefix).parent).strip(".").strip("/") if self.file_list else uri.prefix

    def __str__(self) -> str:
        return str(self.uri)

    def where(self, relpath: str) -> str:
        """The s3:// URI of a listed file (what an error names)."""
        return f"s3://{self.uri.bucket}/{self._key(relpath)}"

    def _key(self, relpath: str) -> str:
        return f"{self.base}/{relpath}" if self.base else relpath

    def _objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object below `prefix`, page by page; each page's request retried with backoff
        (throttling, 5xx, dropped connections) like every GET of the source."""
        where, token = str(self.uri), None
        while True:
            extra: dict[str, str] = {"ContinuationToken": token} if token is not None else {}
            try:
                page = with_retries(functools.partial(self.client.list_objects_v2, Bucket=self.uri.bucket,
                                                      Prefix=prefix, **extra), where, self.options.retry)
            except DataToolError as exc:
                if exc.why == "object not found":  # a 404 without the NoSuchBucket code
                    raise DataToolError(where, "bucket does not exist") from None
                raise
            for item in page.get("Contents", []):
                yield item["Key"], int(item["Size"])
            following = page.get("NextContinuationToken")
            if not page.get("IsTruncated"):
                return
            if not following or following == token:
                raise DataToolError(where, "the listing is truncated but names no new continuation token",
                                    runtime=True)
            token = following

    def list_images(self) -> Listing:
        listing = self._list_file_list() if self.file_list else self._list_folders()
        if not listing.classes:
            raise DataToolError(str(self.uri), "no class sub-folders (expected SRC/<class>/<image files>)"
                                if not self.file_list else "the file list names no files")
        return listing

    def _list_folders(self) -> Listing:
        root = f"{self.uri.prefix}/" if self.uri.prefix else ""
        classes: set[str] = set()
        entries: list[tuple[str, str, int]] = []
        for key, size in self._objects(root):
            relpath = key[len(root):]
            name, slash, rest = relpath.partition("/")
            # Only what a local tree could hold: files below a class folder, no hidden class folders or files.
            if not slash or not name or name.startswith("."):
                continue
            classes.add(name)
            if rest and not rest.endswith("/") and not PurePosixPath(rest).name.startswith("."):
                entries.append((relpath, name, size))
        ordered = sorted(classes)
        label = {name: index for index, name in enumerate(ordered)}
        files = sorted(((rel, label[name]) for rel, name, _ in entries), key=lambda item: (item[1], item[0]))
        return Listing(ordered, files, {rel: size for rel, _, size in entries})

    def _read_list(self) -> bytes:
        key = self.uri.prefix

        def get() -> bytes:
            response = self.client.get_object(Bucket=self.uri.bucket, Key=key)
            length = int(response.get("ContentLength", 0))
            if length > FILE_LIST_MAX_BYTES:
                raise DataToolError(str(self.uri), f"{length} bytes, larger than {FILE_LIST_MAX_BYTES}: not a file "
                                                   "list")
            body = response["Body"].read(FILE_LIST_MAX_BYTES + 1)
            if len(body) != length:
                raise TransientError(f"short body: {len(body)} of {length} bytes")
            return bytes(body)

        try:
            return with_retries(get, str(self.uri), self.options.retry)
        except DataToolError as exc:
            if exc.why == "object not found":
                raise DataToolError(str(self.uri), "file list not found") from None
            raise

    def _rows(self, payload: bytes) -> Iterator[tuple[int, str, str]]:
        """(line number, key, class name) of every row of the list."""
        wide = wide_encoding(payload[:SNIFF_BYTES])
        if wide is not None:
            raise DataToolError(str(self.uri), wide_text_why(wide))
        try:
            text = payload.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise DataToolError(str(self.uri), f"not UTF-8 text (byte {exc.start})") from None
        if self.uri.prefix.endswith(".csv"):
            for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
                if not row or (number == 1 and [cell.strip().lower() for cell in row] == ["key", "label"]):
                    continue
                if len(row) != 2:
                    raise DataToolError(f"{self.uri}:{number}", f"expected 2 columns key,label, got {len(row)}")
                yield number, row[0].strip(), row[1].strip()
            return
        for number, record, why in json_lines(text):
            if why:
                raise DataToolError(f"{self.uri}:{number}", why)
            if not isinstance(record, dict) or not isinstance(record.get("key"), str) \
                    or not isinstance(record.get("label"), str | int) or isinstance(record.get("label"), bool):
                raise DataToolError(f"{self.uri}:{number}", 'expected {"key": "<key>", "label": "<class>"}')
            yield number, record["key"], str(record["label"])

    def _list_file_list(self) -> Listing:
        rows: dict[str, str] = {}
        for number, key, name in self._rows(self._read_list()):
            if not key or key.startswith("/") or ".." in key.split("/") or key.endswith("/"):
                raise DataToolError(f"{self.uri}:{number}", f"key {_quoted(key)} is not an object key relative to "
                                                            "the list's directory")
            if not name:
                raise DataToolError(f"{self.uri}:{number}", "empty label")
            if key in rows:
                raise DataToolError(f"{self.uri}:{number}", f"key {_quoted(key)} is listed twice")
            rows[key] = name
        root = f"{self.base}/" if self.base else ""
        # Sizes from the directory's listing (one LIST per 1,000 keys instead of a HEAD per key); a key the listing
        # lacks is fetched anyway and reported as not found.
        sizes = {key[len(root):]: size for key, size in self._objects(root) if key[len(root):] in rows}
        ordered = sorted(set(rows.values()))
        label = {name: index for index, name in enumerate(ordered)}
        files = sorted(((key, label[name]) for key, name in rows.items()), key=lambda item: (item[1], item[0]))
        return Listing(ordered, files, {key: sizes.get(key, 0) for key in rows})

    def fetch(self, relpath: str, size: int) -> tuple[bytes | None, str]:
        """(bytes, "") of one listed object, or (None, why it is skipped). Errors that concern the whole source
        (access denied, credentials, an endpoint that gave up answering) raise DataToolError."""
        if size > OBJECT_MAX_BYTES:
            return None, f"object too large ({size} bytes; at most {OBJECT_MAX_BYTES})"
        key, where = self._key(relpath), self.where(relpath)
        step = self.options.part_bytes

        def get(start: int, end: int | None) -> tuple[bytes, int]:
            extra = {"Range": f"bytes={start}-{end - 1}"} if end is not None else {}
            response = self.client.get_object(Bucket=self.uri.bucket, Key=key, **extra)
            total = int(str(response.get("ContentRange", "")).rpartition("/")[2] or response["ContentLength"])
            if total > OBJECT_MAX_BYTES:
                raise DataToolError(where, "too large")
            body = response["Body"].read(OBJECT_MAX_BYTES + 1)
            if len(body) != int(response["ContentLength"]):
                raise TransientError(f"short body: {len(body)} of {response['ContentLength']} bytes")
            return bytes(body), total

        try:
            if size <= step:
                data, total = with_retries(lambda: get(0, None), where, self.options.retry)
                return data, ""
            parts: list[bytes] = []
            total, start = size, 0
            while start < total:  # the object's own length decides, should it differ from the listing
                end = min(start + step, total)
                part, total = with_retries(functools.partial(get, start, end), where, self.options.retry)
                parts.append(part)
                start += len(part)
                if not part:
                    raise DataToolError(where, "an empty ranged answer before the end of the object", runtime=True)
            return b"".join(parts), ""
        except DataToolError as exc:
            if exc.why == "object not found":
                return None, "unreadable: object not found"
            if exc.why == "too large":
                return None, f"object too large (more than {OBJECT_MAX_BYTES} bytes)"
            if exc.why.startswith("InvalidRange"):  # the object shrank to nothing since the listing
                return b"", ""
            raise

    def samples(self, files: list[tuple[str, int]], options: Decoding, sizes: dict[str, int]) -> Iterator[Sample]:
        """Decoded samples in input order: objects fetched on a thread pool at most `fetch window` ahead, decoded in
        chunks on pack's process pool at most 2 x workers chunks ahead of the consumer (as a local pack)."""
        chunk = max(1, min(64, len(files) // (options.workers * 8) or 1))
        window = max(2 * self.options.fetch_workers, chunk)
        decoders = ProcessPoolExecutor(max_workers=max(1, min(options.workers, len(files) or 1)),
                                       initializer=worker_init, initargs=(os.getpid(),)) \
            if options.workers > 1 else None
        fetchers = ThreadPoolExecutor(max_workers=self.options.fetch_workers, thread_name_prefix="fetch")
        fetching: deque[tuple[str, int, Future[tuple[bytes | None, str]]]] = deque()
        decoding: deque[Future[list[Sample]] | list[Sample]] = deque()
        pending = iter(files)
        try:
            while True:
                for relpath, label in pending:
                    fetching.append((relpath, label, fetchers.submit(self.fetch, relpath, sizes.get(relpath, 0))))
                    if len(fetching) >= window:
                        break
                if not fetching:
                    break
                tasks: list[tuple[str, int, bytes | None, str, Any, int]] = []
                while fetching and len(tasks) < chunk:
                    relpath, label, future = fetching.popleft()
                    raw, reason = future.result()
                    tasks.append((relpath, label, raw, reason, options.layout, options.image_size))
                decoding.append(decoders.submit(decode_fetched, tasks) if decoders is not None
                                else decode_fetched(tasks))
                if len(decoding) >= 2 * max(1, options.workers):
                    head = decoding.popleft()
                    yield from head if isinstance(head, list) else head.result()
            while decoding:
                head = decoding.popleft()
                yield from head if isinstance(head, list) else head.result()
        finally:
            for _, _, future in fetching:
                future.cancel()
            for item in decoding:
                if not isinstance(item, list):
                    item.cancel()
            fetchers.shutdown(wait=True, cancel_futures=True)
            if decoders is not None:
                decoders.shutdown(wait=True, cancel_futures=True)


#END
