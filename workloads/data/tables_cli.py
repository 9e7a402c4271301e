"""`python -m workloads.data pack-tables`: its arguments and its run (records_slices.py does the work)."""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

from workloads.data.format.errors import DataToolError
from workloads.data.moving.s3 import parse_s3_uri

JOB_INDEX_ENV = "JOB_COMPLETION_INDEX"


def add_parser(commands: Any, endpoint: Any, seconds: Any, int_upto: Any) -> Any:
    tables = commands.add_parser(
        "pack-tables", help="Parquet / Arrow IPC / JSONL / npy tables (local or s3://) -> records dataset, locally "
                            "or in slices into s3://")
    tables.add_argument("src", help="a folder or s3://BUCKET/PREFIX of .parquet, .arrow, .jsonl and .npy files")
    tables.add_argument("out", help="a local directory, or s3://BUCKET/PREFIX: packed there in slices, the manifest "
                                    "published last (see --shard-count, --publish)")
    tables.add_argument("--fields", required=True,
                        help='the records\' fields: a JSON list, e.g. [{"name": "image", "type": "image"}, '
                             '{"name": "caption", "type": "text"}], or a file holding one')
    tables.add_argument("--map", default=None, metavar="MODULE:FUNCTION",
                        help="a function record -> record | None run on every row (its source hash goes into the "
                             "manifest); an exception leaves the row out, named in the report")
    tables.add_argument("--image-column", action="append", default=[], metavar="COLUMN",
                        help="a column holding the key of an image under --images, fetched into the record "
                             "(repeatable)")
    tables.add_argument("--images", default=None, help="folder or s3:// prefix of the images (default: SRC)")
    tables.add_argument("--shard-rows", type=int_upto(1 << 24), default=4096, help="rows per shard (the plan)")
    tables.add_argument("--workers", type=int_upto(256), default=16, help="image fetches and encodes at once")
    tables.add_argument("--strict", action="store_true", help="stop at the first row left out (not a filtered one)")
    tables.add_argument("--force", action="store_true", help="replace a dataset already in a local OUT")
    tables.add_argument("--endpoint-url", type=endpoint, help="S3-compatible endpoint (COS, MinIO)")
    tables.add_argument("--shard-count", type=int_upto(100_000), default=None, metavar="N",
                        help="with an s3:// OUT: pack one slice of N; the manifest comes from --publish")
    tables.add_argument("--shard-index", type=int, default=None, metavar="I",
                        help=f"with --shard-count: which slice, 0..N-1 (default: ${JOB_INDEX_ENV})")
    tables.add_argument("--publish", action="store_true", help="with an s3:// OUT: publish the manifest")
    tables.add_argument("--wait", type=seconds, default=None, metavar="SECONDS",
                        help="with --publish: wait at most this long for slices still packing")
    tables.add_argument("--scratch", type=Path, default=None, help="with an s3:// OUT: local directory for shards")
    return tables


def _index(args: argparse.Namespace) -> int:
    if args.shard_index is not None:
        return int(args.shard_index)
    text = os.environ.get(JOB_INDEX_ENV, "").strip()
    if not text.isdigit():
        raise DataToolError("--shard-index", f"not given and ${JOB_INDEX_ENV} is not an index ({text!r})")
    return int(text)


def run(args: argparse.Namespace, progress: bool) -> int:
    from workloads.data.moving.s3 import make_client
    from workloads.data.moving.upload import ShardStream, StreamOptions
    from workloads.data.writing.maphook import load_map
    from workloads.data.writing.records_slices import (
        TablePackOptions,
        pack_table_slice,
        pack_tables,
        publish_tables,
        read_fields,
    )
    from workloads.data.writing.tables import TableSource

    options = TablePackOptions(fields=read_fields(args.fields), shard_rows=args.shard_rows,
                               image_columns=tuple(args.image_column), images=args.images, strict=args.strict,
                               force=args.force, workers=args.workers)
    hook = load_map(args.map) if args.map else None
    remote = args.src.startswith("s3://") or args.out.startswith("s3://") or (args.images or "").startswith("s3://")
    client = make_client(args.endpoint_url, max_connections=max(16, args.workers), botocore_attempts=6) \
        if remote else None
    source = TableSource(args.src, client)
    if not args.out.startswith("s3://"):
        for flag, given in (("--shard-count", args.shard_count is not None), ("--publish", args.publish),
                            ("--shard-index", args.shard_index is not None), ("--wait", args.wait is not None)):
            if given:
                raise DataToolError(flag, "only with an s3:// OUT")
        result = pack_tables(source, Path(args.out), options, hook, client)
        print(f"packed {result.manifest.num_samples} records in {len(result.manifest.shards)} shards into "
              f"{args.out}; skipped {len(result.skipped)}, filtered {result.filtered}")
        return 0
    if args.publish and args.shard_count is not None:
        raise DataToolError("--publish", "a step of its own: give it without --shard-count/--shard-index")
    target = parse_s3_uri(args.out)
    scratch = args.scratch if args.scratch is not None else Path(tempfile.gettempdir())
    stream_options = StreamOptions(progress=progress)

    def stream() -> ShardStream:
        return ShardStream(make_client(args.endpoint_url, max_connections=stream_options.workers
                                       + stream_options.in_flight, botocore_attempts=6), target, stream_options,
                           probe_client=make_client(args.endpoint_url, max_connections=1, botocore_attempts=1))

    if not args.publish:
        index, count = (_index(args), args.shard_count) if args.shard_count is not None else (0, 1)
        done = pack_table_slice(client, source, target, options, hook, index, count, scratch, stream())
        print(f"slice {index} of {count}: {len(done.packed)} shards packed, {len(done.reused)} already complete; "
              f"{done.samples} records, {done.skipped} left out")
        if args.shard_count is not None:
            return 0
    published = publish_tables(client, source, target, options, hook, stream(), wait_s=args.wait or 0.0)
    print(f"published {published.manifest.num_samples} records in {len(published.manifest.shards)} shards at "
          f"{args.out}; skipped {len(published.skipped)}, filtered {published.filtered}")
    return 0
