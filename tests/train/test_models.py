from __future__ import annotations

import torch

from workloads.train.models import resnet18, resnet50


def test_parameter_counts_match_the_reference_architectures() -> None:
    # torchvision's resnet18 / resnet50 with 1000 classes
    assert sum(p.numel() for p in resnet18().parameters()) == 11_689_512
    assert sum(p.numel() for p in resnet50().parameters()) == 25_557_032


def test_forward_shapes_and_channels_last() -> None:
    model = resnet18(num_classes=5).eval().to(memory_format=torch.channels_last)
    inputs = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert model(inputs).shape == (2, 5)
