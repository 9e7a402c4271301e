"""CLI: python -m workloads.data pack [--upload s3://...]|pack-captions|pack-tokens|verify|upload|stage (see
docs/data-tools.md).

Failures print one line, `error: <where>: <why>`. Exit status: 2 for bad input or configuration (arguments, a
manifest, a bucket that does not exist, credentials); 1 for a failure a retry may fix (the network, a full disk, a
checksum that kept failing, a reader that never came: --wait-timeout); verify exits 1 when data does not match its
manifest; 130 when interrupted.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from workloads.cli import HelpWithDefaults, parse_size
from workloads.data import tables_cli
from workloads.data.format.errors import DataToolError, is_runtime_oserror
from workloads.data.format.manifest import MAX_IMAGE_SIZE
from workloads.data.format.records import TOKEN_DTYPES
from workloads.data.moving.metrics import PACK_METRICS_PORT_ENV, STAGE_METRICS_PORT_ENV, PackMetrics, StageMetrics
from workloads.data.moving.s3 import parse_s3_uri
from workloads.metrics_http import DEFAULT_METRICS_ADDR, METRICS_ADDR_ENV, metrics_addr, port_number
from workloads.parentwatch import PARENT_POLL_S, watch_parent

if TYPE_CHECKING:
    from workloads.data.moving.upload import ShardStream
    from workloads.data.writing.pack import PackOptions
    from workloads.data.writing.sources import S3Source

KIB, MIB, GIB = 1024, 1024**2, 1024**3
JOB_INDEX_ENV = "JOB_COMPLETION_INDEX"  # set by Kubernetes in every pod of an Indexed Job
CONFIG_EXIT, RUNTIME_EXIT = 2, 1
READER_GONE_GRACE_S = 10.0  # a stager whose reader ended has this long to unwind before it exits at once


def _env_port(name: str) -> int:
    """A port from the environment, checked like the flag (a bad value in a Job's env is one line, exit 2)."""
    text = os.environ.get(name, "").strip()
    try:
        return port_number(text) if text else 0
    except argparse.ArgumentTypeError as exc:
        raise DataToolError(name, str(exc)) from None


def _size(minimum: int = 1, maximum: int = 1 << 50, why: str = "") -> Callable[[str], int]:
    def parse(text: str) -> int:
        return parse_size(text, minimum, maximum, why)
    return parse


def _endpoint(text: str) -> str:
    parsed = urllib.parse.urlsplit(text)
    try:
        port_ok = parsed.port is None or 0 < parsed.port < 65536
    except ValueError:
        port_ok = False
    if parsed.scheme not in ("http", "https") or not parsed.hostname or not port_ok:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r} (e.g. https://s3.example.com:9000)")
    return text


def _positive_int(text: str, maximum: int = 1 << 31) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    if value > maximum:
        raise argparse.ArgumentTypeError(f"must be <= {maximum}: {text!r}")
    return value


def _int_upto(maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        return _positive_int(text, maximum)
    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpWithDefaults)  # --help shows the defaults
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def _add_pack(commands: Any, cpus: int) -> _Parser:
    """`pack`: an image folder, s3:// prefix or file list -> HDF5 shards + manifest."""
    pack = commands.add_parser("pack", help="image folder (or s3:// prefix, or s3:// CSV/JSONL file list) -> HDF5 "
                                            "shards + manifest")
    pack.add_argument("src", help="a local class-folder tree, s3://BUCKET/PREFIX of class folders, or "
                                  "s3://BUCKET/PATH/LIST.csv|.jsonl of key,label rows")
    pack.add_argument("out", help="a local directory, or s3://BUCKET/PREFIX: packed there in slices, the manifest "
                                  "published last (see --shard-count, --publish)")
    pack.add_argument("--layout", choices=["decoded", "encoded"], default="decoded")
    pack.add_argument("--size", type=_int_upto(MAX_IMAGE_SIZE), default=256, help="decoded image side in pixels")
    pack.add_argument("--shard-size", type=_size(KIB, 64 * GIB), default=1 << 30, help="e.g. 1GiB")
    pack.add_argument("--workers", type=_int_upto(256), default=cpus, help="decoding processes")
    pack.add_argument("--strict", action="store_true", help="fail on the first unusable file")
    pack.add_argument("--force", action="store_true", help="replace a dataset already in OUT")
    pack.add_argument("--shuffle-seed", type=int, default=0,
                      help="seed of the sample order (classes interleaved across shards); default 0")
    pack.add_argument("--no-shuffle", action="store_true", help="keep the sorted (class, path) order")
    pack.add_argument("--upload", metavar="s3://BUCKET/PREFIX",
                      help="upload each shard as soon as it is written (then delete it locally), the manifest last")
    pack.add_argument("--endpoint-url", type=_endpoint,
                      help="with an s3:// SRC or --upload: S3-compatible endpoint (COS, MinIO)")
    pack.add_argument("--fetch-workers", type=_int_upto(512), default=32,
                      help="with an s3:// SRC: objects fetched at once")
    pack.add_argument("--keep-local", action="store_true",
                      help="with --upload: keep the shards in OUT too (OUT is then the same as a plain pack)")
    pack.add_argument("--shard-count", type=_int_upto(100_000), default=None, metavar="N",
                      help="with an s3:// OUT: pack one slice of N (the shards are the same whatever N is); the "
                           "manifest comes from --publish")
    pack.add_argument("--shard-index", type=int, default=None, metavar="I",
                      help=f"with --shard-count: which slice, 0..N-1 (default: ${JOB_INDEX_ENV}, an Indexed Job's)")
    pack.add_argument("--publish", action="store_true",
                      help="with an s3:// OUT: publish the manifest once every slice's shards are in and verified")
    pack.add_argument("--wait", type=_seconds, default=None, metavar="SECONDS",
                      help="with --publish: wait at most this long for slices still packing (default: no wait)")
    pack.add_argument("--metrics-port", type=port_number, default=None, metavar="PORT",
                      help=f"with --shard-count: serve Prometheus metrics on PORT (default: ${PACK_METRICS_PORT_ENV}, "
                           "else off)")
    pack.add_argument("--scratch", type=Path, default=None,
                      help="with an s3:// OUT: local directory for shards being written and sent (default: the "
                           "system temp directory; an emptyDir in a pod)")
    return pack


def _add_stage(commands: Any) -> _Parser:
    """`stage`: s3:// prefixes -> a local directory, whole or as a bounded cache."""
    stage = commands.add_parser("stage", help="s3://bucket/prefix -> local directory (several: a mixture's sources "
                                              "into DEST/0, DEST/1, ... with one budget)")
    stage.add_argument("uri", nargs="+")
    stage.add_argument("dest", type=Path)
    stage.add_argument("--endpoint-url", type=_endpoint, help="S3-compatible endpoint (COS, MinIO)")
    stage.add_argument("--workers", type=_int_upto(512), default=16, help="parallel ranged GETs")
    stage.add_argument("--part-size", type=_size(256 * KIB, 5 * GIB, "a ranged GET smaller than 256KiB is mostly "
                                                                    "overhead"), default=16 << 20,
                       help="bytes per ranged GET, e.g. 16MiB")
    stage.add_argument("--budget", type=_size(MIB), default=None, metavar="SIZE",
                       help="staging cache: keep at most this much (GiB, or e.g. 512MiB) of shards on disk, "
                            "fetched in the order of the reader's plan (DEST/.cache/plan.json); default: no bound")
    stage.add_argument("--window", type=_size(MIB), default=None, metavar="SIZE",
                       help="alias of --budget (older Jobs)")
    stage.add_argument("--linger", action="store_true",
                       help="serve the reader's plan until SIGTERM instead of exiting when the plan is done (run "
                            "as a Kubernetes native sidecar, which is restarted if it exits); without --budget: a "
                            "whole copy, fetched in plan order")
    stage.add_argument("--wait-timeout", type=_seconds, default=None, metavar="SECONDS",
                       help="when serving (--budget or --linger): give up (exit 1) when the reader does not move for "
                            "this long: no plan at all, or a plan that has not changed while the cache is full of "
                            "shards it needs first or holds every shard it wants; default: wait forever, logging "
                            "what it waits for")
    stage.add_argument("--attempts", type=_positive_int, default=6, help="tries per request before giving up")
    stage.add_argument("--reader-pid", type=_positive_int, default=None, metavar="PID",
                       help="the process that started this stager to read DEST (PackedData and MixedData pass "
                            f"their own): the stager stops within {PARENT_POLL_S:g}s of that process's end, however "
                            f"it ends (SIGKILL too), and exits 1 at the latest {READER_GONE_GRACE_S:g}s later")
    stage.add_argument("--metrics-port", type=port_number, default=None, metavar="PORT",
                       help=f"serve Prometheus metrics on PORT (default: ${STAGE_METRICS_PORT_ENV}, else off); "
                            f"listens on ${METRICS_ADDR_ENV} (default {DEFAULT_METRICS_ADDR})")
    return stage


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m workloads.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cpus = os.cpu_count() or 1

    pack = _add_pack(commands, cpus)

    captions = commands.add_parser("pack-captions", help="image + caption pairs (a JSONL/CSV/TSV/Parquet table of "
                                                         "key,caption[,...] beside the images) -> records dataset")
    captions.add_argument("table", help="TABLE.jsonl|.csv|.tsv|.parquet, local or s3://BUCKET/PATH/TABLE; keys are "
                                        "image paths relative to its folder")
    captions.add_argument("out", type=Path)
    captions.add_argument("--int", action="append", default=[], metavar="COLUMN",
                          help="store this extra column as an int field (repeatable); other extra columns are text")
    captions.add_argument("--endpoint-url", type=_endpoint, help="with an s3:// TABLE: S3-compatible endpoint")
    captions.add_argument("--fetch-workers", type=_int_upto(512), default=32,
                          help="with an s3:// TABLE: objects fetched at once")
    captions.add_argument("--workers", type=_int_upto(256), default=cpus, help="image decoding processes")

    tokens = commands.add_parser("pack-tokens",
                                 help="pre-tokenized .npy or Arrow arrays -> fixed-length token sequences")
    tokens.add_argument("src", type=Path, help=("a folder of .npy files (each one document's 1-D token ids) and/or "
                                                ".arrow files (Arrow IPC, a document per row)"))
    tokens.add_argument("out", type=Path)
    tokens.add_argument("--seq-len", type=_int_upto(1 << 24), required=True, help="tokens per sequence")
    tokens.add_argument("--dtype", choices=list(TOKEN_DTYPES), default="uint16",
                        help="stored dtype of the ids (uint16 holds vocabularies up to 65536)")
    tokens.add_argument("--eos", type=int, default=None, help="token id appended after each document")
    tokens.add_argument("--doc-offsets", action="store_true",
                        help="also store each sequence's document starts (field doc_offsets: a block-diagonal "
                             "attention mask, workloads/data/format/documents.py)")
    tokens.add_argument("--arrow-column", default="input_ids",
                        help=".arrow files: the list-of-integers column holding each row's token ids")
    for sub in (captions, tokens):
        sub.add_argument("--shard-size", type=_size(KIB, 64 * GIB), default=1 << 30, help="e.g. 1GiB")
        sub.add_argument("--strict", action="store_true", help="fail on the first unusable input")
        sub.add_argument("--force", action="store_true", help="replace a dataset already in OUT")
        sub.add_argument("--shuffle-seed", type=int, default=0, help="seed of the sample order")
        sub.add_argument("--no-shuffle", action="store_true", help="keep the input order")

    verify = commands.add_parser("verify", help="check shards against the manifest")
    verify.add_argument("out", type=Path)

    upload = commands.add_parser("upload", help="dataset directory -> s3://bucket/prefix")
    upload.add_argument("out", type=Path)
    upload.add_argument("uri")
    upload.add_argument("--endpoint-url", type=_endpoint, help="S3-compatible endpoint (COS, MinIO)")
    upload.add_argument("--workers", type=_int_upto(512), default=16)
    upload.add_argument("--part-size", type=_size(5 * MIB, 5 * GIB, "S3 multipart parts are 5MiB to 5GiB"),
                        default=64 << 20, help="multipart part size, e.g. 64MiB")
    upload.add_argument("--force", action="store_true",
                        help="re-send every shard even when the remote object's sha256 metadata matches")

    stage = _add_stage(commands)
    for sub in (pack, captions, tokens, upload, stage, tables_cli.add_parser(commands, _endpoint, _seconds, _int_upto)):
        sub.add_argument("--no-progress", action="store_true")
    return parser


def _pack_source(args: argparse.Namespace) -> Path | S3Source:
    """pack's SRC: a local folder, or an s3:// source with its own client (the same rules as stage's)."""
    if not args.src.startswith("s3://"):
        if args.fetch_workers != 32:
            raise DataToolError("--fetch-workers", "only meaningful with an s3:// SRC")
        return Path(args.src)
    from workloads.data.moving.s3 import make_client
    from workloads.data.writing.sources import S3Source, SourceOptions

    try:
        uri = parse_s3_uri(args.src)
    except DataToolError as exc:
        raise DataToolError("SRC", f"{exc.why}: {args.src!r}") from None
    options = SourceOptions(fetch_workers=args.fetch_workers)
    return S3Source(make_client(args.endpoint_url, max_connections=options.fetch_workers), uri, options)


def _shard_stream(args: argparse.Namespace, progress: bool) -> ShardStream | None:
    """pack --upload's uploader (its flags checked here, before anything is read or written); None without it."""
    if args.upload is None:
        given = (("--endpoint-url", args.endpoint_url is not None and not args.src.startswith("s3://")),
                 ("--keep-local", args.keep_local))
        for flag, wrong in given:
            if wrong:
                raise DataToolError(flag, "only meaningful with --upload" if flag == "--keep-local"
                                    else "only meaningful with an s3:// SRC or --upload")
        return None
    try:
        target = parse_s3_uri(args.upload)
    except DataToolError as exc:
        raise DataToolError("--upload", f"{exc.why}: {args.upload!r}") from None
    from workloads.data.moving.s3 import make_client
    from workloads.data.moving.upload import ShardStream, StreamOptions

    options = StreamOptions(keep_local=args.keep_local, progress=progress)
    client = make_client(args.endpoint_url, max_connections=options.workers + options.in_flight, botocore_attempts=6)
    # The probe before packing gets one attempt: an unreachable endpoint is reported at once, not after backoff.
    probe = make_client(args.endpoint_url, max_connections=1, botocore_attempts=1)
    return ShardStream(client, target, options, probe_client=probe)


def _pack_records(args: argparse.Namespace, progress: bool) -> int:
    """pack-captions and pack-tokens: a records dataset (workloads/data/writing/captions.py, tokens.py)."""
    from workloads.data.writing.captions import pack_captions
    from workloads.data.writing.pack import REPORT_NAME
    from workloads.data.writing.records_pack import RecordPackOptions
    from workloads.data.writing.tokens import pack_tokens

    options = RecordPackOptions(shard_bytes=args.shard_size, workers=getattr(args, "workers", 1), strict=args.strict,
                                force=args.force, progress=progress,
                                shuffle_seed=None if args.no_shuffle else args.shuffle_seed)
    if args.command == "pack-tokens":
        result = pack_tokens(args.src, args.out, options, seq_len=args.seq_len, dtype=args.dtype, eos=args.eos,
                             arrow_column=args.arrow_column, doc_offsets=args.doc_offsets)
        extra = (f"; {result.report['stream_tokens']} tokens of {result.report['documents']} documents, "
                 f"dropped tail {result.report['dropped_tail_tokens']}")
    else:
        client, source_options = None, None
        if args.table.startswith("s3://"):
            from workloads.data.moving.s3 import make_client
            from workloads.data.writing.sources import SourceOptions

            try:
                parse_s3_uri(args.table)
            except DataToolError as exc:
                raise DataToolError("TABLE", f"{exc.why}: {args.table!r}") from None
            source_options = SourceOptions(fetch_workers=args.fetch_workers)
            client = make_client(args.endpoint_url, max_connections=args.fetch_workers)
        else:
            for flag, wrong in (("--endpoint-url", args.endpoint_url is not None),
                                ("--fetch-workers", args.fetch_workers != 32)):
                if wrong:
                    raise DataToolError(flag, "only meaningful with an s3:// TABLE")
        result = pack_captions(args.table, args.out, options, args.int, client=client,
                               source_options=source_options)
        extra = ""
    manifest = result.manifest
    fields = ", ".join(f"{spec.name}:{spec.type}" for spec in manifest.fields or [])
    print(f"packed {manifest.num_samples} records ({fields}) in {len(manifest.shards)} shards into {args.out}; "
          f"skipped {len(result.skipped)} (see {args.out / REPORT_NAME}){extra}")
    return 0


def _slice_index(args: argparse.Namespace) -> int:
    if args.shard_index is not None:
        return int(args.shard_index)
    text = os.environ.get(JOB_INDEX_ENV, "").strip()
    if not text:
        raise DataToolError("--shard-index", f"not given and ${JOB_INDEX_ENV} is not set")
    try:
        return int(text)
    except ValueError:
        raise DataToolError(JOB_INDEX_ENV, f"not an integer: {text!r}") from None


def _pack_to_bucket(args: argparse.Namespace, options: PackOptions, progress: bool) -> int:
    """pack SRC s3://DEST: one slice (--shard-count), the publish step (--publish), or both in this process."""
    from workloads.data.moving.s3 import make_client
    from workloads.data.moving.upload import ShardStream, StreamOptions
    from workloads.data.writing.pack import REPORT_NAME
    from workloads.data.writing.slices import pack_slice, publish

    for flag, given in (("--upload", args.upload is not None), ("--keep-local", args.keep_local),
                        ("--force", args.force)):
        if given:
            raise DataToolError(flag, "only for a local OUT (an s3:// OUT is always replaced, manifest last)")
    if args.publish and args.shard_count is not None:
        raise DataToolError("--publish", "a step of its own: give it without --shard-count/--shard-index")
    if args.shard_index is not None and args.shard_count is None:
        raise DataToolError("--shard-index", "only meaningful with --shard-count")
    if args.wait is not None and not args.publish:
        raise DataToolError("--wait", "only meaningful with --publish")
    try:
        target = parse_s3_uri(args.out)
    except DataToolError as exc:
        raise DataToolError("OUT", f"{exc.why}: {args.out!r}") from None
    source = _pack_source(args)
    scratch = args.scratch if args.scratch is not None else Path(tempfile.gettempdir())
    if not scratch.is_dir():
        raise DataToolError(str(scratch), "--scratch: not a directory")
    stream_options = StreamOptions(progress=progress)

    def stream() -> ShardStream:
        client = make_client(args.endpoint_url, max_connections=stream_options.workers + stream_options.in_flight,
                             botocore_attempts=6)
        return ShardStream(client, target, stream_options,
                           probe_client=make_client(args.endpoint_url, max_connections=1, botocore_attempts=1))

    client = make_client(args.endpoint_url, max_connections=16, botocore_attempts=6)
    if not args.publish:
        index, count = (_slice_index(args), args.shard_count) if args.shard_count is not None else (0, 1)
        port = args.metrics_port if args.metrics_port is not None else _env_port(PACK_METRICS_PORT_ENV)
        metrics = PackMetrics()
        try:
            if port:
                metrics.serve(port, metrics_addr())
            done = pack_slice(client, source, target, options, index, count, scratch, stream(), metrics)
        finally:
            metrics.close()
        shards = f"{done.shards.start}..{done.shards.stop - 1}" if len(done.shards) else "none"
        print(f"slice {index} of {count}: shards {shards} into {target}: {len(done.packed)} packed, "
              f"{len(done.reused)} already complete; {done.samples} samples, skipped {done.skipped}, uploaded "
              f"{done.uploaded_bytes} bytes, aborted {done.aborted_uploads} open uploads")
        if args.shard_count is not None:
            return 0
    published = publish(client, source, target, options, stream(), wait_s=args.wait or 0.0)
    print(f"published {published.manifest.num_samples} samples in {len(published.manifest.shards)} shards "
          f"({published.manifest.layout}) at {target}; skipped {len(published.skipped)} (see "
          f"{target}/{REPORT_NAME}), removed {len(published.removed)} stale shards of a previous pack")
    return 0


def run(args: argparse.Namespace) -> int:
    progress = not args.no_progress if hasattr(args, "no_progress") else False
    if args.command == "pack-tables":
        return tables_cli.run(args, progress)
    if args.command == "pack":
        from workloads.data.writing.pack import REPORT_NAME, PackOptions, pack

        options = PackOptions(
            layout=args.layout, image_size=args.size, shard_bytes=args.shard_size, workers=args.workers,
            strict=args.strict, force=args.force, progress=progress,
            shuffle_seed=None if args.no_shuffle else args.shuffle_seed)
        if args.out.startswith("s3://"):
            return _pack_to_bucket(args, options, progress)
        for flag, given in (("--shard-count", args.shard_count is not None), ("--shard-index",
                            args.shard_index is not None), ("--publish", args.publish),
                            ("--scratch", args.scratch is not None), ("--wait", args.wait is not None),
                            ("--metrics-port", args.metrics_port is not None)):
            if given:
                raise DataToolError(flag, "only meaningful with an s3:// OUT")
        args.out = Path(args.out)
        stream = _shard_stream(args, progress)
        result = pack(_pack_source(args), args.out, options, stream=stream)
        manifest = result.manifest
        sent = ""
        if stream is not None and result.upload is not None:
            up = result.upload
            sent = (f" and uploaded {up.uploaded_bytes} bytes ({len(up.uploaded)} objects, {len(up.skipped)} "
                    f"already present) to {stream.target}, removed {len(up.removed)} stale shards of a previous "
                    f"pack, peak local shard bytes {up.peak_local_bytes}")
        print(f"packed {manifest.num_samples} samples in {len(manifest.shards)} shards ({manifest.layout}) "
              f"into {args.out}{sent}; skipped {len(result.skipped)} (see {args.out / REPORT_NAME})")
        return 0
    if args.command in ("pack-captions", "pack-tokens"):
        return _pack_records(args, progress)
    if args.command == "verify":
        from workloads.data.format.verify import VerifyError, verify

        try:
            manifest = verify(args.out)
        except VerifyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"ok: {len(manifest.shards)} shards, {manifest.num_samples} samples match {args.out}/manifest.json")
        return 0

    from workloads.data.moving.s3 import RetryPolicy, make_client

    uris = args.uri if isinstance(args.uri, list) else [args.uri]
    uri = parse_s3_uri(uris[0])
    if args.command == "upload":
        from workloads.data.moving.upload import UploadOptions, upload

        client = make_client(args.endpoint_url, max_connections=args.workers, botocore_attempts=6)
        uploaded = upload(client, args.out, uri, UploadOptions(workers=args.workers, part_bytes=args.part_size,
                                                               progress=progress, force=args.force))
        print(f"uploaded {len(uploaded.uploaded)} objects, skipped {len(uploaded.skipped)} already present, removed "
              f"{len(uploaded.removed)} stale shards of a previous pack, to {uri}")
        return 0

    from workloads.data.moving.mixture_stage import stage_mixture
    from workloads.data.moving.stage import StageOptions, stage

    if args.reader_pid is not None:
        _stop_with_reader(args.reader_pid)

    if args.budget is not None and args.window is not None:
        raise DataToolError("--window", "an alias of --budget: give one of them")
    budget = args.budget if args.budget is not None else args.window
    if args.wait_timeout is not None and budget is None and not args.linger:
        raise DataToolError("--wait-timeout", "only meaningful when serving a reader (with --budget or --linger)")
    port = args.metrics_port if args.metrics_port is not None else _env_port(STAGE_METRICS_PORT_ENV)
    client = make_client(args.endpoint_url, max_connections=2 * args.workers)  # the urgent lane: see stage.py
    metrics = StageMetrics()
    try:
        if port:
            metrics.serve(port, metrics_addr())
        stage_options = StageOptions(workers=args.workers, part_bytes=args.part_size, budget_bytes=budget,
                                     retry=RetryPolicy(attempts=args.attempts), progress=progress,
                                     linger=args.linger, wait_timeout_s=args.wait_timeout, metrics=metrics)
        staged = (stage(client, uri, args.dest, stage_options) if len(uris) == 1
                  else stage_mixture(client, [parse_s3_uri(text) for text in uris], args.dest, stage_options))
    finally:
        metrics.close()
    print(f"staged into {args.dest}: fetched {len(staged.fetched)} shards ({staged.fetched_bytes} bytes), kept "
          f"{len(staged.kept)} already verified, evicted {len(staged.evicted)}; peak {staged.peak_held_bytes} "
          "bytes held")
    return 0


def _stop_with_reader(reader: int) -> None:
    """A stager started by its reader ends with it (an orphan once staged for hours): when the reader is gone, the
    stager sends itself SIGTERM (unwound like a pod's stop: fetches cancelled, no partial file under a final name),
    and exits 1 at once if that has not ended it within READER_GONE_GRACE_S (a GET that does not return)."""

    def gone() -> None:
        print(f"stage: the reader (pid {reader}) is gone; stopping", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(READER_GONE_GRACE_S)
        print(f"stage: still stopping {READER_GONE_GRACE_S:g}s after the reader ended; exiting", file=sys.stderr,
              flush=True)
        os._exit(RUNTIME_EXIT)

    watch_parent(reader, gone)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except DataToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return RUNTIME_EXIT if exc.runtime else CONFIG_EXIT
    except OSError as exc:  # disk full, read-only or unwritable output, a file where a directory belongs, ...
        where = exc.filename or "I/O"
        print(f"error: {where}: {exc.strerror or exc}", file=sys.stderr)
        return RUNTIME_EXIT if is_runtime_oserror(exc) else CONFIG_EXIT
    except KeyboardInterrupt:
        print("error: interrupted (no partial file carries a final name; rerun to resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # SIGTERM (Kubernetes stopping the pod) unwinds like Ctrl-C: temp files removed, no half-written shard.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
