"""Your own Hugging Face Accelerate loop on ml-cluster's data path (`pip install accelerate` in your image).

    python examples/train_accelerate.py --data /data/my-set --epochs 2
    python examples/train_accelerate.py --data /tmp/my-set --remote s3://my-bucket/my-set --budget 2GiB
    accelerate launch --num-processes 8 examples/train_accelerate.py ...      # or torchrun: the same environment
    # in a Job: --data defaults to $DATA_DIR, checkpoints to $CHECKPOINT_DIR (see examples/plain-pytorch-job.yaml)

The model and optimizer go through `accelerator.prepare`; the data does not: PackedData already gives each rank
its share of every batch (from RANK/WORLD_SIZE, which `accelerate launch` sets as torchrun does), and preparing its
loader would shard it a second time. The checkpoint (at each epoch's end and every --checkpoint-every steps) holds the
data position: a rerun resumes sample-exact.
SIGTERM (a drain, a Spot reclaim): StopSignal agrees through Accelerate's own trigger (`set_trigger` on the
signalled process, `check_trigger` on all), then the checkpoint, then exit 43, which the Jobs do not count.
One JSON line per epoch on stdout, and the main process's step events (StepReport: each step's time, its wait for
data, each checkpoint's stall, as the bundled trainer reports them; with $METRICS_PORT the same as Prometheus
metrics), which measured goodput reads.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn

from workloads.cli import parse_size
from workloads.data.api import (
    LoaderSettings,
    PackedData,
    StepReport,
    StopSignal,
    random_resized_crop_flip_normalize,
)


def small_cnn(num_classes: int, width: int = 32) -> nn.Module:
    """Stands in for your model."""
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, num_classes))


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

    # mixed precision, gradient accumulation, ...: its options, as usual. cpu: without a GPU, Accelerate treats a
    # torchrun gang as one process per rank (no process group, no gradient all-reduce) unless told to use the CPU.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())

    def agree(signalled: bool) -> bool:  # Accelerate's trigger: any process set it -> True on every process
        if signalled:
            accelerator.set_trigger()
        return accelerator.check_trigger()

    stop = StopSignal(agree=agree)  # SIGTERM: stop after a step every process agrees on, checkpoint, exit 43
    data = PackedData.open(args.data, batch_size=args.batch_size, remote=args.remote, endpoint_url=args.endpoint_url,
                           budget_bytes=args.budget, min_rank_batch=2,  # 2: BatchNorm cannot train on one sample
                           seed=args.seed)
    torch.manual_seed(args.seed)
    model = small_cnn(data.num_classes).to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    checkpoint = Path(args.checkpoint_dir) / "checkpoint.pt" if args.checkpoint_dir else None
    step = 0
    if checkpoint is not None and checkpoint.exists():
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        data.load_state_dict(saved["data"])
        step = saved["step"]
    model, optimizer = accelerator.prepare(model, optimizer)

    def save(step: int) -> None:
        accelerator.wait_for_everyone()
        if checkpoint is not None and accelerator.is_main_process:
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            temp = checkpoint.with_name(f".{checkpoint.name}.tmp")
            accelerator.save({"model": accelerator.unwrap_model(model).state_dict(),
                              "optimizer": optimizer.state_dict(), "data": data.state_dict(), "step": step}, temp)
            os.replace(temp, checkpoint)  # atomically: a pod stopped mid-write leaves the last checkpoint whole

    data.loader(LoaderSettings(workers=args.workers))
    generator = torch.Generator(device=accelerator.device)
    # each step's time, data wait and checkpoint stall: measured goodput (docs/monitoring.md); Accelerate's own rank
    report = StepReport(rank=accelerator.process_index, local_rank=accelerator.local_process_index)
    with stop, data:
        for epoch in range(data.start_epoch, args.epochs):
            started, samples, loss_sum = time.perf_counter(), 0, 0.0
            model.train()
            for images, labels in report.timed(data.batches(epoch, last_epoch=epoch == args.epochs - 1), epoch):
                images, labels = images.to(accelerator.device), labels.to(accelerator.device)
                generator.manual_seed(hash((epoch, step, accelerator.process_index)) & 0xFFFF_FFFF)
                inputs = random_resized_crop_flip_normalize(images, data.image_size, generator=generator,
                                                            channels_last=True)
                loss = nn.functional.cross_entropy(model(inputs), labels)
                optimizer.zero_grad(set_to_none=True)
                accelerator.backward(loss)
                optimizer.step()
                step += 1
                samples += len(labels)
                loss_sum += loss.item() * len(labels)
                report.step(step, samples=len(labels), loss=loss.item())  # the step's figures, for goodput
                if args.checkpoint_every and step % args.checkpoint_every == 0:
                    with report.saving(step):
                        save(step)
                stop.check(partial(save, step))
            if not (args.checkpoint_every and step % args.checkpoint_every == 0):  # else saved at this step already
                with report.saving(step):
                    save(step)
            if accelerator.is_main_process:
                elapsed = time.perf_counter() - started
                print(json.dumps({"epoch": epoch, "samples": samples, "loss": round(loss_sum / max(samples, 1), 4),
                                  "samples_per_s": round(samples / elapsed, 1), "steps": step}), flush=True)
    if accelerator.is_main_process and data.stager_summary:
        print(json.dumps({"stager": data.stager_summary}), flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
