"""The peer benchmark's mixture row (`--layouts mixture`): two sources read at 0.7 / 0.3.

The generated JPEGs are split in two sources (even and odd files of each class); each contender converts both
(decoded uint8 pixels, as the decoded layout), uploads them to the same S3 path, and reads the mixture back as uint8
image batches with 2 DataLoader workers:

    ours       two packs, uploaded; MixedData (workloads/data/mixed.py) with both remotes: one stager stages them
               into one directory, the sampler draws 0.7 / 0.3 per batch (each batch within one sample of it)
    streaming  two MDSWriter datasets; StreamingDataset(streams=[Stream(proportion=0.7), Stream(proportion=0.3)])
    litdata    two optimize() outputs; CombinedStreamingDataset([a, b], weights=(0.7, 0.3))

An epoch is what each library calls one: ours and Streaming draw the two sources' total (0.7 / 0.3 of it from
each); LitData's combined dataset ends when a source runs out. Samples/s therefore compare, epoch times only so far.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.peers_common import (
    BATCH,
    WORKERS,
    Mapped,
    Measured,
    Pixels,
    lit_sample,
    litdata_allow_http,
    payload,
    samples_of,
    stub_torchvision,
    upload_dir,
)

WEIGHTS = (0.7, 0.3)


def _halves(ctx: Any) -> list[Path]:
    """The two sources: even and odd files of each class, as class folders of symlinks."""
    roots = [ctx.scratch / "source-0", ctx.scratch / "source-1"]
    for number, (path, _) in enumerate(samples_of(ctx.jpegs)):
        target = roots[number % 2] / path.parent.name / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            target.symlink_to(path)
    return roots


def ours(ctx: Any, run_epochs: Callable[..., Any]) -> Any:
    from workloads.data.api import LoaderSettings, Placement
    from workloads.data.mixed import MixedData, MixtureSource
    from workloads.data.moving.s3 import S3Uri, make_client
    from workloads.data.moving.upload import UploadOptions, upload
    from workloads.data.writing.pack import PackOptions, pack

    started = time.perf_counter()
    remotes = []
    for number, folder in enumerate(_halves(ctx)):
        packed = ctx.scratch / f"packed-{number}"
        pack(folder, packed, PackOptions(layout="decoded", image_size=ctx.size, shard_bytes=ctx.shard_bytes,
                                         workers=WORKERS, progress=False))
        upload(make_client(ctx.endpoint, 16), packed, S3Uri(ctx.bucket, f"ours-mix/{number}"),
               UploadOptions(progress=False))
        remotes.append(f"s3://{ctx.bucket}/ours-mix/{number}")
    measured = Measured(convert_s=time.perf_counter() - started)
    started = time.perf_counter()
    sources = [MixtureSource(remote=remote, weight=weight) for remote, weight in zip(remotes, WEIGHTS, strict=True)]
    data = MixedData.open(sources, batch_size=BATCH, staging_dir=ctx.local / "mix", endpoint_url=ctx.endpoint,
                          placement=Placement(), stager_workers=16)
    data.loader(LoaderSettings(workers=WORKERS))

    def epoch(number: int) -> Iterator[Any]:
        for images, labels, _ in data.batches(number, last_epoch=number == ctx.epochs - 1):
            yield images, labels

    try:
        return run_epochs(ctx, epoch, measured, started)
    finally:
        data.close()


def streaming(ctx: Any, run_epochs: Callable[..., Any]) -> Any:
    stub_torchvision()
    from streaming import MDSWriter, Stream, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    os.environ["S3_ENDPOINT_URL"] = ctx.endpoint
    clean_stale_shared_memory()
    started = time.perf_counter()
    for number, folder in enumerate(_halves(ctx)):
        out = ctx.scratch / f"mds-{number}"
        with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"},
                       size_limit=ctx.shard_bytes) as writer:
            for path, label in samples_of(folder):
                writer.write({"image": payload(path, "decoded", ctx.size), "label": label})
        upload_dir(ctx, out, f"mds-mix/{number}")
    measured = Measured(convert_s=time.perf_counter() - started)
    started = time.perf_counter()
    streams = [Stream(remote=f"s3://{ctx.bucket}/mds-mix/{number}", local=str(ctx.local / f"cache-{number}"),
                      proportion=weight) for number, weight in enumerate(WEIGHTS)]
    dataset = StreamingDataset(streams=streams, shuffle=True, batch_size=BATCH, shuffle_seed=0)
    loader = torch.utils.data.DataLoader(Mapped(dataset, Pixels("decoded", ctx.size)), batch_size=BATCH,
                                         num_workers=WORKERS, persistent_workers=True)
    return run_epochs(ctx, lambda _: loader, measured, started)


def litdata(ctx: Any, run_epochs: Callable[..., Any]) -> Any:
    import litdata as ld

    litdata_allow_http()
    started = time.perf_counter()
    for number, folder in enumerate(_halves(ctx)):
        out = ctx.scratch / f"lit-{number}"
        inputs = [(str(path), label, "decoded", ctx.size) for path, label in samples_of(folder)]
        ld.optimize(fn=lit_sample, inputs=inputs, output_dir=str(out), chunk_bytes=ctx.shard_bytes,
                    num_workers=WORKERS, mode="overwrite")
        upload_dir(ctx, out, f"lit-mix/{number}")
    measured = Measured(convert_s=time.perf_counter() - started)
    started = time.perf_counter()
    parts = [ld.StreamingDataset(f"s3://{ctx.bucket}/lit-mix/{number}", shuffle=True, seed=0,
                                 cache_dir=str(ctx.local / f"cache-{number}"),
                                 storage_options={"endpoint_url": ctx.endpoint},
                                 transform=Pixels("decoded", ctx.size)) for number in range(2)]
    combined = ld.CombinedStreamingDataset(parts, weights=WEIGHTS, seed=0, iterate_over_all=False)
    loader = ld.StreamingDataLoader(combined, batch_size=BATCH, num_workers=WORKERS, persistent_workers=True,
                                    worker_init_fn=litdata_allow_http)
    return run_epochs(ctx, lambda _: loader, measured, started)
