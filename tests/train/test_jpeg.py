"""The fast JPEG path gives PIL's pixels (within libjpeg-turbo rounding), and PIL stays the fallback."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.data.helpers import write_awkward_corpus
from workloads.data.format import jpeg
from workloads.data.format.jpeg import decode_bytes, decode_into
from workloads.data.writing.pack import PackOptions, pack

needs_simplejpeg = pytest.mark.skipif(not jpeg.fast_decoder_available(), reason="simplejpeg is not installed")


def _photo(width: int, height: int, seed: int = 0, mode: str = "RGB", fmt: str = "JPEG", **save: object) -> bytes:
    """Smooth structure plus noise, like a photo (flat random noise would make every decoder look different)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([127 + 100 * np.sin(x / (17 + 5 * c) + y / (23 + 3 * c)) for c in range(3)], -1)
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buffer, format=fmt, **({"quality": 90} | save if fmt == "JPEG"
                                                                       else save))
    return buffer.getvalue()


def _decoded(payload: bytes, size: int, **kwargs: object) -> np.ndarray:
    out = np.full((size, size, 3), 7, dtype=np.uint8)
    decode_into(payload, out, **kwargs)  # type: ignore[arg-type]
    return out


@needs_simplejpeg
@pytest.mark.parametrize(("width", "height", "size", "draft"), [
    (450, 340, 160, True),  # DCT scale 1/2, as PIL's draft picks it
    (700, 680, 80, True),  # 1/8
    (560, 560, 160, True),  # 1/2 where libjpeg-turbo alone would pick 3/8
    (200, 150, 96, True),  # too small to scale: full decode
    (450, 340, 160, False),
    (330, 500, 64, True),  # portrait
])
def test_simplejpeg_matches_pil_within_rounding(width: int, height: int, size: int, draft: bool) -> None:
    payload = _photo(width, height)
    fast = _decoded(payload, size, draft=draft)
    reference = decode_bytes(payload, size, draft=draft)
    difference = np.abs(fast.astype(np.int16) - reference.astype(np.int16))
    assert fast.shape == reference.shape == (size, size, 3)
    assert difference.mean() < 1.0 and difference.max() <= 16


@needs_simplejpeg
def test_simplejpeg_decodes_at_the_scale_pil_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    import simplejpeg

    sizes: list[tuple[int, ...]] = []
    real = simplejpeg.decode_jpeg

    def spy(*args: object, **kwargs: object) -> np.ndarray:
        decoded = real(*args, **kwargs)
        sizes.append(decoded.shape)
        return decoded

    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    _decoded(_photo(560, 560), 160)
    assert sizes == [(280, 280, 3)]  # PIL's draft: 1/2 (560 // 160 = 3 -> 2); not libjpeg-turbo's 3/8 (210)


@pytest.mark.parametrize("payload", [
    _photo(120, 90, mode="CMYK"),  # Adobe inverted CMYK: PIL's rules
    _photo(120, 90, mode="L"),
    _photo(120, 90, fmt="PNG"),
    _photo(240, 180, progressive=True),
], ids=["cmyk", "grey", "png", "progressive"])
def test_every_kind_of_image_decodes_like_pil(payload: bytes) -> None:
    fast = _decoded(payload, 40)
    reference = decode_bytes(payload, 40)
    assert np.abs(fast.astype(np.int16) - reference.astype(np.int16)).mean() < 1.0


def test_without_simplejpeg_pil_does_the_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jpeg, "_SIMPLEJPEG", None)
    payload = _photo(450, 340, seed=3)
    assert not jpeg.fast_decoder_available()
    assert np.array_equal(_decoded(payload, 160), decode_bytes(payload, 160))
    assert np.array_equal(_decoded(payload, 160, use_simplejpeg=True, draft=False), decode_bytes(payload, 160,
                                                                                                    draft=False))


def test_a_broken_jpeg_is_an_oserror() -> None:
    payload = _photo(200, 150)
    with pytest.raises(OSError):
        _decoded(payload[: len(payload) // 3], 64)


@needs_simplejpeg
def test_strict_check_accepts_sound_jpegs_only() -> None:
    payload = _photo(200, 150)
    assert jpeg.decodes_strictly(payload)
    assert not jpeg.decodes_strictly(payload[: len(payload) // 2])  # truncated
    assert not jpeg.decodes_strictly(payload[: len(payload) // 2] + bytes(range(256)) + payload[-2:])  # bad scan
    assert not jpeg.decodes_strictly(_photo(40, 40, fmt="PNG"))


@needs_simplejpeg
def test_encoded_pack_with_the_fast_check_skips_what_pil_skips(tmp_path: Path) -> None:
    """pack's encoded layout proves a stored-as-is JPEG decodes with the strict check instead of a full PIL decode;
    every broken file must still be skipped, with PIL's reason."""
    expected = write_awkward_corpus(tmp_path / "src")
    result = pack(tmp_path / "src", tmp_path / "out", PackOptions(layout="encoded", image_size=16, workers=1,
                                                                  progress=False, shuffle_seed=None))
    assert result.manifest.num_samples == 6 and result.manifest.skipped == 4
    report = json.loads((tmp_path / "out" / "pack-report.json").read_text())["skipped"]
    assert {item["path"]: expected[item["path"]] in item["reason"] for item in report} == dict.fromkeys(expected, True)
