from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from workloads.data.format.jpeg import decode_bytes
from workloads.data.reading.transforms import center_normalize, random_resized_crop_flip_normalize


def _batch(seed: int = 0, size: int = 16) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (4, size, size, 3), dtype=np.uint8))


def test_full_crop_without_flip_is_plain_normalisation() -> None:
    images = _batch()
    out = random_resized_crop_flip_normalize(
        images, 16, generator=torch.Generator().manual_seed(0), scale=(1, 1), ratio=(1, 1), flip_probability=0
    )
    assert out.shape == (4, 3, 16, 16) and out.dtype == torch.float32
    torch.testing.assert_close(out, center_normalize(images), atol=1e-4, rtol=0)


def test_flip_mirrors_the_image() -> None:
    images = _batch(1)
    out = random_resized_crop_flip_normalize(
        images, 16, generator=torch.Generator().manual_seed(0), scale=(1, 1), ratio=(1, 1), flip_probability=1
    )
    torch.testing.assert_close(out, center_normalize(images).flip(-1), atol=1e-4, rtol=0)


def test_crops_are_random_but_reproducible() -> None:
    images = _batch(2, size=32)
    first = random_resized_crop_flip_normalize(images, 24, generator=torch.Generator().manual_seed(7))
    again = random_resized_crop_flip_normalize(images, 24, generator=torch.Generator().manual_seed(7))
    other = random_resized_crop_flip_normalize(images, 24, generator=torch.Generator().manual_seed(8))
    assert first.shape == (4, 3, 24, 24)
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_channels_last_output() -> None:
    out = random_resized_crop_flip_normalize(_batch(), 8, generator=torch.Generator(), channels_last=True)
    assert out.is_contiguous(memory_format=torch.channels_last)


def test_rejects_non_uint8_batches() -> None:
    with pytest.raises(ValueError, match="uint8"):
        random_resized_crop_flip_normalize(torch.zeros(2, 8, 8, 3), 4, generator=torch.Generator())


@pytest.mark.parametrize("draft", [False, True])
def test_decode_makes_a_centre_square_of_the_requested_size(draft: bool) -> None:
    pixels = np.zeros((120, 200, 3), dtype=np.uint8)
    pixels[:, 40:160] = 255  # the centre square (x 40..160) is white, the sides black
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=95)
    out = decode_bytes(buffer.getvalue(), 30, draft=draft)
    assert out.shape == (30, 30, 3) and out.dtype == np.uint8
    assert out[:, 2:-2].min() > 200
