"""Contenders for the peer benchmark (scripts/bench_peers.py): the same images, the same S3 path, the same batches.

Each contender is a function run in its own process (so its memory and its library state are its own):

    contender(ctx) -> Measured

It converts the local JPEG folder ctx.jpegs into its own format, uploads it to s3://ctx.bucket/<name>/ through
the latency proxy (ctx.endpoint), then reads it back with 2 DataLoader workers as uint8 batches
(batch, size, size, 3), timing the first batch and each epoch. Local copies (a stager's destination, a peer's
cache) live under ctx.local, which the parent watches for its peak size.

Layouts: "decoded" stores uint8 size x size x 3 arrays; "encoded" stores the JPEG bytes and decodes them in the
workers; "captions" and "tokens" are multi-field samples (image + caption, token sequences; see
benchmarks/peers_records.py) that ours, Streaming and LitData carry. Peers decode with PIL's reduced-scale decode
(draft mode, the fastest PIL path); ours uses its own decoder (workloads.data.format.jpeg). The peer
libraries are imported only inside their contender.
"""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks import peers_mixture, peers_records
from benchmarks.peers_common import (
    BATCH,
    WORKERS,
    Mapped,
    Measured,
    Pixels,
    lit_sample,
    litdata_allow_http,
    litdata_stream,
    payload,
    pixels,
    samples_of,
    stub_torchvision,
    tree_bytes,
    upload_dir,
)
from workloads.data.format.jpeg import decode_bytes
from workloads.data.format.manifest import load_manifest
from workloads.data.moving.cache import CacheFeeder, working_set_bytes
from workloads.data.moving.s3 import S3Uri, make_client
from workloads.data.moving.stage import StageOptions, stage
from workloads.data.moving.upload import UploadOptions, upload
from workloads.data.reading.dataset import HDF5Dataset, make_loader, to_tensors
from workloads.data.reading.decode_cache import bytes_needed
from workloads.data.reading.records_dataset import records_to_tensors
from workloads.data.reading.sampler import ElasticBatchSampler
from workloads.data.writing.pack import PackOptions, pack

RECORD_LAYOUTS = ("captions", "tokens")
MIXTURE = "mixture"  # two sources at 0.7 / 0.3 (benchmarks/peers_mixture.py): ours, Streaming, LitData
SHARD_BYTES = 32 << 20


@dataclass(frozen=True)
class Context:
    jpegs: Path  # ROOT/<class>/<file>.jpg
    local: Path  # where this contender may keep local copies (watched for peak disk)
    scratch: Path  # conversion output before upload (not counted as the reader's disk)
    endpoint: str  # the S3 server behind the latency proxy
    bucket: str
    layout: str  # "decoded" | "encoded" | "captions" | "tokens"
    size: int
    epochs: int  # measured epochs (>= 2: one cold, the rest warm)
    shard_bytes: int = SHARD_BYTES  # each contender's shard/chunk size
    budget_fraction: float | None = None  # local cache bound as a share of the converted dataset (None: no bound)
    keep_decoded: bool = True  # ours, encoded, unbounded: keep decoded samples (--decode-cache) under ctx.local


def _run_epochs(ctx: Context, make_epoch: Callable[[int], Iterable[Any]], measured: Measured,
                started: float) -> Measured:
    """Iterate `epochs` epochs; the first batch is timed from `started` (before any download)."""
    for epoch in range(ctx.epochs):
        begin = started if epoch == 0 else time.perf_counter()
        count = 0
        for batch in make_epoch(epoch):
            if count == 0 and epoch == 0:
                measured.first_batch_s = time.perf_counter() - started
            if ctx.layout in RECORD_LAYOUTS:
                count += peers_records.check_batch(ctx, batch)
                continue
            images = batch[0]
            if tuple(images.shape[1:]) != (ctx.size, ctx.size, 3) or images.dtype != torch.uint8:
                raise RuntimeError(f"batch of {tuple(images.shape)} {images.dtype}, expected uint8 "
                                   f"(n, {ctx.size}, {ctx.size}, 3)")
            count += int(images.shape[0])
        measured.epoch_s.append(time.perf_counter() - begin)
        measured.samples = count
    return measured


PeerRun = Callable[[Context, Callable[..., Measured]], Measured]  # a run of peers_mixture or peers_records
Peer = Callable[[Context], Measured]


def _by_layout(mixture: PeerRun, records: PeerRun) -> Callable[[Peer], Peer]:
    """A peer's image-folder run that hands the mixture layout to `mixture` and the record layouts to `records`."""
    def wrap(images: Peer) -> Peer:
        @functools.wraps(images)
        def run(ctx: Context) -> Measured:
            if ctx.layout == MIXTURE:
                return mixture(ctx, _run_epochs)
            if ctx.layout in RECORD_LAYOUTS:
                return records(ctx, _run_epochs)
            return images(ctx)
        return run
    return wrap


# -- ours: pack -> upload -> stage (parallel ranged GETs) -> HDF5Dataset ---------------------------------------------
def _pack_and_upload(ctx: Context) -> tuple[Measured, int]:
    """Measured with the conversion time, and the packed dataset's bytes."""
    if ctx.layout in RECORD_LAYOUTS:
        return peers_records.pack_and_upload(ctx)
    started = time.perf_counter()
    packed = ctx.scratch / "packed"
    pack(ctx.jpegs, packed, PackOptions(layout=ctx.layout, image_size=ctx.size, shard_bytes=ctx.shard_bytes,
                                        workers=WORKERS, progress=False))
    upload(make_client(ctx.endpoint, 16), packed, S3Uri(ctx.bucket, "ours"), UploadOptions(progress=False))
    return Measured(convert_s=time.perf_counter() - started), tree_bytes(packed)


def ours(ctx: Context) -> Measured:
    """Copy staging: every shard is local before the first batch."""
    if ctx.layout == MIXTURE:
        return peers_mixture.ours(ctx, _run_epochs)
    if ctx.layout in ("decoded", "tokens") and not ctx.keep_decoded:
        raise NotApplicable("ours-redecode is ours without the decode cache, which only encoded images use")
    measured, _ = _pack_and_upload(ctx)
    started = time.perf_counter()
    dest = ctx.local / "staged"
    stage(make_client(ctx.endpoint, 16), S3Uri(ctx.bucket, "ours"), dest, StageOptions(workers=16, progress=False))
    dataset = _ours_dataset(ctx, dest)
    sampler = ElasticBatchSampler(dataset.shard_sizes, BATCH, seed=0)
    loader = make_loader(dataset, sampler, workers=WORKERS, persistent_workers=True)

    def epoch(number: int) -> Iterator[Any]:
        sampler.set_epoch(number)
        for batch in loader:
            yield _tensors(ctx, batch)

    return _run_epochs(ctx, epoch, measured, started)


def _tensors(ctx: Context, batch: Any) -> Any:
    return records_to_tensors(batch) if ctx.layout in RECORD_LAYOUTS else to_tensors(batch)


def _ours_dataset(ctx: Context, dest: Path) -> HDF5Dataset:
    """The trainer's dataset. Encoded, with unbounded local disk: decoded samples are kept for later epochs, as the
    trainer's --decode-cache does, with a budget that holds every one (the bounded rows and ours-redecode do not
    keep them: the bounded rows' disk is the budget, ours-redecode is the ablation)."""
    if ctx.layout in RECORD_LAYOUTS:
        return peers_records.dataset(ctx, dest)
    if ctx.layout != "encoded":
        return HDF5Dataset(dest)
    if not ctx.keep_decoded or ctx.budget_fraction is not None:
        return HDF5Dataset(dest, image_size=ctx.size)
    shard_sizes = [shard.num_samples for shard in load_manifest(dest).shards]
    return HDF5Dataset(dest, image_size=ctx.size, decode_cache=ctx.local / "decoded",
                       decode_cache_bytes=bytes_needed(ctx.size, shard_sizes))


# -- ours, staging cache: the stager serving the reader's plan, training from the first shards ------------------------
def ours_cache(ctx: Context) -> Measured:
    """The stager runs in this process, as `ours` runs its copy: in a Job it is a sidecar started before the trainer,
    so its start-up overlaps the trainer's. The budget is the share of the packed dataset (all of it: no bound)."""
    if ctx.layout == MIXTURE:
        raise NotApplicable("the mixture row compares ours (MixedData, one stager for both sources) with the "
                            "peers' mixtures")
    measured, packed_bytes = _pack_and_upload(ctx)
    dest = ctx.local / "cache"
    budget = int(packed_bytes * (ctx.budget_fraction or 1.0))
    options = StageOptions(workers=16, progress=False, budget_bytes=budget)
    failures: list[BaseException] = []

    def serve() -> None:
        try:
            stage(make_client(ctx.endpoint, 32), S3Uri(ctx.bucket, "ours"), dest, options)
        except BaseException as exc:  # re-raised below, in the contender
            failures.append(exc)

    started = time.perf_counter()
    stager = threading.Thread(target=serve, name="stager", daemon=True)
    stager.start()
    feeder = None
    try:
        while not (dest / "manifest.json").exists():
            if failures:
                raise failures[0]
            time.sleep(0.002)
        dataset = _ours_dataset(ctx, dest)
        assert dataset.cache is not None
        shards = dataset.manifest.shards
        sampler = _widest_shuffle_that_fits(dataset, dataset.cache.state())
        feeder = CacheFeeder(dataset.cache, [s.path for s in shards], [s.bytes for s in shards], sampler)
        loader = make_loader(dataset, sampler, workers=WORKERS, persistent_workers=True)

        def epoch(number: int) -> Iterator[Any]:
            sampler.set_epoch(number)
            feeder.start_epoch(last_epoch=number == ctx.epochs - 1)
            for done, batch in enumerate(loader, start=1):
                yield _tensors(ctx, batch)
                feeder.advance(done)

        result = _run_epochs(ctx, epoch, measured, started)
    finally:
        if feeder is not None:
            feeder.finish()  # the plan is done: the stager exits
        stager.join(60)
    if failures:
        raise failures[0]
    return result


def _widest_shuffle_that_fits(dataset: HDF5Dataset, state: Any) -> ElasticBatchSampler:
    """The widest shuffle span (4, 2 or 1 shards) whose working set leaves a third of the budget for fetching ahead
    (a user picks --shuffle-shards the same way; the trainer refuses one that does not fit at all)."""
    sizes = [s.bytes for s in dataset.manifest.shards]
    for span in (4, 2, 1):
        sampler = ElasticBatchSampler(dataset.shard_sizes, BATCH, seed=0, shuffle_shards=span)
        needed = working_set_bytes(sizes, *sampler.node_shards())
        if state is None or state.budget is None or needed <= state.budget * 2 // 3:
            break
    return sampler


# -- MosaicML Streaming: MDSWriter -> StreamingDataset (downloads shards into a local cache) -------------------------
@_by_layout(peers_mixture.streaming, peers_records.streaming)
def streaming(ctx: Context) -> Measured:
    stub_torchvision()
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    os.environ["S3_ENDPOINT_URL"] = ctx.endpoint
    clean_stale_shared_memory()
    started = time.perf_counter()
    out = ctx.scratch / "mds"
    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"}, size_limit=ctx.shard_bytes) as writer:
        for path, label in samples_of(ctx.jpegs):
            writer.write({"image": payload(path, ctx.layout, ctx.size), "label": label})
    upload_dir(ctx, out, "mds")
    measured = Measured(convert_s=time.perf_counter() - started)

    started = time.perf_counter()
    limit = int(tree_bytes(out) * ctx.budget_fraction) if ctx.budget_fraction is not None else None
    dataset = StreamingDataset(remote=f"s3://{ctx.bucket}/mds", local=str(ctx.local / "cache"), shuffle=True,
                               batch_size=BATCH, shuffle_seed=0, cache_limit=limit)
    loader = torch.utils.data.DataLoader(Mapped(dataset, Pixels(ctx.layout, ctx.size)), batch_size=BATCH,
                                         num_workers=WORKERS, persistent_workers=True)
    return _run_epochs(ctx, lambda _: loader, measured, started)


# -- LitData: optimize -> StreamingDataset / StreamingDataLoader -----------------------------------------------------
@_by_layout(peers_mixture.litdata, peers_records.litdata)
def litdata(ctx: Context) -> Measured:
    litdata_allow_http()
    started = time.perf_counter()
    inputs = [(str(path), label, ctx.layout, ctx.size) for path, label in samples_of(ctx.jpegs)]
    return litdata_stream(ctx, lit_sample, inputs, Pixels(ctx.layout, ctx.size), started, _run_epochs)


# -- WebDataset: tar shards read over HTTP (curl) through the proxy, batched in the workers --------------------------
def _wds_decode(layout: str, size: int, sample: tuple[bytes, bytes]) -> tuple[torch.Tensor, int]:
    payload, label = sample
    return torch.from_numpy(pixels(payload, layout, size).copy()), int(label)


def webdataset(ctx: Context) -> Measured:
    if ctx.layout in (*RECORD_LAYOUTS, MIXTURE):
        raise NotApplicable("the multi-field rows compare the peers that name typed columns (Streaming, LitData)")
    import functools

    import webdataset as wds

    started = time.perf_counter()
    out = ctx.scratch / "wds"
    out.mkdir(parents=True)
    samples = samples_of(ctx.jpegs)
    shards = max(WORKERS * 2, sum(p.stat().st_size for p, _ in samples) // ctx.shard_bytes + 1)
    per_shard = -(-len(samples) // shards)
    names = []
    for shard in range(shards):
        name = f"shard-{shard:06d}.tar"
        with wds.TarWriter(str(out / name)) as sink:
            for index in range(shard * per_shard, min(len(samples), (shard + 1) * per_shard)):
                path, label = samples[index]
                sink.write({"__key__": f"{index:08d}", "img": payload(path, ctx.layout, ctx.size),
                            "cls": str(label).encode()})
        names.append(name)
    upload_dir(ctx, out, "wds")
    measured = Measured(convert_s=time.perf_counter() - started)
    # Presigned GETs (moto, like S3, refuses anonymous reads of a private bucket); curl fetches them.
    signer = make_client(ctx.endpoint, 1)
    urls = [signer.generate_presigned_url("get_object", Params={"Bucket": ctx.bucket, "Key": f"wds/{name}"},
                                          ExpiresIn=24 * 3600) for name in names]
    started = time.perf_counter()
    dataset = (wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, seed=0,
                              empty_check=False)
               .shuffle(1000).to_tuple("img", "cls").map(functools.partial(_wds_decode, ctx.layout, ctx.size))
               .batched(BATCH, partial=True))
    loader = wds.WebLoader(dataset, batch_size=None, num_workers=WORKERS, persistent_workers=True)
    return _run_epochs(ctx, lambda _: loader, measured, started)


# -- s3torchconnector: one GET per JPEG object (the AWS CRT client), no conversion ----------------------------------
class _S3Decode:
    def __init__(self, size: int, labels: dict[str, int]) -> None:
        self.size, self.labels = size, labels

    def __call__(self, reader: Any) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(decode_bytes(reader.read(), self.size, draft=True)), self.labels[reader.key]


def s3torchconnector(ctx: Context) -> Measured:
    if ctx.layout != "encoded":  # captions and tokens too: one object per sample has no caption or sequence
        raise NotApplicable("s3torchconnector reads objects as stored (one JPEG per object); it has no packed "
                            "or decoded format of its own")
    from s3torchconnector import S3ClientConfig, S3MapDataset

    started = time.perf_counter()
    upload_dir(ctx, ctx.jpegs, "jpegs")
    measured = Measured(convert_s=time.perf_counter() - started)
    classes = sorted(entry.name for entry in ctx.jpegs.iterdir() if entry.is_dir())
    labels = {f"jpegs/{path.relative_to(ctx.jpegs).as_posix()}": classes.index(path.parent.name)
              for path, _ in samples_of(ctx.jpegs)}
    started = time.perf_counter()
    dataset = S3MapDataset.from_prefix(f"s3://{ctx.bucket}/jpegs/", region="us-east-1", endpoint=ctx.endpoint,
                                       transform=_S3Decode(ctx.size, labels),
                                       s3client_config=S3ClientConfig(force_path_style=True))
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                                         persistent_workers=True, generator=torch.Generator().manual_seed(0))
    return _run_epochs(ctx, lambda _: loader, measured, started)


class NotApplicable(Exception):
    """The contender has no way to run this layout; the table says why instead of showing a number."""


CONTENDERS: dict[str, Callable[[Context], Measured]] = {
    "ours": ours,
    "ours-cache": ours_cache,
    "ours-redecode": ours,  # ours without the decode cache (keep_decoded False): what keeping decoded samples gives
    "streaming": streaming,
    "litdata": litdata,
    "webdataset": webdataset,
    "s3torchconnector": s3torchconnector,
}
# Bounded local disk: the same contenders with their cache limited to a share of the converted dataset
# (Streaming's cache_limit, LitData's max_cache_size, our stager's --budget), and shards small enough to fit it.
BOUNDED = {"ours-cache40": "ours-cache", "streaming-cache40": "streaming", "litdata-cache40": "litdata"}
BOUNDED_FRACTION = 0.4
BOUNDED_SHARDS = 16  # shards per dataset in the bounded runs: a 40% budget then holds six of them
for _bounded, _base in BOUNDED.items():
    CONTENDERS[_bounded] = CONTENDERS[_base]
PACKAGES = {"streaming": "mosaicml-streaming", "litdata": "litdata", "webdataset": "webdataset",
            "s3torchconnector": "s3torchconnector", "streaming-cache40": "mosaicml-streaming",
            "litdata-cache40": "litdata"}


def clear(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)

