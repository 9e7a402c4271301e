"""Per-batch augmentation (run on the training device).

Workers turn whatever is stored into fixed-size uint8 HWC images (format/jpeg.py decodes them); the
random-resized-crop, flip and normalisation then happen once per batch as a single batched `grid_sample` on the
device, instead of per sample in Python.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _crop_params(
    count: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-sample crop width/height fractions and centres in [-1, 1] coordinates (torchvision's RRC rule).

    Instead of torchvision's rejection loop, the aspect ratio is clamped so the crop always fits.
    """
    area = torch.empty(count).uniform_(scale[0], scale[1], generator=generator)
    log_ratio = torch.empty(count).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    aspect = torch.exp(log_ratio)
    width = torch.sqrt(area * aspect).clamp(max=1.0)
    height = torch.sqrt(area / aspect).clamp(max=1.0)
    centre_x = (torch.rand(count, generator=generator) * 2 - 1) * (1 - width)
    centre_y = (torch.rand(count, generator=generator) * 2 - 1) * (1 - height)
    return width, height, centre_x, centre_y


def random_resized_crop_flip_normalize(
    images: torch.Tensor,
    out_size: int,
    *,
    generator: torch.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip_probability: float = 0.5,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
) -> torch.Tensor:
    """uint8 NHWC batch (on any device) -> normalised NCHW batch of out_size x out_size crops.

    Random parameters are drawn on the CPU from `generator` (so they are reproducible and independent of the
    device), then one affine grid + bilinear sample produces every crop, flip included, in a single kernel.
    """
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[-1] != 3:
        raise ValueError(f"images: expected uint8 (N, H, W, 3), got {images.dtype} {tuple(images.shape)}")
    count = images.shape[0]
    device = images.device
    width, height, centre_x, centre_y = _crop_params(count, scale, ratio, generator)
    flip = torch.rand(count, generator=generator) < flip_probability
    theta = torch.zeros(count, 2, 3)
    theta[:, 0, 0] = torch.where(flip, -width, width)
    theta[:, 0, 2] = centre_x
    theta[:, 1, 1] = height
    theta[:, 1, 2] = centre_y
    # Sampling runs in float32 on every device (bf16 coordinates would misplace pixels on large images);
    # only the normalised output takes `dtype`.
    compute_dtype = torch.float32
    pixels = images.permute(0, 3, 1, 2).to(compute_dtype)
    grid = F.affine_grid(
        theta.to(device=device, dtype=compute_dtype), [count, 3, out_size, out_size], align_corners=False
    )
    crops = F.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)
    return _normalize(crops, dtype=dtype, channels_last=channels_last)


def center_normalize(
    images: torch.Tensor, *, dtype: torch.dtype = torch.float32, channels_last: bool = False
) -> torch.Tensor:
    """uint8 NHWC -> normalised NCHW without augmentation (evaluation, benchmarks)."""
    return _normalize(images.permute(0, 3, 1, 2).to(torch.float32), dtype=dtype, channels_last=channels_last)


def _normalize(pixels: torch.Tensor, *, dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    mean = torch.tensor(IMAGENET_MEAN, device=pixels.device, dtype=pixels.dtype).view(1, 3, 1, 1) * 255
    std = torch.tensor(IMAGENET_STD, device=pixels.device, dtype=pixels.dtype).view(1, 3, 1, 1) * 255
    out = ((pixels - mean) / std).to(dtype)
    if channels_last:
        out = out.contiguous(memory_format=torch.channels_last)
    return out
