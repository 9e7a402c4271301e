"""Multi-field contenders for the peer benchmark (scripts/bench_peers.py --layouts captions,tokens).

The same samples for everyone, on the same S3 path (benchmarks/peers.py: latency proxy, 2 workers, batch 128):

    captions   each generated JPEG with a caption (a few words naming its class and number): batches of
               uint8 (128, S, S, 3) images, decoded in the workers, and the 128 captions as strings
    tokens     a corpus of .npy documents of uint16 token ids, cut into sequences of SEQ_LEN ids by our packing rule
               (workloads/data/writing/tokens.pack_tokens); every contender stores those same sequences and yields
               int32 (128, SEQ_LEN) batches

Ours: pack_captions / pack_tokens -> upload -> stage (copy, or the staging cache) -> RecordsDataset (captions: the
decode cache keeps decoded images for later epochs, as in the encoded image rows). MosaicML Streaming: MDSWriter
with columns image bytes + caption str, or tokens ndarray:uint16:SEQ_LEN. LitData: optimize of the same dicts.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.peers_common import (
    BATCH,
    WORKERS,
    Mapped,
    Measured,
    litdata_allow_http,
    litdata_stream,
    samples_of,
    stub_torchvision,
    tree_bytes,
    upload_dir,
)

SEQ_LEN = 513  # 512 inputs + 1 target, as a causal LM reads them
VOCAB = 50257
CAPTION_WORDS = ("a", "photo", "of", "the", "small", "large", "bright", "dark", "red", "green", "blue", "object",
                 "in", "a", "field", "near", "water", "at", "night", "day")
TOKENS_DIR = "tokens"  # beside the JPEG folder: the corpus (one .npy per document)


def caption_of(path: Path, label: int) -> str:
    """The caption of a generated image: its class, its number and a few seeded words (20 to 90 characters)."""
    rng = random.Random(path.name)
    words = " ".join(rng.choice(CAPTION_WORDS) for _ in range(rng.randint(3, 12)))
    return f"class {label} image {path.stem}: {words}"


def write_token_corpus(folder: Path, tokens: int, seed: int = 0) -> None:
    """Documents of 200..5000 uint16 ids, `tokens` ids in all."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    written, number = 0, 0
    while written < tokens:
        length = min(int(rng.integers(200, 5000)), tokens - written)
        np.save(folder / f"doc{number:06d}.npy", rng.integers(1, VOCAB, length).astype(np.uint16))
        written += length
        number += 1


def token_sequences(folder: Path) -> np.ndarray:
    """The sequences pack_tokens cuts (eos 0 after each document, the tail dropped), in stream order."""
    pieces = []
    for path in sorted(folder.glob("*.npy")):
        pieces += [np.load(path), np.zeros(1, dtype=np.uint16)]
    stream = np.concatenate(pieces)
    count = len(stream) // SEQ_LEN
    return stream[: count * SEQ_LEN].reshape(count, SEQ_LEN)


def _tokens_dir(ctx: Any) -> Path:
    return Path(ctx.jpegs).parent / TOKENS_DIR


def _caption_rows(ctx: Any) -> list[tuple[Path, int, str]]:
    return [(path, label, caption_of(path, label)) for path, label in samples_of(ctx.jpegs)]


def check_batch(ctx: Any, batch: Any) -> int:
    """The rows of a batch, after checking that it is what every contender must yield for ctx.layout."""
    if isinstance(batch, torch.Tensor):  # a peer's tokens batch: the sequences alone
        first = batch
    else:
        first = batch["image" if ctx.layout == "captions" else "tokens"] if isinstance(batch, dict) else batch[0]
    if ctx.layout == "captions":
        captions = batch["caption"] if isinstance(batch, dict) else batch[1]
        if tuple(first.shape[1:]) != (ctx.size, ctx.size, 3) or first.dtype != torch.uint8 or \
                len(captions) != len(first) or not isinstance(captions[0], str):
            raise RuntimeError(f"batch of {tuple(first.shape)} {first.dtype} with {type(captions[0]).__name__} "
                               "captions, expected uint8 images and str captions")
    elif tuple(first.shape[1:]) != (SEQ_LEN,) or first.dtype != torch.int32:
        raise RuntimeError(f"batch of {tuple(first.shape)} {first.dtype}, expected int32 (n, {SEQ_LEN})")
    return int(first.shape[0])


# -- ours ---------------------------------------------------------------------------------------------------------
def pack_and_upload(ctx: Any) -> tuple[Any, int]:
    """Measured with the conversion (pack_captions or pack_tokens, then upload) time, and the packed bytes."""
    from workloads.data.moving.s3 import S3Uri, make_client
    from workloads.data.moving.upload import UploadOptions, upload
    from workloads.data.writing.captions import pack_captions
    from workloads.data.writing.records_pack import RecordPackOptions
    from workloads.data.writing.tokens import pack_tokens

    started = time.perf_counter()
    packed = Path(ctx.scratch) / "packed"
    options = RecordPackOptions(shard_bytes=ctx.shard_bytes, workers=WORKERS, progress=False)
    if ctx.layout == "captions":
        # pack_captions reads a table beside the images: hard links put them there without copying a byte.
        source = Path(ctx.scratch) / "pairs"
        rows = []
        for path, _, caption in _caption_rows(ctx):
            key = path.relative_to(ctx.jpegs).as_posix()
            (source / key).parent.mkdir(parents=True, exist_ok=True)
            os.link(path, source / key)
            rows.append(json.dumps({"key": key, "caption": caption}))
        (source / "pairs.jsonl").write_text("\n".join(rows) + "\n")
        pack_captions(source / "pairs.jsonl", packed, options)
    else:
        pack_tokens(_tokens_dir(ctx), packed, options, seq_len=SEQ_LEN, dtype="uint16", eos=0)
    upload(make_client(ctx.endpoint, 16), packed, S3Uri(ctx.bucket, "ours"), UploadOptions(progress=False))
    return Measured(convert_s=time.perf_counter() - started), tree_bytes(packed)


def dataset(ctx: Any, dest: Path) -> Any:
    from workloads.data.format.manifest import load_manifest
    from workloads.data.reading.records_dataset import RecordsDataset

    if ctx.layout == "tokens":
        return RecordsDataset(dest, fields=["tokens"])
    if not ctx.keep_decoded or ctx.budget_fraction is not None:
        return RecordsDataset(dest, fields=["image", "caption"], image_size=ctx.size)
    samples = load_manifest(dest).num_samples
    return RecordsDataset(dest, fields=["image", "caption"], image_size=ctx.size, decode_cache=Path(ctx.local) /
                          "decoded", decode_cache_bytes=samples * (1 + ctx.size * ctx.size * 3) + (1 << 20))


# -- MosaicML Streaming ------------------------------------------------------------------------------------------
class _StreamingSample:
    """MDS sample dict -> what the batch holds (a module-level class: workers unpickle it)."""

    def __init__(self, layout: str, size: int) -> None:
        self.layout, self.size = layout, size

    def __call__(self, sample: dict[str, Any]) -> Any:
        from workloads.data.format.jpeg import decode_bytes

        if self.layout == "tokens":
            return torch.from_numpy(np.asarray(sample["tokens"]).astype(np.int32))
        return torch.from_numpy(decode_bytes(sample["image"], self.size, draft=True)), sample["caption"]


def _samples(ctx: Any) -> Iterator[dict[str, Any]]:
    if ctx.layout == "captions":
        for path, _, caption in _caption_rows(ctx):
            yield {"image": path.read_bytes(), "caption": caption}
    else:
        for sequence in token_sequences(_tokens_dir(ctx)):
            yield {"tokens": sequence}


def streaming(ctx: Any, run_epochs: Callable[..., Any]) -> Any:
    stub_torchvision()
    from streaming import MDSWriter, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    os.environ["S3_ENDPOINT_URL"] = ctx.endpoint
    clean_stale_shared_memory()
    started = time.perf_counter()
    out = Path(ctx.scratch) / "mds"
    columns = {"image": "bytes", "caption": "str"} if ctx.layout == "captions" else \
        {"tokens": f"ndarray:uint16:{SEQ_LEN}"}
    with MDSWriter(out=str(out), columns=columns, size_limit=ctx.shard_bytes) as writer:
        for sample in _samples(ctx):
            writer.write(sample)
    upload_dir(ctx, out, "mds")
    measured = Measured(convert_s=time.perf_counter() - started)
    started = time.perf_counter()
    limit = int(tree_bytes(out) * ctx.budget_fraction) if ctx.budget_fraction is not None else None
    data = StreamingDataset(remote=f"s3://{ctx.bucket}/mds", local=str(Path(ctx.local) / "cache"), shuffle=True,
                            batch_size=BATCH, shuffle_seed=0, cache_limit=limit)
    loader = torch.utils.data.DataLoader(Mapped(data, _StreamingSample(ctx.layout, ctx.size)), batch_size=BATCH,
                                         num_workers=WORKERS, persistent_workers=True)
    return run_epochs(ctx, lambda _: loader, measured, started)


# -- LitData -----------------------------------------------------------------------------------------------------
def _lit_caption(item: tuple[str, str]) -> dict[str, Any]:
    path, caption = item
    return {"image": Path(path).read_bytes(), "caption": caption}


def litdata(ctx: Any, run_epochs: Callable[..., Any]) -> Any:
    litdata_allow_http()
    started = time.perf_counter()
    if ctx.layout == "captions":
        inputs: list[Any] = [(str(path), caption) for path, _, caption in _caption_rows(ctx)]
        fn: Callable[[Any], dict[str, Any]] = _lit_caption
    else:
        # optimize's workers read their sequences from one array file of the cut corpus (its inputs must pickle).
        cut = Path(ctx.scratch) / "sequences.npy"
        sequences = token_sequences(_tokens_dir(ctx))
        np.save(cut, sequences)
        inputs = [(str(cut), index) for index in range(len(sequences))]
        fn = _lit_tokens_row
    return litdata_stream(ctx, fn, inputs, _LitSample(ctx.layout, ctx.size), started, run_epochs)


def _lit_tokens_row(item: tuple[str, int]) -> dict[str, Any]:
    path, row = item
    return {"tokens": np.load(path, mmap_mode="r")[row].copy()}


class _LitSample(_StreamingSample):
    """LitData hands the transform the same dict as Streaming does."""
