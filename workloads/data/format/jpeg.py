"""A stored image -> (size, size, 3) uint8: the one decode the readers use (and the packer's strictness check).

`decode_into` writes JPEG (or any image) bytes straight into a caller's buffer (a row of the batch); `decode_image`,
`decode_bytes` and `decode_file` are the PIL path (center square, resized; draft mode where the stored image is large).

With the optional `simplejpeg` package (it bundles libjpeg-turbo), the header is read without building a PIL image
and the DCT-domain downscale (1/2, 1/4, 1/8) is asked for directly through min_width/min_height, exactly the scale
PIL's draft mode picks; the center square is then resized with PIL's bilinear filter exactly as the PIL path does, so
both paths give the same pixels up to libjpeg-turbo build differences. Without simplejpeg, or for anything it
cannot decode (CMYK, progressive files with odd markers, not a JPEG), PIL does the whole job.
"""

from __future__ import annotations

import io
from pathlib import Path
from types import ModuleType

import numpy as np
from PIL import Image

# No torch here: pack's decoding workers import this module for decodes_strictly.


def _square_center_box(width: int, height: int) -> tuple[int, int, int, int]:
    side = min(width, height)
    left = (width - side) // 2
    top = (height - side) // 2
    return left, top, left + side, top + side


def decode_image(image: Image.Image, size: int, *, draft: bool = True) -> np.ndarray:
    """An opened PIL image -> (size, size, 3) uint8: center square, resized.

    draft=True lets libjpeg decode at 1/2, 1/4 or 1/8 scale (DCT scaling) when the stored image is at least
    twice the target size: the decoder then does a fraction of the work. It never goes below `size`.
    """
    if draft and image.format == "JPEG":
        image.draft("RGB", (size, size))
    image = image.convert("RGB")
    box = _square_center_box(*image.size)
    if image.size != (size, size) or box != (0, 0, size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR, box=box, reducing_gap=None)
    return np.array(image, dtype=np.uint8)


def decode_bytes(payload: bytes | memoryview, size: int, *, draft: bool = True) -> np.ndarray:
    with Image.open(io.BytesIO(payload)) as image:
        return decode_image(image, size, draft=draft)


def decode_file(path: str | Path, size: int, *, draft: bool = True) -> np.ndarray:
    with Image.open(path) as image:
        return decode_image(image, size, draft=draft)


def _load_simplejpeg() -> ModuleType | None:
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


_SIMPLEJPEG = _load_simplejpeg()


def fast_decoder_available() -> bool:
    return _SIMPLEJPEG is not None


def decodes_strictly(payload: bytes | memoryview) -> bool:
    """True when libjpeg-turbo decodes the whole file without a warning (truncation and corrupt entropy-coded data
    are warnings it would otherwise paper over with grey); False when it does not or simplejpeg is missing."""
    if _SIMPLEJPEG is None:
        return False
    try:
        _SIMPLEJPEG.decode_jpeg(payload, colorspace="RGB", strict=True, min_width=1, min_height=1)
    except (ValueError, RuntimeError):
        return False
    return True


def decode_into(payload: bytes | memoryview, out: np.ndarray, *, draft: bool = True,
                use_simplejpeg: bool = True) -> None:
    """Decode one image into `out` (shape (size, size, 3), uint8). Raises OSError when it does not decode."""
    size = out.shape[0]
    if use_simplejpeg and _SIMPLEJPEG is not None and bytes(payload[:2]) == b"\xff\xd8":
        pixels = _decode_simplejpeg(_SIMPLEJPEG, payload, size, draft)
        if pixels is not None:
            out[...] = pixels
            return
    with Image.open(io.BytesIO(payload)) as image:
        out[...] = decode_image(image, size, draft=draft)


def _decode_simplejpeg(simplejpeg: ModuleType, payload: bytes | memoryview, size: int,
                       draft: bool) -> np.ndarray | None:
    """The simplejpeg path, or None where only PIL gives the right answer (PIL then decodes)."""
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(payload)
        if colorspace not in ("RGB", "YCbCr", "Gray"):  # CMYK/YCCK: PIL's inversion rules apply
            return None
        # PIL's draft((size, size)) takes the largest of 1/2, 1/4, 1/8 that keeps both sides >= size. simplejpeg
        # would also take libjpeg-turbo's other eighths (3/8 of a 560 px side, where PIL decodes 1/2), so it is
        # asked for PIL's scale exactly: the smallest eighth whose result covers side / scale is 1 / scale.
        ratio = min(width // size, height // size)
        scale = next((factor for factor in (8, 4, 2) if ratio >= factor), 1) if draft else 1
        limits = {"min_width": -(-width // scale), "min_height": -(-height // scale)} if scale > 1 else {}
        decoded = simplejpeg.decode_jpeg(payload, colorspace="RGB", **limits)
    except (ValueError, RuntimeError):
        return None
    # frombuffer wraps the decoded rows without copying them (fromarray copies: a quarter of the resize's cost).
    image = Image.frombuffer("RGB", (decoded.shape[1], decoded.shape[0]), decoded, "raw", "RGB", 0, 1)
    box = _square_center_box(*image.size)
    if image.size != (size, size) or box != (0, 0, size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR, box=box, reducing_gap=None)
    return np.asarray(image)
