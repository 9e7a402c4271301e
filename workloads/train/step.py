"""One training step: a batch in, the weights updated, the ranks agreed on "go on" (a finite loss everywhere, no
stop signal anywhere) before any rank steps."""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from workloads.data.reading.dataset import DatasetError, to_tensors
from workloads.data.reading.transforms import random_resized_crop_flip_normalize
from workloads.train.checkpointer import TrainState
from workloads.train.config import TrainConfig
from workloads.train.inputs import MIN_RANK_BATCH
from workloads.train.runtime import Distributed, StopRequest, TrainingDiverged


def step_seed(seed: int, epoch: int, batch: int, rank: int) -> int:
    """Augmentation randomness as a pure function of the position, so resume needs no generator state."""
    return int(np.random.SeedSequence([seed, epoch, batch, rank]).generate_state(1)[0])


def configure_determinism(config: TrainConfig) -> None:
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    if config.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True


def _batchnorm_training(model: nn.Module, training: bool) -> None:
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.train(training)


@dataclass
class StepResult:
    loss: float
    samples: int
    stopping: bool  # the ranks' agreed answer to "did any rank get a stop signal?"


class Stepper:
    """Runs steps of one model: labels checked, augmentation seeded by position, forward (bf16 autocast when
    asked), one all-reduce for "finite everywhere, no stop anywhere", backward and the optimiser's step."""

    def __init__(self, config: TrainConfig, env: Distributed, device: torch.device, num_classes: int) -> None:
        self.config = config
        self.env = env
        self.device = device
        self.num_classes = num_classes
        self.criterion = nn.CrossEntropyLoss()
        self.autocast_dtype = torch.bfloat16 if config.amp == "bf16" else None
        self.input_dtype = self.autocast_dtype if device.type == "cuda" and self.autocast_dtype else torch.float32

    def _inputs(self, batch: Any, epoch: int, batch_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = to_tensors(batch)
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            bad = int(labels.max()) if int(labels.max()) >= self.num_classes else int(labels.min())
            raise DatasetError(
                f"{self.config.data}: label {bad} in epoch {epoch} batch {batch_index}, but the dataset lists "
                f"{self.num_classes} classes"
            )
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        generator = torch.Generator().manual_seed(step_seed(self.config.seed, epoch, batch_index, self.env.rank))
        inputs = random_resized_crop_flip_normalize(
            images,
            self.config.crop_size,
            generator=generator,
            dtype=self.input_dtype,
            channels_last=self.config.channels_last,
        )
        return inputs, labels

    def _agree(self, finite: bool, stopping: bool) -> tuple[bool, bool]:
        """Every rank stops together, before any rank steps (one collective for both questions)."""
        if self.env.world_size == 1:
            return finite, stopping
        flag = torch.tensor([1.0 if finite else 0.0, -1.0 if stopping else 0.0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag[0].item() == 1.0), bool(flag[1].item() < 0)

    def step(self, state: TrainState, batch: Any, epoch: int, batch_index: int, stop: StopRequest) -> StepResult:
        inputs, labels = self._inputs(batch, epoch, batch_index)
        # The sampler never makes a step of one sample per rank unless one sample is all that is left (an elastic
        # resume near an epoch's end): BatchNorm then uses its running statistics for this step instead of failing
        # on a batch it cannot normalise.
        lone = len(labels) < min(MIN_RANK_BATCH, self.config.batch_size)  # --batch-size 1 keeps training BN
        if lone:
            _batchnorm_training(state.core, False)
        try:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.bfloat16,
                                enabled=self.autocast_dtype is not None):
                loss = self.criterion(state.model(inputs), labels)
        finally:
            if lone:
                _batchnorm_training(state.core, True)
        loss_value = float(loss.detach())
        finite, stopping = self._agree(math.isfinite(loss_value), stop.requested)
        if not finite:
            raise TrainingDiverged(
                f"loss: not finite ({loss_value}) at epoch {epoch} batch {batch_index} (step {state.step + 1}); "
                "stopped before updating the weights, the last checkpoint is intact (lower --lr?)"
            )
        state.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        state.optimizer.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return StepResult(loss_value, len(labels), stopping)
