"""CLI: python -m workloads.data pack|verify|upload|stage (see docs/data-tools.md).

Failures print one line, `error: <where>: <why>`, and exit 2; verify exits 1 when data does not match its manifest.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from workloads.data.s3 import DataToolError, parse_s3_uri

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": None, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str, default_unit: int) -> int:
    """'1GiB', '512Mi', '2G' (binary units) or a bare number of `default_unit` -> bytes."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1GiB, 512MiB)")
    suffix = (match.group(2) or "").upper()
    unit = "B" if suffix == "B" else suffix.rstrip("B").rstrip("I")
    factor = _UNITS[unit] or default_unit
    value = int(float(match.group(1)) * factor)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m workloads.data", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    cpus = os.cpu_count() or 1

    pack = commands.add_parser("pack", help="image folder -> HDF5 shards + manifest")
    pack.add_argument("src", type=Path)
    pack.add_argument("out", type=Path)
    pack.add_argument("--layout", choices=["decoded", "encoded"], default="decoded")
    pack.add_argument("--size", type=_positive_int, default=256, help="decoded image side in pixels")
    pack.add_argument("--shard-size", type=lambda t: parse_size(t, 1), default=1 << 30, help="e.g. 1GiB")
    pack.add_argument("--workers", type=_positive_int, default=cpus, help="decoding processes")
    pack.add_argument("--strict", action="store_true", help="fail on the first unusable file")
    pack.add_argument("--force", action="store_true", help="replace a dataset already in OUT")
    pack.add_argument("--shuffle-seed", type=int, default=0,
                      help="seed of the sample order (classes interleaved across shards); default 0")
    pack.add_argument("--no-shuffle", action="store_true", help="keep the sorted (class, path) order")

    verify = commands.add_parser("verify", help="check shards against the manifest")
    verify.add_argument("out", type=Path)

    upload = commands.add_parser("upload", help="dataset directory -> s3://bucket/prefix")
    upload.add_argument("out", type=Path)
    upload.add_argument("uri")
    upload.add_argument("--endpoint-url", help="S3-compatible endpoint (COS, MinIO)")
    upload.add_argument("--workers", type=_positive_int, default=16)
    upload.add_argument("--part-size", type=lambda t: parse_size(t, 1), default=64 << 20)

    stage = commands.add_parser("stage", help="s3://bucket/prefix -> local directory")
    stage.add_argument("uri")
    stage.add_argument("dest", type=Path)
    stage.add_argument("--endpoint-url", help="S3-compatible endpoint (COS, MinIO)")
    stage.add_argument("--workers", type=_positive_int, default=16, help="parallel ranged GETs")
    stage.add_argument("--part-size", type=lambda t: parse_size(t, 1), default=16 << 20)
    stage.add_argument("--window", type=lambda t: parse_size(t, 1 << 30), default=None,
                       help="rolling window: keep at most this much (GiB, or e.g. 512MiB) on disk")
    stage.add_argument("--linger", action="store_true",
                       help="with --window: once all shards are staged, keep deleting consumed ones until SIGTERM "
                            "(run as a Kubernetes native sidecar, which is restarted if it exits)")
    stage.add_argument("--attempts", type=_positive_int, default=6, help="tries per request before giving up")
    for sub in (pack, upload, stage):
        sub.add_argument("--no-progress", action="store_true")
    return parser


def run(args: argparse.Namespace) -> int:
    progress = not args.no_progress if hasattr(args, "no_progress") else False
    if args.command == "pack":
        from workloads.data.pack import REPORT_NAME, PackOptions, pack

        result = pack(args.src, args.out, PackOptions(
            layout=args.layout, image_size=args.size, shard_bytes=args.shard_size, workers=args.workers,
            strict=args.strict, force=args.force, progress=progress,
            shuffle_seed=None if args.no_shuffle else args.shuffle_seed))
        manifest = result.manifest
        print(f"packed {manifest.num_samples} samples in {len(manifest.shards)} shards ({manifest.layout}) "
              f"into {args.out}; skipped {len(result.skipped)} (see {args.out / REPORT_NAME})")
        return 0
    if args.command == "verify":
        from workloads.data.verify import VerifyError, verify

        try:
            manifest = verify(args.out)
        except VerifyError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"ok: {len(manifest.shards)} shards, {manifest.num_samples} samples match {args.out}/manifest.json")
        return 0

    from workloads.data.s3 import RetryPolicy, make_client

    uri = parse_s3_uri(args.uri)
    if args.command == "upload":
        from workloads.data.upload import UploadOptions, upload

        client = make_client(args.endpoint_url, max_connections=args.workers, botocore_attempts=6)
        uploaded = upload(client, args.out, uri, UploadOptions(workers=args.workers, part_bytes=args.part_size,
                                                               progress=progress))
        print(f"uploaded {len(uploaded.uploaded)} objects, skipped {len(uploaded.skipped)} already present, to {uri}")
        return 0

    from workloads.data.stage import StageOptions, stage

    if args.linger and args.window is None:
        raise DataToolError("--linger", "only meaningful with --window")
    client = make_client(args.endpoint_url, max_connections=args.workers)
    staged = stage(client, uri, args.dest, StageOptions(
        workers=args.workers, part_bytes=args.part_size, window_bytes=args.window,
        retry=RetryPolicy(attempts=args.attempts), progress=progress, linger=args.linger))
    print(f"staged {len(staged.fetched)} shards ({staged.fetched_bytes} bytes), kept {len(staged.kept)} "
          f"already verified, into {args.dest}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except DataToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted (no partial file carries a final name; rerun to resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    # SIGTERM (Kubernetes stopping the pod) unwinds like Ctrl-C: temp files removed, no half-written shard.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
