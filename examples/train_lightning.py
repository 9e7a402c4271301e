"""Your own PyTorch Lightning module on ml-cluster's data path (`pip install lightning` in your image).

    python examples/train_lightning.py --data /data/my-set --epochs 2
    python examples/train_lightning.py --data /tmp/my-set --remote s3://my-bucket/my-set --budget 2GiB
    # in a Job: --data defaults to $DATA_DIR, checkpoints to $CHECKPOINT_DIR (see examples/plain-pytorch-job.yaml)

PackedData already gives each rank its share of every batch (from torchrun's RANK/WORLD_SIZE, which Lightning's
DDP strategy also sets), so Lightning must not add a DistributedSampler (`use_distributed_sampler=False`), and the
epoch's batches come from `data.batches(epoch)`, which also tells a staging cache what this node reads next.
Lightning's checkpoint (last.ckpt, at each epoch's end and every --checkpoint-every steps: ModelCheckpoint) carries
the data position, so a rerun resumes where the last checkpoint was written. Under torchrun (a Job runs it under the
launcher), the Trainer's devices and num_nodes come from torchrun's LOCAL_WORLD_SIZE and WORLD_SIZE (Lightning
refuses a product that differs from the world size, which changes when an elastic gang shrinks).
SIGTERM (a drain, a Spot reclaim): the StopOnSignal callback stops every rank after the same batch (Lightning's own
reduce_boolean_decision), saves last.ckpt and exits 43, which the Jobs retry without counting. (Lightning's own
SIGTERM handling ends fit with SystemExit() - exit status 0, a finished pod - or 1.)
One JSON line per epoch on stdout, and rank 0's step events (the ReportSteps callback over StepReport: each step's
time, its wait for data, each save's stall, as the bundled trainer reports them; with $METRICS_PORT the same as
Prometheus metrics), which measured goodput reads.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn

from workloads.cli import parse_size
from workloads.data.api import (
    LoaderSettings,
    PackedData,
    StepReport,
    StopSignal,
    random_resized_crop_flip_normalize,
)


class EpochBatches:
    """The iterable Lightning trains on: each pass is the next epoch of `data.batches`, each batch's wait timed by
    `report` (which also ends a save when Lightning asks for the next batch)."""

    def __init__(self, data: PackedData, module: L.LightningModule, epochs: int, report: StepReport):
        self.data, self.module, self.epochs, self.report = data, module, epochs, report
        # A whole epoch's batches, taken before a checkpoint moves the sampler into an epoch: Lightning reads the
        # length once, and a resumed epoch's pass yields only the batches left (Lightning ends it when they end).
        self.per_epoch = len(data.sampler)

    def __len__(self) -> int:
        return self.per_epoch

    def __iter__(self) -> Iterator[Any]:
        # A checkpoint written at an epoch's end holds Lightning's epoch counter before it moves on: resumed from it,
        # Lightning asks for that finished epoch's batches once more, so the data's resumed epoch decides.
        epoch = max(self.module.current_epoch, self.data.start_epoch)
        return self.report.timed(self.data.batches(epoch, last_epoch=epoch == self.epochs - 1), epoch)


class ReportSteps(L.Callback):
    """Each optimizer step and save as the bundled trainer reports them (StepReport), for measured goodput. A step
    ends in on_train_batch_end (after its optimizer step; global_step counts it). A save begins in
    on_save_checkpoint (ModelCheckpoint runs after every other callback, so after this one's on_train_batch_end) and
    ends when Lightning asks for the next batch (EpochBatches' `timed`) or, for the last, in on_train_end (a stop's
    save in one process: on_exception, which Lightning calls with the SystemExit; a gang's rank leaves at once, so
    its stop's save goes unreported, as in the other examples). Before StopOnSignal: a stop's step is reported."""

    def __init__(self, report: StepReport) -> None:
        self.report = report

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs  # automatic optimization: {"loss": ..}
        self.report.step(trainer.global_step, samples=len(batch[1]), loss=None if loss is None else loss.item())

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self.report.save_started(trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.report.save_done()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.report.save_done()


class StopOnSignal(L.Callback):
    """SIGTERM: every rank stops after the same batch, Lightning writes last.ckpt, the process exits 43."""

    def __init__(self, last: Path | None) -> None:
        self.last = last
        self.stop = StopSignal()  # before training: a signal exits 43 at once (nothing to save)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stop.agree = lambda signalled: trainer.strategy.reduce_boolean_decision(signalled, all=False)
        self.stop.install()  # over the handler Lightning set at fit's start

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.stop.check(lambda: trainer.save_checkpoint(self.last) if self.last is not None else None)


class Classifier(L.LightningModule):
    def __init__(self, data: PackedData, lr: float, crop: int):
        super().__init__()
        self.data, self.lr, self.crop = data, lr, crop
        width = 32
        self.net = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, data.num_classes))
        self.generator: torch.Generator | None = None
        self.epoch_started, self.samples, self.loss_sum = 0.0, 0, 0.0
        self.trained = 0  # batches of this pass trained (Lightning fetches the next one before this one's step)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch  # uint8 NHWC, moved to the device by Lightning: a quarter of float32's bytes
        if self.generator is None:
            self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(hash((self.current_epoch, self.global_step, self.global_rank)) & 0xFFFF_FFFF)
        inputs = random_resized_crop_flip_normalize(images, self.crop, generator=self.generator, channels_last=True)
        loss = nn.functional.cross_entropy(self.net(inputs), labels)
        self.samples += len(labels)
        self.loss_sum += loss.item() * len(labels)
        self.trained += 1
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=1e-4)

    def on_train_epoch_start(self) -> None:
        self.epoch_started, self.samples, self.loss_sum = time.perf_counter(), 0, 0.0
        self.trained = 0

    def on_train_epoch_end(self) -> None:
        if self.global_rank == 0:
            elapsed = time.perf_counter() - self.epoch_started
            print(json.dumps({"epoch": self.current_epoch, "samples": self.samples,
                              "loss": round(self.loss_sum / max(self.samples, 1), 4),
                              "samples_per_s": round(self.samples / elapsed, 1), "steps": self.global_step}),
                  flush=True)

    # The data position travels in Lightning's checkpoint.
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["packed_data"] = self.data.state_dict(batches=self.trained)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.data.load_state_dict(checkpoint["packed_data"])


def checkpoints(directory: str, every: int) -> list[L.Callback]:
    """last.ckpt at each epoch's end and, with `every`, every that many steps: Lightning's ModelCheckpoint, one per
    trigger (a ModelCheckpoint takes one), each keeping one file of that name, so the newest save is last.ckpt."""
    triggers: list[dict[str, int]] = [{"every_n_epochs": 1}] + ([{"every_n_train_steps": every}] if every else [])
    return [L.pytorch.callbacks.ModelCheckpoint(dirpath=directory, filename="last", save_top_k=1,
                                                enable_version_counter=False, **trigger) for trigger in triggers]


def gang_size() -> dict[str, int | str]:
    """The Trainer's devices and num_nodes: torchrun's (a gang, one process per device), else Lightning's choice."""
    if "WORLD_SIZE" not in os.environ:
        return {"devices": "auto", "num_nodes": 1}
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return {"devices": local, "num_nodes": int(os.environ["WORLD_SIZE"]) // local}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=os.environ.get("DATA_DIR"), help="packed dataset (default $DATA_DIR)")
    parser.add_argument("--remote", help="s3://bucket/prefix to stage from while training (default: none)")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (default: AWS)")
    parser.add_argument("--budget", type=lambda text: parse_size(text, 1 << 20, 1 << 50, ""),
                        help="with --remote: staging cache budget, e.g. 2GiB (default: a whole copy)")
    parser.add_argument("--epochs", type=int, default=1, help="(default 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (default 64)")
    parser.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    parser.add_argument("--lr", type=float, default=0.05, help="(default 0.05)")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("CHECKPOINT_DIR"),
                        help="(default $CHECKPOINT_DIR; none: no checkpoints)")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps (default 0: epoch ends only)")
    parser.add_argument("--seed", type=int, default=0, help="weights and sample order (default 0)")
    args = parser.parse_args()
    if not args.data:
        parser.error("--data: required (or set DATA_DIR)")

    data = PackedData.open(args.data, batch_size=args.batch_size, remote=args.remote, endpoint_url=args.endpoint_url,
                           budget_bytes=args.budget, min_rank_batch=2,  # 2: BatchNorm cannot train on one sample
                           seed=args.seed)
    data.loader(LoaderSettings(workers=args.workers))
    torch.manual_seed(args.seed)
    module = Classifier(data, args.lr, data.image_size)
    last = Path(args.checkpoint_dir) / "last.ckpt" if args.checkpoint_dir else None
    stop_on_signal = StopOnSignal(last)
    report = StepReport()  # each step's time, data wait and save stall: measured goodput (docs/monitoring.md)
    callbacks: list[L.Callback] = [ReportSteps(report), stop_on_signal]
    if last is not None:
        callbacks += checkpoints(args.checkpoint_dir, args.checkpoint_every)
    trainer = L.Trainer(max_epochs=args.epochs, use_distributed_sampler=False, callbacks=callbacks,
                        enable_checkpointing=bool(last), enable_progress_bar=False, enable_model_summary=False,
                        logger=False, num_sanity_val_steps=0, **gang_size())
    with stop_on_signal.stop, data:  # a lost peer's error inside fit: exit 43, one line
        trainer.fit(module, train_dataloaders=EpochBatches(data, module, args.epochs, report),
                    ckpt_path=str(last) if last is not None and last.exists() else None)
    if trainer.global_rank == 0 and data.stager_summary:
        print(json.dumps({"stager": data.stager_summary}), flush=True)


if __name__ == "__main__":
    main()
