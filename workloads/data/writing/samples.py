"""The sample pipeline of a pack: a source file's bytes -> what its shard stores, in worker processes.

One per-image rule for every source (a local tree, a bucket, a caption table's images): open, EXIF-upright, convert
to 8-bit RGB (`_to_rgb`), then the decoded layout's resize + center crop or the encoded layout's bytes (an upright
RGB JPEG that decodes strictly is stored as it is, anything else re-encoded). The decoding runs on a process pool
whose workers die with the packer (`worker_init`), at most 2 x workers chunks ahead of the writer (`local_samples`;
a bucket's fetch-then-decode loop is sources.py's, with `decode_fetched`).
"""

from __future__ import annotations

import ctypes
import io
import os
import signal
import stat
import sys
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from workloads.data.format.jpeg import decodes_strictly
from workloads.data.format.manifest import Layout
from workloads.parentwatch import watch_parent

# Pillow refuses images above ~179 Mpx as decompression bombs; keep that guard (it raises, and we skip the file).
Image.MAX_IMAGE_PIXELS = 179_000_000


@dataclass(frozen=True)
class Decoding:
    """What the pipeline reads of a pack's options: what each image becomes, and how many processes decode."""

    layout: Layout = "decoded"
    image_size: int = 256
    workers: int = 1


@dataclass(frozen=True)
class Sample:
    relpath: str
    label: int
    payload: bytes | None  # encoded bytes or raw pixels; None when skipped
    reason: str = ""


_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def _grey_to_rgb(grey: np.ndarray) -> Image.Image:
    pixels = np.clip(np.round(grey), 0, 255).astype(np.uint8)
    return Image.fromarray(np.repeat(pixels[..., None], 3, axis=-1))


def _to_rgb(image: Image.Image) -> Image.Image:
    """8-bit RGB with the values the image means, for every mode Pillow opens.

    High bit depth greyscale (Pillow's convert() clips these to 0..255, so a 16-bit PNG became white):
    I;16 / I;16B / I;16L and I (how 16-bit PNG and TIFF open) scale 0..65535 to 0..255 (v / 257); F (float TIFF)
    scales 0..1 to 0..255, clipping outside. Alpha is composited onto white."""
    image = ImageOps.exif_transpose(image)
    if image.mode == "RGB":
        return image
    if image.mode in _SIXTEEN_BIT:
        return _grey_to_rgb(np.clip(np.asarray(image, dtype=np.float64), 0, 65535) / 257.0)
    if image.mode == "F":
        values = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=1.0, neginf=0.0)
        return _grey_to_rgb(np.clip(values, 0.0, 1.0) * 255.0)
    if image.mode in ("P", "PA", "LA", "RGBA", "La") or "transparency" in image.info:
        # Composite transparency onto white rather than letting convert() expose arbitrary hidden pixels.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")  # L, I, F, CMYK, YCbCr, ...


def resize_center_crop(image: Image.Image, size: int) -> Image.Image:
    """Scale the shorter side to `size`, then cut the central size x size square."""
    width, height = image.size
    scale = size / min(width, height)
    new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
    image = image.resize((new_w, new_h), Image.Resampling.BILINEAR, reducing_gap=None)
    left, top = (new_w - size) // 2, (new_h - size) // 2
    return image.crop((left, top, left + size, top + size))


def _decode(task: tuple[str, str, int, Layout, int]) -> Sample:
    source, relpath, label, layout, size = task
    try:
        # O_NONBLOCK + fstat: a FIFO or device in the folder is skipped, never waited on (read() would block).
        fd = os.open(Path(source) / relpath, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return Sample(relpath, label, None, "not a regular file")
            with os.fdopen(fd, "rb", closefd=False) as handle:
                raw = handle.read()
        finally:
            os.close(fd)
    except OSError as exc:
        return Sample(relpath, label, None, f"unreadable: {exc.strerror}")
    return decode_image(relpath, label, raw, layout, size)


def decode_image(relpath: str, label: int, raw: bytes, layout: Layout, size: int) -> Sample:
    """One source file's bytes -> what its shard stores, or the reason it is skipped (whatever the bytes came from:
    a local file or an object)."""
    if not raw:
        return Sample(relpath, label, None, "empty file")
    try:
        with Image.open(io.BytesIO(raw)) as image:
            untouched = (image.format == "JPEG" and image.mode == "RGB"
                         and image.getexif().get(0x0112, 1) == 1)
            # An RGB JPEG stored as it is only needs proof that it decodes: libjpeg-turbo's strict decode at 1/8
            # scale reads every entropy-coded byte for a fraction of a full decode. Anything it doubts goes
            # through PIL's full decode below, which names the problem.
            if layout == "encoded" and untouched and decodes_strictly(raw):
                return Sample(relpath, label, raw)
            image.load()  # full decode: truncated files fail here, not in the training loop
            rgb = _to_rgb(image)
            if layout == "decoded":
                pixels = np.asarray(resize_center_crop(rgb, size), dtype=np.uint8)
                return Sample(relpath, label, pixels.tobytes())
            if untouched:
                return Sample(relpath, label, raw)
            # Store what a reader can decode straight to RGB: converted, upright, re-encoded losslessly enough.
            buffer = io.BytesIO()
            rgb.save(buffer, format="JPEG", quality=95, subsampling=0)
            return Sample(relpath, label, buffer.getvalue())
    except Image.DecompressionBombError:
        return Sample(relpath, label, None, "image too large (decompression bomb guard)")
    except (OSError, SyntaxError, ValueError) as exc:
        unknown = isinstance(exc, UnidentifiedImageError)
        reason = "not an image (unrecognised format)" if unknown else f"corrupt image: {exc}"
        return Sample(relpath, label, None, reason)


_PR_SET_PDEATHSIG = 1


def worker_init(parent: int) -> None:
    """Decoding workers die with the packer, even when it is SIGKILLed (then no shutdown message ever comes).

    Linux: the kernel sends SIGKILL when the parent dies (prctl PR_SET_PDEATHSIG). Everywhere: a daemon thread
    polls the parent pid as a fallback. Ctrl-C goes to the parent only (it shuts the pool down); SIGTERM kills."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    watch_parent(parent, lambda: os._exit(1))  # at once if it died before the prctl took effect


def decode_chunk(tasks: list[tuple[str, str, int, Layout, int]]) -> list[Sample]:
    return [_decode(task) for task in tasks]


def local_samples(source: Path, files: list[tuple[str, int]], options: Decoding) -> Iterator[Sample]:
    """Decoded samples in input order. At most 2 x workers chunks are decoded ahead of the consumer: Executor.map
    would decode everything it was given, whether consumed or not, so a slow writer (or a slow upload) would hold
    the whole dataset in memory; with a bounded look-ahead the writer's pace sets the decoders'."""
    tasks = [(str(source), rel, label, options.layout, options.image_size) for rel, label in files]
    if options.workers <= 1:
        yield from map(_decode, tasks)
        return
    workers = max(1, min(options.workers, len(tasks)))
    chunk = max(1, min(64, len(tasks) // (options.workers * 8) or 1))
    with ProcessPoolExecutor(max_workers=workers, initializer=worker_init, initargs=(os.getpid(),)) as pool:
        ahead: deque[Future[list[Sample]]] = deque()
        try:
            for start in range(0, len(tasks), chunk):
                ahead.append(pool.submit(decode_chunk, tasks[start:start + chunk]))
                if len(ahead) >= 2 * workers:
                    yield from ahead.popleft().result()
            while ahead:
                yield from ahead.popleft().result()
        finally:
            for future in ahead:  # the consumer stopped (an error, Ctrl-C): decode nothing more
                future.cancel()


def decode_fetched(tasks: list[tuple[str, int, bytes | None, str, Any, int]]) -> list[Sample]:
    """Decode fetched objects (in a pack worker process); a fetch that failed is a skipped sample."""
    return [decode_image(relpath, label, raw, layout, size) if raw is not None
            else Sample(relpath, label, None, reason)
            for relpath, label, raw, reason, layout, size in tasks]
